"""The chat service's errors, in :mod:`loki_shared.errors`' tree.

Everything the turn loop can meet is a :class:`ChatError` (reply ``error.type``
``unavailable`` unless the class says otherwise); a step's failure carries what the loop needs
to decide (retry, replay, compact, or give up). A handler raises them; the broker's exception
middleware answers (:func:`loki_shared.errors.exception_middleware`).
"""

from __future__ import annotations

from loki_shared.errors import Busy, NotFound, Unavailable


class ChatError(Unavailable):
    """Base of every chat service error (``unavailable``)."""


class ConversationNotFound(NotFound, ChatError):
    """No stored conversation has this id (``not_found``)."""


class NotOwner(Busy, ChatError):
    """Another chat instance owns the conversation (Redis lock held) or this one lost it
    (``busy``)."""

    def __init__(self, message: str, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class FencedWrite(NotOwner):
    """A write was refused because the lock's fencing token is no longer this instance's."""


class StepError(ChatError):
    """A completion step failed.

    Attributes:
        status: the HTTP status when the engine answered with one, else None.
        body: the error text or JSON text the engine sent (may be empty).
        before_first_byte: no byte of a 200 response had been streamed.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        before_first_byte: bool = True,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.before_first_byte = before_first_byte


class EngineHTTPError(StepError):
    """The engine answered with a non-200 status (before any byte of a stream)."""


class EngineUnreachable(StepError):
    """The connection failed or dropped before any byte of a response (after retries)."""


class StreamError(StepError):
    """The stream broke after it had started: ``data: {"error": ...}`` mid-stream, or an end
    without ``data: [DONE]``. The partial reply is kept and marked."""

    def __init__(self, message: str, body: str = "") -> None:
        super().__init__(message, body=body, before_first_byte=False)


class Stopped(ChatError):
    """The turn was stopped (control ``stop``, reset, or shutdown)."""
