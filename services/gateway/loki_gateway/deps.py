"""FastAPI dependencies shared by the gateway's routers."""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel

from loki_shared.errors import Unavailable
from loki_shared.projects_client import ProjectsClient, R

from .bus import Bus
from .errors import ServiceUnavailable


def get_bus(request: Request) -> Bus:
    """The gateway's NATS connection (set on ``app.state.bus`` at start-up)."""
    return request.app.state.bus


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
