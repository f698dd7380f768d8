"""``/api/engine`` and ``/api/presets``: the engine supervisor, over NATS (behind the API key
like every ``/api`` route).

- ``GET /api/engine`` → ``loki.engine.info``: state (starting/ready/failed/stopped), slots,
  per-slot ``n_ctx``, build, model, SIDE_SLOT verdict, launch notes, masked command line.
  The engine's API key is never included. With several engines (``LOKI_ENGINE_URLS``, issue
  44): ``engines`` (id, group, state, model, slots with the conversation each last ran,
  grants, moves in, restores; each ``base_url`` without user information), ``routing``,
  ``instance`` and ``leader`` (:func:`loki_gateway.engine_watch.engine_body`).
- ``GET /api/engine/events`` (SSE): the same body as ``event: engine`` at once and on each
  change (:mod:`loki_gateway.engine_watch`): what the web UI's engine pill follows.
- ``GET /api/presets`` → ``{"presets": [...], "active": id}`` (external keys never in clear:
  ``api_key`` is null, ``api_key_set`` tells whether one is stored).
- ``POST /api/presets`` (a preset's fields; no ``id`` creates one) → ``{"preset", "active",
  "detail"}``; an empty ``api_key`` keeps the stored key; saving the active preset applies it.
- ``DELETE /api/presets/{id}`` (not the active one).
- ``POST /api/presets/switch`` ``{"id": "..."}`` → switch by id (an external preset stops the
  local engine).
- ``POST /api/presets/test`` (``base_url``, ``api_model``, ``api_key``, or ``id`` of a stored
  preset) → ``{"ok", "status", "message", "models"}``: ``message`` is the API's own error
  message when the connection test fails.
- ``GET /api/preset/cacheram`` (optional query: ``id`` and editor fields ``ctx``, ``ngl``,
  ``parallel``, ``extra_args``, ``model``, ``side_slot``, ``cache_ram``) → the CACHE_RAM
  arithmetic (``cache_ram.value_mib``, ``effective_mib``, ``need_mib``, ``cap_mib``) and the
  SIDE_SLOT verdict (second slot's MiB or the refusal's reason).
- ``GET /api/preset/models`` → the GGUF files a preset may pick (under the supervisor's
  ``LOKI_MODEL_DIRS``, the bundled model apart): ``{"dirs", "bundled", "files",
  "truncated"}``, each file ``{"path", "name", "size_bytes", "architecture"}``.

No supervisor answering is a 503 (OpenAI-shaped error body).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from sse_starlette import EventSourceResponse, ServerSentEvent

from loki_shared import subjects
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    PresetsReply,
    PresetsRequest,
)

from ..bus import Bus
from ..deps import get_bus
from ..engine_watch import engine_body, engine_frames
from ..errors import BadRequest

router = APIRouter()

#: A connection test waits for the remote API (up to 10 s) and a plan reads the GGUF header.
PRESET_TIMEOUT_S = 15.0


async def _presets(bus: Bus, req: PresetsRequest) -> PresetsReply:
    return await bus.request_ok(
        subjects.ENGINE_PRESETS, req, PresetsReply, timeout=PRESET_TIMEOUT_S
    )


@router.get("/api/engine")
async def engine_info(bus: Bus = Depends(get_bus)) -> dict:
    info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
    return engine_body(info)


@router.get(
    "/api/engine/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def engine_events(bus: Bus = Depends(get_bus)) -> EventSourceResponse:
    """SSE: ``event: engine`` with the ``GET /api/engine`` body, at once and on each change."""
    return EventSourceResponse(
        engine_frames(bus),
        ping=15,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="ping", sep="\n"),
        headers={"Cache-Control": "no-cache"},
    )


@router.get("/api/presets")
async def list_presets(bus: Bus = Depends(get_bus)) -> dict:
    reply = await _presets(bus, PresetsRequest(action="list"))
    return {"presets": reply.presets, "active": reply.active}


@router.post("/api/presets")
async def save_preset(body: dict[str, Any] = Body(...), bus: Bus = Depends(get_bus)) -> dict:
    reply = await _presets(bus, PresetsRequest(action="save", preset=body))
    return {"preset": reply.preset, "active": reply.active, "detail": reply.detail}


@router.delete("/api/presets/{preset_id}")
async def delete_preset(preset_id: str, bus: Bus = Depends(get_bus)) -> dict:
    reply = await _presets(bus, PresetsRequest(action="delete", preset_id=preset_id))
    return {"deleted": preset_id, "active": reply.active}


@router.post("/api/presets/switch")
async def switch_preset(body: dict[str, Any] = Body(...), bus: Bus = Depends(get_bus)) -> dict:
    preset_id = body.get("id") or body.get("preset_id")
    if not isinstance(preset_id, str) or not preset_id:
        raise BadRequest("switch needs the preset's id", code="missing_id")
    reply = await _presets(bus, PresetsRequest(action="switch", preset_id=preset_id))
    return {"preset": reply.preset, "active": reply.active, "detail": reply.detail}


@router.post("/api/presets/test")
async def test_preset(body: dict[str, Any] = Body(...), bus: Bus = Depends(get_bus)) -> dict:
    preset_id = body.get("id") or body.get("preset_id") or None
    reply = await _presets(bus, PresetsRequest(action="test", preset_id=preset_id, preset=body))
    return reply.detail or {}


@router.get("/api/preset/cacheram")
async def preset_cacheram(
    id: str | None = None,
    ctx: int | None = None,
    ngl: str | None = None,
    parallel: int | None = None,
    extra_args: str | None = None,
    model: str | None = None,
    side_slot: str | None = None,
    cache_ram: str | None = None,
    bus: Bus = Depends(get_bus),
) -> dict:
    fields = dict(ctx=ctx, ngl=ngl, parallel=parallel, extra_args=extra_args, model=model)
    edited: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    features = {
        k: v for k, v in (("SIDE_SLOT", side_slot), ("CACHE_RAM", cache_ram)) if v is not None
    }
    if features:
        edited["features"] = features
    req = PresetsRequest(action="cacheram", preset_id=id, preset=edited or None)
    reply = await _presets(bus, req)
    return {"preset": reply.preset, "active": reply.active, **(reply.detail or {})}


@router.get("/api/preset/models")
async def preset_models(bus: Bus = Depends(get_bus)) -> dict:
    """The GGUF files under ``LOKI_MODEL_DIRS`` with name, size and architecture (read from
    the header by the supervisor, which sees the model files)."""
    reply = await _presets(bus, PresetsRequest(action="models"))
    return reply.detail or {"dirs": [], "bundled": None, "files": [], "truncated": False}
