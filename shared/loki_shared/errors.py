"""Loki's one error tree: every failure a service answers with, and how it crosses the bus.

A service raises a :class:`LokiError` subclass; its class says the reply's ``error.type``
(:data:`ErrorType`, the documented values) and the HTTP status the gateway answers with.
Nothing else maps an error:

- services: :func:`exception_middleware` (a FastStream ``ExceptionMiddleware`` every broker
  from :func:`loki_shared.nats.make_broker` carries) turns what a handler raises into the
  reply ``{"error": {"type", "message"}}`` — a :class:`LokiError` as itself, a request that is
  not valid for its message model as ``invalid_request``, anything else as ``internal``
  (logged with its traceback);
- gateway: a reply's ``error`` becomes the same class again (:func:`from_info`), and the
  gateway's exception handlers turn a :class:`LokiError` into OpenAI's error body
  ``{"error": {"message", "type", "code"}}`` with :attr:`LokiError.http_status`.

=================== ====== ===========================================================
``type``            HTTP   meaning
=================== ====== ===========================================================
``invalid_request`` 400    the request is malformed (bad value, unknown action or tool)
``forbidden``       403    the request is refused for who sends it
``not_found``       404    no such conversation, preset, lease or block
``conflict``        409    the request contradicts the current state
``busy``            409    no slot within the wait asked; another instance owns it
``locked``          423    the memory is encrypted and locked
``unavailable``     503    a dependency (engine, Redis, a peer) is not ready or not there
``internal``        500    a bug: anything that is not a :class:`LokiError`
=================== ====== ===========================================================
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, get_args

from faststream import ExceptionMiddleware
from pydantic import ValidationError

from .messages.base import ErrorInfo, ErrorType

ERROR_TYPES: tuple[ErrorType, ...] = get_args(ErrorType)


class LokiError(Exception):
    """Base of every error a Loki service answers with.

    Class attributes: ``type`` (the reply's ``error.type``), ``http_status`` (the gateway's
    HTTP status for it), ``openai_type`` (the ``type`` of the gateway's OpenAI-shaped body;
    None: ``invalid_request_error`` below 500, ``server_error`` from 500) and ``code`` (its
    ``code``; the instance's ``code`` argument wins).

    Args:
        message: for a person; becomes ``error.message``.
        code: a machine-readable detail for the HTTP body (OpenAI's ``error.code``).
    """

    type: ClassVar[ErrorType] = "internal"
    http_status: ClassVar[int] = 500
    openai_type: ClassVar[str | None] = None
    code: str | None = None

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def info(self) -> ErrorInfo:
        """This error as a reply's ``error``."""
        return ErrorInfo(type=self.type, message=self.message)


class InvalidRequest(LokiError):
    """A request is malformed: a bad field value, an unknown action or tool."""

    type: ClassVar[ErrorType] = "invalid_request"
    http_status: ClassVar[int] = 400


class Forbidden(LokiError):
    """A request refused for who sends it (a wrong passphrase...)."""

    type: ClassVar[ErrorType] = "forbidden"
    http_status: ClassVar[int] = 403


class NotFound(LokiError):
    """No such conversation, preset, lease (an expired lease is not found) or block."""

    type: ClassVar[ErrorType] = "not_found"
    http_status: ClassVar[int] = 404


class Conflict(LokiError):
    """The request contradicts the current state."""

    type: ClassVar[ErrorType] = "conflict"
    http_status: ClassVar[int] = 409


class Busy(LokiError):
    """No slot freed within the wait asked, or another instance owns the conversation."""

    type: ClassVar[ErrorType] = "busy"
    http_status: ClassVar[int] = 409


class Locked(LokiError):
    """The memory is encrypted and locked (a block cannot be sealed or opened)."""

    type: ClassVar[ErrorType] = "locked"
    http_status: ClassVar[int] = 423


class Unavailable(LokiError):
    """A dependency (the engine, Redis, a peer service) is not ready or not there."""

    type: ClassVar[ErrorType] = "unavailable"
    http_status: ClassVar[int] = 503


_BY_TYPE: dict[str, type[LokiError]] = {
    cls.type: cls
    for cls in (LokiError, InvalidRequest, Forbidden, NotFound, Conflict, Busy, Locked, Unavailable)
}


def from_info(info: ErrorInfo) -> LokiError:
    """The :class:`LokiError` a reply's ``error`` stands for (``code`` = its ``type``)."""
    return _BY_TYPE[info.type](info.message, code=info.type)


def error_info(exc: BaseException) -> ErrorInfo:
    """``exc`` as a reply's ``error``: a :class:`LokiError` as itself, a request that is not
    valid for its message model (:func:`is_request_decoding`) as ``invalid_request``, anything
    else — a peer's malformed reply met inside a handler included — as ``internal``
    (``"<class>: <text>"``)."""
    if isinstance(exc, LokiError):
        return exc.info()
    if is_request_decoding(exc):
        assert isinstance(exc, ValidationError)
        return ErrorInfo(type="invalid_request", message=f"invalid request: {exc.errors()[:1]}")
    return ErrorInfo(type="internal", message=f"{type(exc).__name__}: {exc}")


def is_request_decoding(exc: BaseException) -> bool:
    """Whether ``exc`` is FastStream refusing the request itself: a pydantic
    ``ValidationError`` raised while FastStream (its ``fast_depends`` layer) decoded the
    message into the handler's parameter, before the handler ran — not one the handler's own
    code raised."""
    if not isinstance(exc, ValidationError):
        return False
    innermost = ""
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if not module.startswith("pydantic"):
            innermost = module
        tb = tb.tb_next
    return innermost.startswith("fast_depends")


def exception_middleware(log: logging.Logger) -> ExceptionMiddleware:
    """The services' one translation boundary: a FastStream ``ExceptionMiddleware`` that
    answers a request whose handler raised with ``{"error": {"type", "message"}}`` (see
    :func:`error_info`; the reply models all read it, every other field has a default). An
    ``internal`` error is logged on ``log`` with its traceback; the others are answers, not
    faults, and are not logged."""
    middleware = ExceptionMiddleware()

    @middleware.add_handler(Exception, publish=True)
    async def answer(exc: Exception) -> dict[str, Any]:
        info = error_info(exc)
        if info.type == "internal":
            log.error("handler failed: %s", info.message, exc_info=exc)
        return {"error": info.model_dump()}

    return middleware
