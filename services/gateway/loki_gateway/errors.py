"""The gateway's errors and its one translation boundary: the exception handlers.

Every error answer has the shape ``{"error": {"message", "type", "param", "code"}}``
(OpenAI's; ``param`` names the request field at fault, null when none), on ``/api`` as on
``/v1``. The gateway's own errors are classes of :mod:`loki_shared.errors`'
tree, and a service's reply ``error`` is raised as the class of its ``type``
(:func:`loki_shared.errors.from_info`, ``code`` = that type): :func:`loki_error_handler`
answers both with the class's ``http_status``, ``openai_type`` and ``code``. FastAPI's own
refusals (unknown route, wrong method, validation) and anything unexpected have their handler
here too; :func:`install` registers them all.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from loki_shared.errors import InvalidRequest, LokiError, Unavailable
from loki_shared.errors import NotFound as _NotFound

log = logging.getLogger("loki.gateway")


class BadRequest(InvalidRequest):
    """400 ``invalid_request_error``: the request is malformed.

    Args:
        message: for a person.
        code: OpenAI's ``error.code``.
        param: the request field at fault (OpenAI's ``error.param``, e.g.
            ``messages[0].content``), None when no one field is.
    """

    def __init__(self, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, code)
        self.param = param


class NotFound(_NotFound):
    """404 ``not_found_error``: no such route resource (block, conversation, model...);
    ``param`` as for :class:`BadRequest`."""

    openai_type = "not_found_error"

    def __init__(self, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, code)
        self.param = param


class ServiceUnavailable(Unavailable):
    """503 ``service_unavailable``: a backing service did not answer over NATS, or the engine
    was not to be had (lease refused, connection failed)."""

    openai_type = "service_unavailable"


class UpstreamError(LokiError):
    """502 ``upstream_error``: a backing service answered something the gateway cannot read,
    or the engine's answer ended before its end."""

    http_status = 502
    openai_type = "upstream_error"


class MethodNotAllowed(InvalidRequest):
    """405 ``method_not_allowed``."""

    http_status = 405
    code = "method_not_allowed"


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI error body: ``{"error": {"message", "type", "param", "code"}}`` (``param``
    always present, null when no one field is at fault, as OpenAI sends it)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


async def loki_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """A :class:`~loki_shared.errors.LokiError` (the gateway's or a service's) as its HTTP
    status and OpenAI body."""
    assert isinstance(exc, LokiError)
    kind = exc.openai_type or ("invalid_request_error" if exc.http_status < 500 else "server_error")
    param = getattr(exc, "param", None)
    return JSONResponse(
        error_body(exc.message, kind, exc.code, param if isinstance(param, str) else None),
        status_code=exc.http_status,
    )


def _http_type(status: int) -> str:
    if status == 401:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    if status < 500:
        return "invalid_request_error"
    return "server_error"


async def http_exception_handler(_: Request, exc: Exception) -> JSONResponse:
    """Starlette/FastAPI ``HTTPException`` (unknown route 404, wrong method 405, body limit
    413...) in OpenAI's error shape."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return JSONResponse(
        error_body(detail, _http_type(exc.status_code), codes.get(exc.status_code)),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


def describe_validation(errors: list[dict[str, Any]]) -> str:
    """One sentence per pydantic error: ``body.content: Field required; query.conversation:
    String should match pattern ...``."""
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        kind = err.get("type", "")
        if kind == "json_invalid":
            parts.append(
                f"body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})"
            )
        elif loc == "body" and kind in ("model_attributes_type", "dict_type"):
            parts.append("body must be a JSON object sent with Content-Type: application/json")
        else:
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's ``RequestValidationError`` as a 400 in OpenAI's shape (OpenAI answers
    malformed requests with 400 ``invalid_request_error``, not 422)."""
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    param = None
    if errors:
        loc = [str(x) for x in errors[0].get("loc", ()) if x not in ("body", "query", "path")]
        param = ".".join(loc) or None
    body = error_body(describe_validation(errors), "invalid_request_error", "invalid_value", param)
    return JSONResponse(body, status_code=400)


async def unhandled_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: a 500 in OpenAI's shape, logged with its traceback."""
    log.error("unhandled error: %s", exc, exc_info=exc)
    return JSONResponse(error_body("internal error", "server_error", "internal"), status_code=500)


def install(app: FastAPI) -> None:
    """Register the gateway's exception handlers on ``app``: the one place an exception
    becomes an HTTP answer."""
    app.add_exception_handler(LokiError, loki_error_handler)
    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(Exception, unhandled_error_handler)
