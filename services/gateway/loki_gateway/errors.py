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


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


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
    from starlette.exceptions import HTTPException

    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return JSONResponse(
        error_body(detail, _http_type(exc.status_code), codes.get(exc.status_code)),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


def describe_validation(errors: list[dict]) -> str:
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
    from fastapi.exceptions import RequestValidationError

    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    param = None
    if errors:
        loc = [str(x) for x in errors[0].get("loc", ()) if x not in ("body", "query", "path")]
        param = ".".join(loc) or None
    body = error_body(describe_validation(errors), "invalid_request_error", "invalid_value")
    body["error"]["param"] = param
    return JSONResponse(body, status_code=400)


async def unhandled_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: a 500 in OpenAI's shape, logged with its traceback."""
    import logging

    logging.getLogger("loki.gateway").exception("unhandled error: %s", exc)
    return JSONResponse(error_body("internal error", "server_error", "internal"), status_code=500)
