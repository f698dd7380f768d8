"""Authentication and request-size limits, as plain ASGI middleware (no buffering, so SSE and
streamed ``/v1`` answers pass through untouched and client disconnects still reach the
routes).

- :class:`ApiKeyMiddleware`: with ``LOKI_API_KEY`` set, every path under ``/api`` or ``/v1``,
  and the API's schema ``/openapi.json``, needs ``Authorization: Bearer <key>``; no other
  header stands for it (``x-api-key``, ``api-key``, a cookie, a query parameter are ignored);
  the comparison is constant-time
  (:func:`hmac.compare_digest` on bytes); a refusal is a 401 in OpenAI's shape and is logged
  with the method, path and client address, never with the key sent.
- :class:`BodyLimitMiddleware`: a request whose ``Content-Length`` exceeds the limit gets 413
  at once; a chunked body is counted as it is read and raises a 413 ``HTTPException`` when it
  goes past the limit.
"""

from __future__ import annotations

import hmac
import json
import logging

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

log = logging.getLogger("loki.gateway.auth")

PROTECTED_PREFIXES = ("/api", "/v1")
#: Single paths behind the key too: the API's schema (the docs pages are off, app.py).
PROTECTED_PATHS = frozenset({"/openapi.json"})
#: Paths under /api NOT behind the key: the e2e routes, whose credential is the paired
#: device's sealed envelope (loki_gateway.e2e.sealed; docs/security.md).
DEVICE_PATHS = frozenset({"/api/e2e/chat", "/api/e2e/send", "/api/e2e/control", "/api/e2e/state"})


def is_protected(path: str) -> bool:
    """Whether ``path`` is under ``/api`` or ``/v1`` (``/api``, ``/api/...``; not ``/apix``)
    or is one of :data:`PROTECTED_PATHS`, and is not one of :data:`DEVICE_PATHS`."""
    if path in DEVICE_PATHS:
        return False
    return path in PROTECTED_PATHS or any(
        path == p or path.startswith(p + "/") for p in PROTECTED_PREFIXES
    )


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the first ``Authorization: Bearer <token>`` header, else None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


async def send_json(send: Send, status: int, body: dict, headers: list | None = None) -> None:
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class ApiKeyMiddleware:
    """Refuses ``/api`` and ``/v1`` requests without the right Bearer key (401).

    ``key`` None disables the check (the gateway then listens on loopback only, unless
    ``LOKI_WEB_HOST`` says otherwise).
    """

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or not is_protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope.get("headers", []))
        # compare_digest on equal-type operands takes time independent of where they differ.
        if token is not None and hmac.compare_digest(token, self.key):
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        log.warning(
            "401 %s %s from %s: %s",
            scope.get("method"),
            scope["path"],
            client[0],
            "no bearer key" if token is None else "wrong key",
        )
        await send_json(
            send,
            401,
            error_body("missing or invalid API key", "invalid_request_error", "invalid_api_key"),
            [(b"www-authenticate", b"Bearer")],
        )


class BodyLimitMiddleware:
    """413 for request bodies above ``limit`` bytes (declared or counted)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await send_json(
                        send, 400, error_body("bad Content-Length", "invalid_request_error")
                    )
                    return
                if declared > self.limit:
                    await send_json(send, 413, self._body())
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, self._body()["error"]["message"])
            return message

        await self.app(scope, counted, send)

    def _body(self) -> dict:
        return error_body(
            f"request body larger than {self.limit} bytes",
            "invalid_request_error",
            "request_too_large",
        )
