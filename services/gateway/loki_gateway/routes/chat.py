"""Chat and conversation routes: send, the SSE stream, state, stop/reset/compact/continue, and the
conversations index (list, create, rename, delete, export).

Everything is a request to the chat service over NATS (``loki.chat.*``); the SSE stream is
built by :mod:`loki_gateway.event_hub`. Conversation ids are 1 to 64 characters of
``A-Z a-z 0-9 _ -`` (they become a NATS subject token); anything else is a 400 that says so.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from loki_shared import subjects
from loki_shared.messages.chat import (
    ControlReply,
    ControlRequest,
    ConversationsReply,
    ConversationsRequest,
    SendReply,
    SendRequest,
    StateReply,
    StateRequest,
)

from ..archive_reader import archived_blocks
from ..bus import READ_PATIENCE_S, Bus
from ..deps import get_bus
from ..errors import BadRequest
from ..event_hub import conversation_stream, history_page, replay_page
from . import attachments

router = APIRouter(tags=["chat"])

CONV_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_CONV_RE = re.compile(CONV_PATTERN)
MAX_TITLE = 200

ConvQuery = Annotated[
    str, Query(pattern=CONV_PATTERN, description="Conversation id (1-64 of A-Z a-z 0-9 _ -).")
]
ConvPath = Annotated[str, Path(pattern=CONV_PATTERN, description="Conversation id.")]


class SendBody(BaseModel):
    """``POST /api/chat/send``: no ``conversation`` starts a new one."""

    conversation: str | None = Field(default=None, pattern=CONV_PATTERN)
    content: str = ""
    attachments: list[str] = Field(
        default_factory=list,
        description="Attachment ids from /api/chat/upload: text files are inlined as fenced "
        "blocks, images sent to the model in this turn.",
    )


class SendAccepted(BaseModel):
    conversation: str
    queued: bool = False


class ControlBody(BaseModel):
    conversation: str = Field(pattern=CONV_PATTERN)


class CancelQueuedBody(BaseModel):
    """``POST /api/chat/cancel_queued``: the queued message's text, as it was sent."""

    conversation: str = Field(pattern=CONV_PATTERN)
    content: str = Field(min_length=1)


class ControlResult(BaseModel):
    ok: bool
    detail: str = ""


class CreateBody(BaseModel):
    """``POST /api/conversations``: ``project`` None: the active project."""

    title: str | None = Field(default=None, max_length=MAX_TITLE)
    project: str | None = Field(default=None, pattern=CONV_PATTERN)


class RenameBody(BaseModel):
    title: str = Field(min_length=1, max_length=MAX_TITLE)


def _settings(request: Request) -> Any:
    return request.app.state.settings


def _public(reply: BaseModel) -> dict[str, Any]:
    return reply.model_dump(mode="json", exclude={"error"})


