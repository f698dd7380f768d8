"""The gateway's errors and their OpenAI-shaped HTTP bodies.

Every error answer has the shape ``{"error": {"message", "type", "code"}}`` (OpenAI's), on
``/api`` as on ``/v1``.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


class GatewayError(Exception):
    """Base of the gateway's errors: ``status`` is the HTTP status, ``type`` and ``code``
    go to the body."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class ServiceUnavailable(GatewayError):
    """A backing service did not answer over NATS."""

    status = 503
    type = "service_unavailable"


class UpstreamError(GatewayError):
    """A backing service answered something the gateway cannot read."""

    status = 502
    type = "upstream_error"


_SERVICE_STATUS = {
    "not_found": 404,
    "invalid_request": 400,
    "forbidden": 403,
    "conflict": 409,
    "busy": 409,
    "unavailable": 503,
}


class ServiceError(GatewayError):
    """A service's reply carried ``error``; its ``type`` picks the HTTP status."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message, code=type_)
        self.status = _SERVICE_STATUS.get(type_, 500)
        self.type = "invalid_request_error" if self.status < 500 else "server_error"


def error_body(message: str, type_: str, code: str | None = None) -> dict:
    """OpenAI error body."""
    return {"error": {"message": message, "type": type_, "code": code}}


async def gateway_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return JSONResponse(error_body(exc.message, exc.type, exc.code), status_code=exc.status)
