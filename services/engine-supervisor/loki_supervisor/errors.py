"""The supervisor's errors, in :mod:`loki_shared.errors`' tree: each class says the reply's
``error.type``; a handler raises them and the broker's exception middleware answers
(:func:`loki_shared.errors.exception_middleware`)."""

from __future__ import annotations

from loki_shared import errors


class SupervisorError(errors.LokiError):
    """Base of the supervisor's errors (``internal`` unless the class says otherwise)."""


class InvalidRequest(errors.InvalidRequest, SupervisorError):
    """A request or a preset is malformed (bad field value, unknown action)."""


class NotFound(errors.NotFound, SupervisorError):
    """A preset or a lease does not exist (a lease that expired is not found)."""


class Unavailable(errors.Unavailable, SupervisorError):
    """The engine is not ready within the time asked (starting, failed, stopped)."""


class Busy(errors.Busy, SupervisorError):
    """No slot freed within the lease request's ``wait_s``."""


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
