"""``/api/engine/bench`` and ``/api/engine/optimise``: measuring and tuning the engine of the
preset in service, over NATS (``loki.engine.bench``, ``loki.engine.optimise``; behind the
API key like every ``/api`` route).

- ``POST /api/engine/bench`` (optional ``depths`` (tokens), ``n_pp``, ``n_tg``, ``reps``) →
  ``{"job", "runs"}``: starts a benchmark; 409 ``conflict`` on an external preset (the
  message says why) or while a benchmark or a search runs.
- ``GET /api/engine/bench`` → ``{"job", "runs"}``: the job's progress (``done``/``total``,
  ``step``) and the stored runs of the preset in service (newest last).
- ``DELETE /api/engine/bench`` → cancels the running benchmark.
- ``POST /api/engine/optimise`` (optional ``candidates``: a list of preset-field dicts;
  benchmark fields as above) → ``{"job", "result"}``: starts a search (opt-in); 409 while a
  turn runs or waits, on an external preset, or while a job runs.
- ``GET /api/engine/optimise`` → ``{"job", "result"}``: progress and the last search's table,
  best row and ``diff`` (preset fields to apply: never applied by Loki).
- ``DELETE /api/engine/optimise`` → cancels the search (the preset is launched again).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from pydantic import ValidationError

from loki_shared import subjects
from loki_shared.messages.engine import (
    BenchReply,
    BenchRequest,
    OptimiseReply,
    OptimiseRequest,
)

from ..bus import Bus
from ..deps import get_bus
from ..errors import BadRequest

router = APIRouter()

#: Starting a search plans it (reads GGUF headers and the engine's ``--help``).
MEASURE_TIMEOUT_S = 30.0
_BENCH_FIELDS = ("depths", "n_pp", "n_tg", "reps")


def _bench_out(reply: BenchReply) -> dict:
    return {
        "job": reply.job.model_dump(mode="json") if reply.job else None,
        "runs": [r.model_dump(mode="json") for r in reply.runs],
    }


def _optimise_out(reply: OptimiseReply) -> dict:
    return {
        "job": reply.job.model_dump(mode="json") if reply.job else None,
        "result": reply.result.model_dump(mode="json") if reply.result else None,
    }


def _fields(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}", code="unknown_field")
    return {k: body[k] for k in names if body.get(k) is not None}


async def _bench(bus: Bus, req: BenchRequest) -> dict:
    reply = await bus.request_ok(subjects.ENGINE_BENCH, req, BenchReply, timeout=MEASURE_TIMEOUT_S)
    return _bench_out(reply)


async def _optimise(bus: Bus, req: OptimiseRequest) -> dict:
    reply = await bus.request_ok(
        subjects.ENGINE_OPTIMISE, req, OptimiseReply, timeout=MEASURE_TIMEOUT_S
    )
    return _optimise_out(reply)


@router.post("/api/engine/bench")
async def bench_start(
    body: dict[str, Any] | None = Body(None), bus: Bus = Depends(get_bus)
) -> dict:
    try:
        req = BenchRequest(action="start", **_fields(body or {}, _BENCH_FIELDS))
    except ValidationError as exc:
        raise BadRequest(f"bad benchmark request: {exc.errors()[0]['msg']}") from exc
    return await _bench(bus, req)


@router.get("/api/engine/bench")
async def bench_status(bus: Bus = Depends(get_bus)) -> dict:
    return await _bench(bus, BenchRequest(action="status"))


@router.delete("/api/engine/bench")
async def bench_cancel(bus: Bus = Depends(get_bus)) -> dict:
    return await _bench(bus, BenchRequest(action="cancel"))


@router.post("/api/engine/optimise")
async def optimise_start(
    body: dict[str, Any] | None = Body(None), bus: Bus = Depends(get_bus)
) -> dict:
    try:
        fields = _fields(body or {}, (*_BENCH_FIELDS, "candidates"))
        req = OptimiseRequest(action="start", **fields)
    except ValidationError as exc:
        raise BadRequest(f"bad optimiser request: {exc.errors()[0]['msg']}") from exc
    return await _optimise(bus, req)


@router.get("/api/engine/optimise")
async def optimise_status(bus: Bus = Depends(get_bus)) -> dict:
    return await _optimise(bus, OptimiseRequest(action="status"))


@router.delete("/api/engine/optimise")
async def optimise_cancel(bus: Bus = Depends(get_bus)) -> dict:
    return await _optimise(bus, OptimiseRequest(action="cancel"))
