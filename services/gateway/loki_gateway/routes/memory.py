"""``/api/memory``: the state of the user's memory, unlock and lock.

- ``GET /api/memory`` → ``{"state": "off" | "locked" | "unlocked"}``;
- ``POST /api/memory/unlock`` ``{"passphrase": "..."}`` → ``{"state": "unlocked"}``; the first
  unlock sets the passphrase (state was ``off``); a wrong passphrase is a 403 and changes
  nothing; an empty one a 400;
- ``POST /api/memory/lock`` → the new state (``locked``, or ``off`` when no passphrase is set).

The state lives in ``app.state.memory`` (:class:`loki_gateway.memory_state.MemoryState`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from ..errors import ServiceUnavailable
from ..memory_state import MemoryState

router = APIRouter()


class UnlockBody(BaseModel):
    passphrase: str


def _memory(request: Request) -> MemoryState:
    """The app's memory state; 503 while it is not started yet (e.g. Redis away)."""
    memory = getattr(request.app.state, "memory", None)
    if memory is None:
        raise ServiceUnavailable("the memory state is not available yet", code="memory_unavailable")
    return memory


@router.get("/api/memory")
async def memory_state(request: Request) -> dict:
    return {"state": await _memory(request).state()}


@router.post("/api/memory/unlock")
async def memory_unlock(body: UnlockBody, request: Request) -> dict:
    return {"state": await _memory(request).unlock(body.passphrase)}


@router.post("/api/memory/lock")
async def memory_lock(request: Request) -> dict:
    return {"state": await _memory(request).lock()}
