"""Health check messages (``loki.health.*``), answered by every service instance."""

from __future__ import annotations

from .base import Msg, Reply


class HealthRequest(Msg):
    """Ask one instance (or any instance) of a service whether it is healthy. No fields."""


class HealthReply(Reply):
    """A service instance's answer.

    ``ok`` false means the process runs but cannot serve (``detail`` says why, e.g.
    ``{"redis": "connection refused"}``); a service that cannot answer at all is unhealthy
    by silence (the caller's timeout).
    """

    service: str
    instance: str
    ok: bool = True
    detail: dict[str, str] = {}