@router.post("/api/chat/send", status_code=202, response_model=SendAccepted)
async def send(body: SendBody, request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """Start a turn (or queue it behind the running one): 202 with the conversation id."""
    if not body.content and not body.attachments:
        raise BadRequest("content is empty and nothing is attached", code="empty_message")
    content, images = await attachments.expand(
        request, bus, body.content, body.attachments, body.conversation
    )
    limit = _settings(request).max_message_chars
    if len(content) > limit:
        raise BadRequest(
            f"content (attached text files inlined) is {len(content)} characters, "
            f"the limit is {limit}",
            code="content_too_long",
        )
    reply = await bus.request_ok(
        subjects.CHAT_SEND,
        SendRequest(conversation=body.conversation, content=content, images=images),
        SendReply,
        timeout=10.0,
    )
    if body.attachments and body.conversation is None:  # the conversation the send made
        await attachments.store(request).bind(body.attachments, reply.conversation)
    return JSONResponse({"conversation": reply.conversation, "queued": reply.queued}, 202)


def _resume_from(header: str | None, query: int | None) -> int:
    if query is not None:
        return query
    if header is None or header.strip() == "":
        return 0
    text = header.strip()
    if not text.isdigit() or len(text) > 15:
        raise BadRequest(
            f"Last-Event-ID must be a non-negative integer seq, got {text[:40]!r}",
            code="invalid_last_event_id",
        )
    return int(text)


@router.get(
    "/api/chat",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def chat_stream(
    request: Request,
    conversation: ConvQuery,
    last_event_id: Annotated[int | None, Query(ge=0, le=10**15)] = None,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    tail_turns: Annotated[int | None, Query(ge=1, le=1000)] = None,
    bus: Bus = Depends(get_bus),
) -> Any:
    """SSE: the conversation's display log replayed after ``Last-Event-ID`` (header, or the
    ``last_event_id`` query for clients that cannot set it), then live events; ``: ping``
    every ``LOKI_SSE_PING_S`` seconds. See :mod:`loki_gateway.event_hub`.

    ``tail_turns`` (a stream opened from the start, no ``Last-Event-ID``): only the last
    ``tail_turns`` turns are replayed, after an ``event: history`` frame whose data
    ``{"before": seq}`` names the first seq sent when older events exist; the client asks for
    them with ``GET /api/chat/history``. A resume is always exact, whatever was asked first."""
    settings = _settings(request)
    after = _resume_from(last_event_id_header, last_event_id)
    hub = request.app.state.hub
    feed = await hub.attach(conversation)
    tail = tail_turns if after == 0 else None
    try:
        if tail is None:
            first = await replay_page(bus, conversation, after, settings.sse_replay_page)
        else:
            first = await history_page(bus, conversation, tail, None)
    except BaseException:  # the feed detached whatever ends the first page, then re-raised
        await hub.detach(feed)
        raise
    stream = conversation_stream(
        bus, hub, feed, first, after, settings.sse_replay_page, settings.sse_coalesce_min
    )
    shutdown = anyio.Event()

    async def on_shutdown() -> AsyncIterator[bytes]:
        # The server is stopping: end the stream cleanly with `event: reconnect`.
        async def watch() -> None:
            await shutdown.wait()
            feed.close("server shutting down")

        watcher = asyncio.create_task(watch())
        try:
            async for chunk in stream:
                yield chunk
        finally:
            watcher.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await stream.aclose()  # runs its cleanup now (detach from the hub)

    return EventSourceResponse(
        on_shutdown(),
        ping=settings.sse_ping_s,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="ping", sep="\n"),
        headers={"Cache-Control": "no-cache"},
        shutdown_event=shutdown,
        shutdown_grace_period=2.0,
    )


@router.get("/api/chat/history")
async def chat_history(
    conversation: ConvQuery,
    before: Annotated[int, Query(ge=1, le=10**15)],
    turns: Annotated[int, Query(ge=1, le=1000)] = 20,
    bus: Bus = Depends(get_bus),
) -> Any:
    """An older page of the display log (a long conversation scrolled up): the events of the
    last ``turns`` turns before seq ``before``, text deltas coalesced, each as the SSE data
    object of its event (``seq`` included); ``before`` is the seq to ask next when ``older``
    is true."""
    reply = await history_page(bus, conversation, turns, before)
    events = reply.events
    return {
        "events": [e.sse_data() for e in events],
        "before": events[0].seq if events else before,
        "older": reply.older,
    }


@router.get("/api/chat/state")
async def chat_state(conversation: ConvQuery, bus: Bus = Depends(get_bus)) -> Any:
    """Model-view ``messages``, ``ctx_used``/``n_ctx`` (tokens), ``generating``, ``queued``
    (count) and ``pending`` (their texts, in order), ``last_seq``."""
    reply = await bus.request_ok(
        subjects.CHAT_STATE,
        StateRequest(conversation=conversation),
        StateReply,
        patience_s=READ_PATIENCE_S,
    )
    return _public(reply)


async def _control(
    bus: Bus, conversation: str, action: str, timeout: float, content: str | None = None
) -> Any:
    reply = await bus.request_ok(
        subjects.CHAT_CONTROL,
        ControlRequest(conversation=conversation, action=action, content=content),  # type: ignore[arg-type]
        ControlReply,
        timeout=timeout,
    )
    return {"ok": reply.ok, "detail": reply.detail}


@router.post("/api/chat/stop", response_model=ControlResult)
async def chat_stop(body: ControlBody, bus: Bus = Depends(get_bus)) -> Any:
    """Stop the running turn (the partial answer is kept, marked stopped)."""
    return await _control(bus, body.conversation, "stop", 10.0)


@router.post("/api/chat/reset", response_model=ControlResult)
async def chat_reset(body: ControlBody, bus: Bus = Depends(get_bus)) -> Any:
    """Empty the conversation (messages and display log)."""
    return await _control(bus, body.conversation, "reset", 10.0)


@router.post("/api/chat/compact", response_model=ControlResult)
async def chat_compact(body: ControlBody, bus: Bus = Depends(get_bus)) -> Any:
    """Compact the conversation now (may take as long as a summary completion)."""
    return await _control(bus, body.conversation, "compact", 600.0)


@router.post("/api/chat/continue", response_model=ControlResult)
async def chat_continue(body: ControlBody, bus: Bus = Depends(get_bus)) -> Any:
    """Continue the last assistant reply (cut at ``max_tokens``): the engine resumes the same
    message, its text is appended to it; ``ok`` false when a turn runs or the last message
    is not an assistant reply. The continuation streams like a turn."""
    return await _control(bus, body.conversation, "continue", 10.0)


@router.post("/api/chat/cancel_queued", response_model=ControlResult)
async def chat_cancel_queued(body: CancelQueuedBody, bus: Bus = Depends(get_bus)) -> Any:
    """Drop a message queued behind the running turn (``content``: its text as sent):
    ``ok`` true when it was still waiting; ``ok`` false, nothing changed, when its turn
    already started (a started message is never cancelled)."""
    return await _control(bus, body.conversation, "cancel_queued", 10.0, body.content)


async def _conversations(bus: Bus, **fields: Any) -> ConversationsReply:
    patience = READ_PATIENCE_S if fields.get("action") in ("list", "export") else 0.0
    return await bus.request_ok(
        subjects.CHAT_CONVERSATIONS,
        ConversationsRequest(**fields),
        ConversationsReply,
        patience_s=patience,
    )


@router.get("/api/conversations")
async def conversations_list(
    project: Annotated[str | None, Query(pattern=CONV_PATTERN)] = None,
    kind: Literal["main", "task", "all"] = "main",
    bus: Bus = Depends(get_bus),
) -> Any:
    """``{"conversations": [{"id", "title", "created", "updated", "project", "kind"}]}``;
    ``project=<id>``: only that project's (a conversation without one is the default
    project's); ``kind``: ``main`` (default: the person's, the sidebar's list), ``task``
    (scheduled tasks' runs, opened from the Tasks dialog) or ``all``."""
    reply = await _conversations(
        bus, action="list", project=project or None, kind=None if kind == "all" else kind
    )
    return {"conversations": [c.model_dump(mode="json") for c in reply.conversations]}


@router.post("/api/conversations", status_code=201)
async def conversations_create(bus: Bus = Depends(get_bus), body: CreateBody | None = None) -> Any:
    """Create an empty conversation (in ``project``, else the active project): 201
    ``{"conversation": {...}}``."""
    reply = await _conversations(
        bus,
        action="create",
        title=body.title if body else None,
        project=body.project if body else None,
    )
    info = reply.conversation.model_dump(mode="json") if reply.conversation else None
    return JSONResponse({"conversation": info}, status_code=201)


@router.patch("/api/conversations/{conversation}")
async def conversations_rename(
    conversation: ConvPath, body: RenameBody, bus: Bus = Depends(get_bus)
) -> Any:
    """Rename: ``{"title"}`` -> ``{"conversation": {...}}``."""
    reply = await _conversations(bus, action="rename", conversation=conversation, title=body.title)
    info = reply.conversation.model_dump(mode="json") if reply.conversation else None
    return {"conversation": info}


@router.delete("/api/conversations/{conversation}")
async def conversations_delete(conversation: ConvPath, bus: Bus = Depends(get_bus)) -> Any:
    """Delete the conversation, its stored blob and the blocks it archived (the chat service
    records that deletion for the recall service, which applies it at once or when it next
    runs)."""
    await _conversations(bus, action="delete", conversation=conversation)
    return {"ok": True, "deleted": conversation}


@router.get("/api/conversations/{conversation}/export")
async def conversations_export(
    conversation: ConvPath, with_archive: bool = False, bus: Bus = Depends(get_bus)
) -> Any:
    """The whole conversation as JSON (messages and display log), as a download;
    ``with_archive=1`` adds ``archive``: the blocks it archived (readable ones, in seq
    order, as ``GET /api/recall/blocks?conversation=<id>`` lists them)."""
    reply = await _conversations(bus, action="export", conversation=conversation)
    export = dict(reply.export or {})
    if with_archive:
        export["archive"] = [
            b.model_dump(mode="json") async for b in archived_blocks(bus, conversation)
        ]
    return JSONResponse(
        export,
        headers={"Content-Disposition": f'attachment; filename="loki-{conversation}.json"'},
    )
