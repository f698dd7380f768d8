"""FastAPI dependencies shared by the gateway's routers."""

from __future__ import annotations

from fastapi import Request

from .bus import Bus


def get_bus(request: Request) -> Bus:
    """The gateway's NATS connection (set on ``app.state.bus`` at start-up)."""
    return request.app.state.bus
