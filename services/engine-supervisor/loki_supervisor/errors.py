"""The supervisor's errors: the classes of :mod:`loki_shared.errors`' tree it raises (each says
the reply's ``error.type``; the broker's exception middleware answers), and the one it adds.

``InvalidRequest``: a malformed request or preset; ``NotFound``: no such preset or lease (an
expired lease is not found); ``Unavailable``: the engine is not ready within the time asked;
``Busy``: no slot freed within the lease request's ``wait_s``.
"""

from __future__ import annotations

from loki_shared.errors import Busy, InvalidRequest, NotFound, Unavailable
from loki_shared.errors import LokiError as SupervisorError

__all__ = [
    "Busy",
    "EngineStartError",
    "InvalidRequest",
    "NotFound",
    "SupervisorError",
    "Unavailable",
]


class EngineStartError(Unavailable):
    """llama-server could not be launched, exited, or did not answer ``/health`` in time;
    ``tail`` holds its last output lines. ``permanent``: launching again the same way would
    fail the same way (a missing model file, an option the engine refuses), so it is not
    retried until the preset is applied again."""

    def __init__(
        self, message: str, tail: list[str] | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.tail = list(tail or [])
        self.permanent = permanent
