"""FastAPI dependencies shared by the gateway's routers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from loki_shared.errors import Unavailable
from loki_shared.projects_client import ProjectsClient, R
from loki_shared.sealing import Sealer, service_sealer

from .bus import Bus
from .errors import ServiceUnavailable


def get_bus(request: Request) -> Bus:
    """The gateway's NATS connection (set on ``app.state.bus`` at start-up)."""
    return request.app.state.bus


S = TypeVar("S")


def sealed_store(request: Request, name: str, build: Callable[[Any, Sealer, Any], S]) -> S:
    """The app's store ``name`` on ``app.state``, built on first use by
    ``build(redis, sealer, memory_state)``: the memory state's Redis connection, the
    service key's sealer (``LOKI_SECRET_KEY``, else the key file in ``LOKI_HOME``) and the
    :class:`~loki_gateway.memory_state.MemoryState` itself.

    Raises:
        ServiceUnavailable: Redis is not reached yet (the memory state is not started).
    """
    state = request.app.state
    existing = getattr(state, name, None)
    if existing is not None:
        return existing
    memory = getattr(state, "memory", None)
    if memory is None:
        raise ServiceUnavailable("the store (Redis) is not reached yet: try again shortly")
    settings = state.settings
    secret = settings.secret_key.get_secret_value() if settings.secret_key else None
    made = build(memory.redis, service_sealer(settings.home, secret), memory)
    setattr(state, name, made)
    return made


def get_projects(request: Request) -> ProjectsClient:
    """A typed client of the memory service (``loki.projects.*``) over the gateway's NATS
    connection; raises the :mod:`loki_shared.errors` class of a refusal (the error handlers
    give its status) and ``Unavailable`` (503) when no memory service answers."""
    client = request.app.state.bus.client

    async def send(subject: str, data: bytes, wait: float) -> bytes:
        msg = await client.request(subject, data, timeout=wait)
        return bytes(msg.data)

    return _GatewayProjects(send)


class _GatewayProjects(ProjectsClient):
    """No answer (or the service's own ``unavailable``) is the gateway's 503
    ``service_unavailable``, as for every other backing service."""

    async def _call(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float | None = None
    ) -> R:
        try:
            return await super()._call(subject, message, reply_type, timeout)
        except Unavailable as exc:
            if isinstance(exc, ServiceUnavailable):
                raise
            raise ServiceUnavailable(exc.message) from exc
