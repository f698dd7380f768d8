"""``/api/perf``: the perf service's ring, read over NATS (behind the API key like all ``/api``).

- ``GET /api/perf/summary`` → ``loki.perf.summary``: ``{"completions", "prompt_n", "cache_n",
  "detail": {...}}`` (hit rate, tokens recomputed per turn and per kind, median speeds by
  context depth, draft acceptance, losses by cause, CACHE_RAM advice; keys in
  docs/behaviour.md (perf)).
- ``GET /api/perf/losses?limit=N`` → ``loki.perf.losses``: ``{"losses": [...]}``, the N
  (1..5000, default 100) most recent prompt-cache losses and divergences, newest first, each
  naming what ran on the engine in between and, for a divergence, the index and role of the
  first message that differed.

No perf service answering is a 503 (OpenAI-shaped error body).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from loki_shared import subjects
from loki_shared.messages.perf import LossesReply, LossesRequest, PerfSummary, SummaryRequest

from ..bus import Bus
from ..deps import get_bus
from ..errors import BadRequest

router = APIRouter()


@router.get("/api/perf/summary")
async def perf_summary(bus: Bus = Depends(get_bus)) -> dict:
    reply = await bus.request_ok(subjects.PERF_SUMMARY, SummaryRequest(), PerfSummary)
    return reply.model_dump(mode="json", exclude={"error"})


@router.get("/api/perf/losses")
async def perf_losses(limit: str = "100", bus: Bus = Depends(get_bus)) -> dict:
    top = subjects.STREAM_PERF_MAX_MSGS
    if not limit.isascii() or not limit.isdigit() or not 1 <= int(limit) <= top:
        raise BadRequest(f"limit must be an integer in 1..{top}", code="invalid_limit")
    reply = await bus.request_ok(subjects.PERF_LOSSES, LossesRequest(limit=int(limit)), LossesReply)
    return {"losses": reply.losses}
