"""The sealed chat routes (``/api/e2e/chat`` SSE, ``/api/e2e/send``, ``/api/e2e/control``,
``/api/e2e/state``: the device's envelope is the credential, see
:mod:`loki_gateway.e2e.sealed`), the PWA's path, and (included here) the pairing routes of
:mod:`loki_gateway.e2e.pairing`.

The sealed routes call the plain routes' own functions (:mod:`loki_gateway.routes.chat`)
with the opened body; what they answer (or the error they raise) goes back sealed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, ValidationError
from starlette.types import Scope

from loki_shared import e2e_envelope as env
from loki_shared.errors import LokiError

from .. import errors
from ..bus import Bus
from ..deps import get_bus
from ..errors import BadRequest
from ..routes import chat
from . import pairing
from .sealed import Opened, devices, open_request, sealed_json
from .stream import FrameSealer, sealed_stream

router = APIRouter(tags=["e2e"])
router.include_router(pairing.router)

STREAM_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"


async def _answer(request: Request, opened: Opened, call: Any) -> JSONResponse:
    """Run ``call()`` (a plain route's function) and seal its answer, or its error."""
    try:
        result = await call()
    except ValidationError as exc:
        body = errors.error_body(
            errors.describe_validation([dict(e) for e in exc.errors()]),
            "invalid_request_error",
            "invalid_value",
        )
        return sealed_json(opened, 400, body)
    except LokiError as exc:
        plain = await errors.loki_error_handler(request, exc)
        return sealed_json(opened, plain.status_code, json.loads(bytes(plain.body)))
    if isinstance(result, Response):
        return sealed_json(opened, result.status_code, json.loads(bytes(result.body)))
    return sealed_json(opened, 200, result)


async def _wire(request: Request) -> Any:
    try:
        return env.loads(await request.body(), "the body")
    except env.EnvelopeError as exc:
        raise BadRequest(f"{exc}: send a sealed envelope", code="invalid_envelope") from exc


@router.post("/api/e2e/send")
async def e2e_send(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """Sealed ``/api/chat/send``: body ``{"conversation"?, "content"}`` (no attachments);
    answers 202 ``{"conversation", "queued"}`` sealed."""
    opened = await open_request(request, "send", await _wire(request))

    async def call() -> Any:
        body = chat.SendBody.model_validate(opened.body)
        if body.attachments:
            raise BadRequest("attachments are not sent over e2e", code="invalid_value")
        return await chat.send(body, request, bus)

    return await _answer(request, opened, call)


_CONTROLS = {
    "stop": chat.chat_stop,
    "reset": chat.chat_reset,
    "compact": chat.chat_compact,
    "continue": chat.chat_continue,
}


@router.post("/api/e2e/control")
async def e2e_control(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """Sealed controls: ``{"action": stop|reset|compact|continue|cancel_queued,
    "conversation", "content"? (cancel_queued)}`` -> ``{"ok", "detail"}`` sealed."""
    opened = await open_request(request, "control", await _wire(request))

    async def call() -> Any:
        fields = dict(opened.body)
        action = fields.pop("action", None)
        if action == "cancel_queued":
            return await chat.chat_cancel_queued(chat.CancelQueuedBody.model_validate(fields), bus)
        if action not in _CONTROLS:
            raise BadRequest(
                f"action must be one of {', '.join([*_CONTROLS, 'cancel_queued'])}",
                code="invalid_value",
                param="action",
            )
        return await _CONTROLS[action](chat.ControlBody.model_validate(fields), bus)

    return await _answer(request, opened, call)


class _StateBody(BaseModel):
    conversation: str | None = Field(default=None, pattern=chat.CONV_PATTERN)


@router.post("/api/e2e/state")
async def e2e_state(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """Sealed state: ``{"conversation": id}`` -> ``/api/chat/state``'s answer; ``{}`` ->
    ``{"conversations": [...]}`` (the person's conversations, as ``/api/conversations``)."""
    opened = await open_request(request, "state", await _wire(request))

    async def call() -> Any:
        body = _StateBody.model_validate(opened.body)
        if body.conversation is None:
            return await chat.conversations_list(None, "main", bus)
        return await chat.chat_state(body.conversation, bus)

    return await _answer(request, opened, call)


class _StreamBody(BaseModel):
    conversation: str = Field(pattern=chat.CONV_PATTERN)
    after: int = Field(default=0, ge=0, le=10**15)
    stream: str = Field(pattern=STREAM_PATTERN)


@router.get("/api/e2e/chat")
async def e2e_chat(
    request: Request,
    device: Annotated[str, Query(max_length=64)],
    nonce: Annotated[str, Query(max_length=64)],
    ct: Annotated[str, Query(max_length=4096)],
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    bus: Bus = Depends(get_bus),
) -> Any:
    """Sealed ``/api/chat`` SSE. The query is the opening request's envelope (``device``,
    ``nonce``, ``ct``) whose body is ``{"conversation", "after", "stream"}``: ``after`` the
    resume seq (a ``Last-Event-ID`` header, when sent, must equal it), ``stream`` a random id
    (8-64 of ``A-Z a-z 0-9 _ -``) bound into every event's associated data. The frames are
    ``/api/chat``'s, each data sealed (:mod:`loki_gateway.e2e.stream`)."""
    wire = {"v": env.VERSION, "device": device, "nonce": nonce, "ct": ct}
    opened = await open_request(request, "chat", wire)
    try:
        body = _StreamBody.model_validate(opened.body)
    except ValidationError as exc:
        raise BadRequest(
            errors.describe_validation([dict(e) for e in exc.errors()]), "invalid_value"
        ) from exc
    header = (last_event_id_header or "").strip()
    if header and header != str(body.after):
        raise BadRequest(
            "Last-Event-ID differs from the sealed resume seq", "invalid_last_event_id"
        )
    response = await chat.chat_stream(request, body.conversation, body.after, None, None, bus)
    sealer = FrameSealer(opened.key, opened.device, body.conversation, body.stream, body.after)
    response.body_iterator = sealed_stream(response.body_iterator, sealer, devices(request))
    return response


@router.get("/e2e", include_in_schema=False)
async def pwa_redirect() -> Response:
    """The PWA lives under ``/e2e/`` (its service worker's scope)."""
    return Response(status_code=307, headers={"Location": "/e2e/"})


#: The PWA's Content-Security-Policy: its own files only, no inline script or style, no
#: plugin, not framed, requests to its own origin only (the sealed routes).
PWA_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; manifest-src 'self'; worker-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
PWA_HEADERS = {
    "Content-Security-Policy": PWA_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class PwaFiles(StaticFiles):
    """``static/e2e/`` (mounted at ``/e2e``) with :data:`PWA_HEADERS` on every answer."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        """StaticFiles' answer for ``path`` with the PWA's headers added."""
        response = await super().get_response(path, scope)
        response.headers.update(PWA_HEADERS)
        return response
