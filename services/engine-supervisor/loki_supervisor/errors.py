"""The supervisor's errors. Each carries the ``ErrorInfo.type`` it maps to on NATS."""

from __future__ import annotations


class SupervisorError(Exception):
    """Base of the supervisor's errors; ``type`` is the reply's ``error.type``."""

    type = "internal"


class InvalidRequest(SupervisorError):
    """A request or a preset is malformed (bad field value, unknown action)."""

    type = "invalid_request"


class NotFound(SupervisorError):
    """A preset or a lease does not exist (a lease that expired is not found)."""

    type = "not_found"


class Unavailable(SupervisorError):
    """The engine is not ready within the time asked (starting, failed, stopped)."""

    type = "unavailable"


class Busy(SupervisorError):
    """No slot freed within the lease request's ``wait_s``."""

    type = "busy"


class EngineStartError(SupervisorError):
    """llama-server could not be launched, exited, or did not answer ``/health`` in time;
    ``tail`` holds its last output lines. ``permanent``: launching again the same way would
    fail the same way (a missing model file, an option the engine refuses), so it is not
    retried until the preset is applied again."""

    type = "unavailable"

    def __init__(
        self, message: str, tail: list[str] | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.tail = list(tail or [])
        self.permanent = permanent
