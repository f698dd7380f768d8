"""The JSON text rule, checked once where the world's JSON enters Loki (every route).

JSON text is Unicode written in UTF-8 (RFC 8259 §8.1), and a ``\\uXXXX`` escape of a lone
UTF-16 surrogate (``"\\ud83d"`` without its pair) names no character (§8.2: such strings
"are unpredictable"). Python's :func:`json.loads` takes both and gives a ``str`` that cannot
be encoded again, so the request used to fail later, wherever it was first written (NATS,
Redis, the engine): a 500, maybe with part of it stored.

:class:`JsonTextMiddleware` reads the body of every request that is not a form or a file
upload (``multipart/*``, ``application/x-www-form-urlencoded``, ``application/octet-stream``)
before any route does and refuses, with 400 ``invalid_request_error`` / ``invalid_text``
and ``param`` naming the field (``messages[0].content``; ``body`` when no field can be
named), a body that

- is JSON but not UTF-8: bytes that are not UTF-8 inside a JSON string (read with
  ``surrogateescape`` so the field holding them can be named), or the whole text in UTF-16
  or UTF-32, or
- holds a string (a value or a key) with a lone surrogate (written as an escape).

Characters are never replaced: what a client sent is stored as sent or refused. A body that
is not JSON at all (a file sent as it is, e.g. a project's zip) is left to the route.
Nothing has been read by a route, so nothing is stored. The body, once read, is handed to
the route unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import send_json
from .errors import error_body

#: Content types whose bodies are not JSON text (files, forms): passed through unread.
SKIPPED_TYPES = ("multipart/", "application/x-www-form-urlencoded", "application/octet-stream")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: A ``\\uXXXX`` escape of a surrogate (or text that looks like one): only then is the body
#: decoded; UTF-8 without one keeps the rule whatever it holds.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key_path(path: str, key: str) -> str:
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=True)}]"


def bad_text_path(value: Any) -> str | None:
    """The path of the first string (value or key) in a decoded JSON ``value`` that holds
    a surrogate code point (``messages[0].content``; ``""`` for the top-level value), or
    None when every string is Unicode text. Iterative: no depth limit of its own."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                if _SURROGATE.search(key):
                    return _key_path(path, key)
                children.append((_key_path(path, key), child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _json_in_another_encoding(raw: bytes) -> bool:
    """Whether ``raw`` is JSON in UTF-16 or UTF-32 (what :func:`json.loads` would read from
    bytes, surrogates included)."""
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def check_json_text(raw: bytes) -> tuple[str, str] | None:
    """Check one request body against the rule (module docstring).

    Returns:
        None when the body keeps the rule (or is not JSON at all: the route says so);
        else ``(message, param)``.
    """
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if _SURROGATE_ESCAPE.search(raw) is None:
            return None  # UTF-8 and no surrogate escape: nothing to look for
    text = raw.decode("utf-8", "surrogateescape")
    utf8 = not _SURROGATE.search(text)
    try:
        value = json.loads(text)
    except RecursionError:
        return "request body is nested too deeply", "body"
    except ValueError:
        if utf8 or not _json_in_another_encoding(raw):
            return None  # not JSON (a file, a zip...): the route decides
        return "request body is JSON but not UTF-8 (JSON text must be UTF-8, RFC 8259)", "body"
    path = bad_text_path(value)
    if path is None:
        return None
    param = path or "body"
    if not utf8:
        return (
            f"{param} holds bytes that are not UTF-8 (JSON text must be UTF-8, RFC 8259)",
            param,
        )
    return (
        f"{param} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
        "which is no character: send the character itself or its full surrogate pair",
        param,
    )


class JsonTextMiddleware:
    """Refuses request bodies that break the JSON text rule (module docstring) with a 400
    before any route reads them; other requests pass untouched (the body is read once and
    handed on as it came)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        ctype = b""
        for name, value in scope.get("headers", []):
            if name == b"content-type":
                ctype = value.lower().strip()
        if ctype.decode("latin-1").startswith(SKIPPED_TYPES):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        extra: list[Message] = []
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    extra.append(message)  # the client went away: the route sees it
                    break
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except HTTPException as exc:  # the body limit, counted while reading (auth.py)
            await send_json(
                send,
                exc.status_code,
                error_body(str(exc.detail), "invalid_request_error", "request_too_large"),
            )
            return
        raw = b"".join(chunks)
        bad = check_json_text(raw) if raw.strip() and not extra else None
        if bad is not None:
            message_, param = bad
            await send_json(
                send, 400, error_body(message_, "invalid_request_error", "invalid_text", param)
            )
            return
        replay: list[Message] = [{"type": "http.request", "body": raw, "more_body": False}, *extra]

        async def replayed() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replayed, send)
