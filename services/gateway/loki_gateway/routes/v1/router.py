"""The ``/v1`` routes: models, chat completions, completions, embeddings, and ``/slots``
refused.

Each completion or embeddings route reads and checks the body (:mod:`.protocol`) and returns
an :class:`.exchange.Exchange`, which holds the engine lease for the whole answer.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from loki_shared import subjects
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest
from loki_shared.sse import json_object

from ...bus import Bus
from ...deps import get_bus
from ...errors import MethodNotAllowed, ServiceUnavailable
from .exchange import Exchange, Mode, join_url
from .protocol import (
    CHAT_SCHEMA,
    COMPLETION_SCHEMA,
    EMBED_SCHEMA,
    engine_error,
    models_reply,
    normalise_chat,
    normalise_completion,
    normalise_embeddings,
    parse_object,
)

router = APIRouter(tags=["openai"])
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _body_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _read_body(request: Request) -> dict[str, Any]:
    return parse_object(await request.body())


@router.get("/v1/models")
async def models(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """The engine's ``/v1/models`` (no lease needed: it does not use a slot), each local
    model id made its file name (:func:`.protocol.models_reply`); an external API's list is
    passed as it is."""
    info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
    if info.state != "ready" or not info.base_url:
        raise ServiceUnavailable(f"engine is {info.state}", code="engine_not_ready")
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    try:
        resp = await request.app.state.http.get(
            join_url(info.base_url, "/v1/models"), headers=headers, timeout=10
        )
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        status, err = engine_error(resp.status_code, resp.content)
        return JSONResponse(err, status_code=status)
    payload = None if info.external else json_object(resp.content)
    if payload is None:  # an external API's list, or not an object: as it is
        return Response(content=resp.content, media_type="application/json")
    return JSONResponse(models_reply(payload))


@router.post("/v1/chat/completions", openapi_extra=_body_schema(CHAT_SCHEMA))
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, streamed or not (a non-streamed one is asked streamed
    upstream and assembled)."""
    body = normalise_chat(await _read_body(request))
    mode: Mode = "stream" if body.get("stream") else "assemble"
    return Exchange(request, "/v1/chat/completions", body, mode, perf=True)


@router.post("/v1/completions", openapi_extra=_body_schema(COMPLETION_SCHEMA))
async def completions(request: Request) -> Response:
    """OpenAI (legacy) completions, streamed or not (as for chat completions)."""
    body = normalise_completion(await _read_body(request))
    mode: Mode = "stream" if body.get("stream") else "assemble"
    return Exchange(request, "/v1/completions", body, mode, perf=True)


@router.post("/v1/embeddings", openapi_extra=_body_schema(EMBED_SCHEMA))
async def embeddings(request: Request) -> Response:
    """OpenAI embeddings, passed through when the engine serves them (llama-server started
    with ``--embeddings``; otherwise its 501 is relayed in OpenAI's shape)."""
    body = normalise_embeddings(await _read_body(request))
    body.pop("stream", None)
    return Exchange(request, "/v1/embeddings", body, "json", perf=False)


@router.api_route("/v1/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/v1/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
async def slots_refused(request: Request) -> Response:
    """Slot save/restore/erase is the supervisor's alone: any ``/slots`` path is 405."""
    raise MethodNotAllowed(f"{request.url.path} is not available through the gateway")
