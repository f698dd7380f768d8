"""The chat service's request handlers, one per subject, and their error mapping.

Subjects served (queue group ``chat``): ``loki.chat.send``, ``loki.chat.control``,
``loki.chat.state``, ``loki.chat.replay``, ``loki.chat.conversations``, ``loki.chat.code``
(:mod:`loki_chat.code.api`); plus this instance's
own ``loki.chat.instance.<id>`` where other instances forward requests for conversations it
owns (:mod:`loki_chat.ownership`). What a handler raises (a :class:`~loki_chat.errors.ChatError`
or another :class:`loki_shared.errors.LokiError`) is answered as the reply's ``error`` by the
broker's exception middleware (:func:`loki_shared.errors.exception_middleware`), here as for a
forwarded request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from faststream.nats import NatsBroker
from pydantic import BaseModel

from loki_shared import subjects
from loki_shared.errors import InvalidRequest
from loki_shared.messages.chat import (
    ChatMessage,
    ControlReply,
    ControlRequest,
    ConversationInfo,
    ConversationsReply,
    ConversationsRequest,
    ForwardRequest,
    ReplayReply,
    ReplayRequest,
    SendReply,
    SendRequest,
    StateReply,
    StateRequest,
)
from loki_shared.messages.code import CodeReply, CodeRequest
from loki_shared.messages.recall import DEFAULT_PROJECT, PurgeReply, PurgeRequest
from loki_shared.serve import serve

from .actor import Actor, Shared
from .code import api as code_api
from .context import ContextView
from .conversation import Conversation
from .images import unpack
from .ownership import Ownership
from .project.snapshot import without_updates
from .store import NO_LOG, new_conversation_id

log = logging.getLogger("loki.chat.service")


#: Bound of one replay reply's events, in bytes of JSON (below NATS's 1 MiB default).
REPLAY_MAX_BYTES = 700_000


@dataclass(frozen=True)
class Route:
    """One kind of chat request: ``op`` names its handler (a :class:`ChatHandlers` method)
    and its :class:`~loki_shared.messages.chat.ForwardRequest` op; served on ``subject``
    (queue group ``chat``) with at most ``max_workers`` at once. Its request and reply types
    are the subject's in :data:`loki_shared.subjects.EXCHANGES`."""

    op: str
    subject: str
    max_workers: int

    @property
    def request(self) -> type[BaseModel]:
        return subjects.EXCHANGES[self.subject].request


ROUTES = (
    Route("send", subjects.CHAT_SEND, 32),
    Route("control", subjects.CHAT_CONTROL, 16),
    Route("state", subjects.CHAT_STATE, 16),
    Route("replay", subjects.CHAT_REPLAY, 16),
    Route("conversations", subjects.CHAT_CONVERSATIONS, 16),
    Route("code", subjects.CHAT_CODE, 16),
)
ROUTES_BY_OP = {route.op: route for route in ROUTES}


class ChatHandlers:
    """What each chat subject does, run in the conversation's owner.

    Args:
        shared: the instance's shared parts.
        ownership: this instance's owned conversations (and forwarding to the others).
    """

    def __init__(self, shared: Shared, ownership: Ownership) -> None:
        self.shared = shared
        self.settings = shared.settings
        self.store = shared.store
        self.ownership = ownership

    def register(self, broker: NatsBroker) -> None:
        """Declare the subscribers on ``broker`` (not yet started), each with
        :func:`loki_shared.serve.serve`: one per :data:`ROUTES` entry, and this instance's
        forward subject (its reply's model is the reply of the route its ``op`` names)."""
        for route in ROUTES:
            serve(
                broker,
                route.subject,
                getattr(self, route.op),
                queue=subjects.QUEUE_CHAT,
                max_workers=route.max_workers,
            )
        serve(
            broker,
            subjects.chat_instance(self.ownership.instance),
            self.forwarded,
            max_workers=32,
            request=ForwardRequest,
            reply=BaseModel,
        )

    async def forwarded(self, msg: ForwardRequest) -> BaseModel:
        """Serve a request another instance forwarded to this owner: the reply of the route
        its ``op`` names.

        Raises:
            InvalidRequest: an unknown ``op``.
        """
        route = ROUTES_BY_OP.get(msg.op)
        if route is None:
            raise InvalidRequest(msg.op)
        handler = getattr(self, route.op)
        reply: BaseModel = await handler(route.request.model_validate(msg.payload), forwarded=True)
        return reply

    # -- handlers -------------------------------------------------------------------------
    async def send(self, req: SendRequest, forwarded: bool = False) -> SendReply:
        """Start a turn, or queue it behind the running one (never refused)."""
        cid = req.conversation or new_conversation_id()
        subjects.chat_events(cid)  # validates the id

        async def local(actor: Actor) -> SendReply:
            queued = await actor.enqueue(req.content, req.images)
            return SendReply(conversation=cid, queued=queued)

        return await self.ownership.owned(
            cid,
            "send",
            req.model_copy(update={"conversation": cid}),
            SendReply,
            local,
            create=True,
            forwarded=forwarded,
        )

    async def control(self, req: ControlRequest, forwarded: bool = False) -> ControlReply:
        """``stop`` the running turn (partial reply kept, marked stopped); ``reset`` the
        conversation (turn stopped, queue, Messages and Log emptied; seq goes on);
        ``compact`` it through the compaction policy; ``continue`` the last assistant reply
        (cut at ``max_tokens``) in a turn of its own; ``cancel_queued`` drops the queued
        message ``content`` (``ok`` false, nothing changed, when it already started).

        Raises:
            InvalidRequest: ``cancel_queued`` without ``content``.
        """

        async def local(actor: Actor) -> ControlReply:
            if req.action == "cancel_queued":
                if not req.content:
                    raise InvalidRequest("cancel_queued needs the queued message's content")
                if await actor.unqueue(req.content):
                    return ControlReply(ok=True, detail="cancelled")
                return ControlReply(
                    ok=False, detail="not queued: its turn already started (or it never waited)"
                )
            if req.action == "stop":
                was = actor.busy
                actor.stop.set()
                return ControlReply(ok=True, detail="stopping" if was else "idle")
            if req.action == "reset":
                actor.conv.pending.clear()
                await actor.halt()
                actor.conv.messages.clear()
                actor.conv.clear_log()
                actor.conv.meter.invalidate()
                actor.conv.turn_open = False
                actor.project.reset(actor.conv)
                await actor.emit({}, loki={"event": "reset"})
                await actor.persist()
                return ControlReply(ok=True, detail="reset")
            if actor.busy and not actor.conv.turn_open and not actor.conv.pending:
                # the turn's end event is out (the client saw it) and nothing is queued: the
                # worker is only writing its last state; the control waits for that write
                await actor.settle()
            if actor.busy:
                return ControlReply(ok=False, detail="a turn is running")
            if req.action == "continue":
                if not actor.can_continue():
                    return ControlReply(ok=False, detail="no assistant reply to continue")
                actor.resume()
                return ControlReply(ok=True, detail="continuing")
            conv = actor.conv
            view = ContextView(
                conversation=conv,
                trigger="manual",
                n_ctx=conv.meter.n_ctx or 0,
                ctx_used=conv.meter.used(self.settings.system_prompt, conv.messages),
                emit=lambda delta, meta: actor.emit(delta, loki=meta),
            )
            changed = await self.shared.policy.maybe_compact(view)
            if changed:
                await actor.project.after_compaction(conv)
                await actor.persist()
            return ControlReply(
                ok=bool(changed), detail="compacted" if changed else "nothing compacted"
            )

        return await self.ownership.owned(
            req.conversation, "control", req, ControlReply, local, forwarded=forwarded
        )

    async def code(self, req: CodeRequest, forwarded: bool = False) -> CodeReply:
        """A conversation's code mode and criteria (:func:`loki_chat.code.api.handle`), in
        its owner."""

        async def local(actor: Actor) -> CodeReply:
            return await code_api.handle(actor, req)

        return await self.ownership.owned(
            req.conversation, "code", req, CodeReply, local, forwarded=forwarded
        )

    async def state(self, req: StateRequest, forwarded: bool = False) -> StateReply:
        """Model-view messages (system first), ``ctx_used``, and the turn's status."""
        actor, conv = await self.ownership.read(req.conversation, NO_LOG)
        if actor is None and (conv.turn_open or conv.pending):
            # a dead owner left a turn or a queue to finish: take the conversation over
            return await self.ownership.owned(
                req.conversation,
                "state",
                req,
                StateReply,
                lambda a: self._state_of(a, a.conv),
                forwarded=forwarded,
            )
        return await self._state_of(actor, conv)

    async def _state_of(self, actor: Actor | None, conv: Conversation) -> StateReply:
        system = ChatMessage(role="system", content=self.settings.system_prompt)
        return StateReply(
            conversation=conv.id,
            messages=[system, *conv.messages],
            ctx_used=conv.meter.used(self.settings.system_prompt, conv.messages),
            n_ctx=conv.meter.n_ctx,
            generating=bool(actor and actor.busy),
            queued=len(conv.pending),  # the running turn's message already left the queue
            pending=[unpack(p)[0] for p in conv.pending],
            last_seq=conv.seq,
            tools_unavailable=actor.tools_unavailable if actor else None,
        )

    async def replay(self, req: ReplayRequest, forwarded: bool = False) -> ReplayReply:
        """Display events after ``after_seq``: the owner's in-memory Log (asked of the
        owner when another instance owns the conversation, before anything is read here),
        else the stored one (only its chunks after ``after_seq`` opened, for a replay after a
        seq: the cost of what is new, not of the conversation's age)."""
        cid = req.conversation

        async def in_owner() -> ReplayReply:
            return await self.ownership.owned(
                cid,
                "replay",
                req,
                ReplayReply,
                lambda a: self._replay_of(a.conv, req),
                forwarded=forwarded,
            )

        if not forwarded and self.ownership.local(cid) is None:
            owner = await self.store.owner(cid)
            if owner and owner != self.ownership.instance:
                return await in_owner()  # its Log is ahead of the blob
        log_after = req.after_seq if req.turns is None else None
        actor, conv = await self.ownership.read(cid, log_after)
        if actor is None and (conv.turn_open or conv.pending):
            return await in_owner()  # a dead owner's unfinished turn or queue: taken over here
        return await self._replay_of(conv, req)

    async def _replay_of(self, conv: Conversation, req: ReplayRequest) -> ReplayReply:
        """Events after ``after_seq``, at most ``limit``, and at most about
        :data:`REPLAY_MAX_BYTES` of JSON (NATS caps a message at 1 MiB by default): ``more``
        tells the caller to ask again from the last seq it got."""
        if req.turns is not None:
            return self._history_of(conv, req.turns, req.before_seq)
        events, more = conv.events_after(req.after_seq, req.limit)
        page: list[Any] = []
        size = 0
        for event in events:
            n = len(event.model_dump_json())
            if page and size + n > REPLAY_MAX_BYTES:
                more = True
                break
            page.append(event)
            size += n
        return ReplayReply(events=page, last_seq=conv.seq, more=more)

    def _history_of(self, conv: Conversation, turns: int, before: int | None) -> ReplayReply:
        """The last ``turns`` turns before ``before`` (:meth:`Conversation.history_page`),
        cut from the front to about :data:`REPLAY_MAX_BYTES` of JSON (``older`` then true)."""
        events, older = conv.history_page(turns, before)
        size = 0
        start = len(events)
        while start > 0:
            n = len(events[start - 1].model_dump_json())
            if size + n > REPLAY_MAX_BYTES and start < len(events):
                older = True
                break
            size += n
            start -= 1
        return ReplayReply(events=events[start:], last_seq=conv.seq, older=older)

    async def _purge_archive(self, cid: str) -> None:
        """Ask the recall service to delete the blocks ``cid`` archived now. The deletion is
        already recorded by the store's delete (same script); unanswered, the recall service
        applies it when it next runs, so a failure here only delays it."""
        try:
            reply = await self.shared.bus.request(
                subjects.RECALL_PURGE,
                PurgeRequest(conversation=cid),
                PurgeReply,
                self.settings.recall_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - recall down: the record completes it later
            log.warning(
                "archived blocks of %s: deletion recorded, recall unreachable (%r)", cid, exc
            )
            return
        if reply.error is not None:
            log.warning(
                "archived blocks of %s: deletion recorded, not applied yet: %s",
                cid,
                reply.error.message,
            )

    async def conversations(
        self, req: ConversationsRequest, forwarded: bool = False
    ) -> ConversationsReply:
        """``list`` (newest first; one project's with ``project``, one kind's with
        ``kind``), ``create`` (in
        ``project``, else the active one), ``rename``, ``delete`` (the stored blob is
        removed), ``export`` (messages and log, without PROJ_SNAPSHOT's update blocks)."""
        if req.action == "list":
            infos = [ConversationInfo(**i) for i in await self.store.list_infos()]
            if req.project is not None:
                infos = [i for i in infos if (i.project or DEFAULT_PROJECT) == req.project]
            if req.kind is not None:
                infos = [i for i in infos if i.kind == req.kind]
            return ConversationsReply(conversations=infos)
        if req.action == "create":
            cid = new_conversation_id()

            async def created(actor: Actor) -> ConversationsReply:
                if req.title or req.project:
                    actor.conv.title = req.title or actor.conv.title
                    actor.conv.project = req.project or actor.conv.project
                    await actor.persist()
                return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))

            return await self.ownership.owned(
                cid,
                "conversations",
                req,
                ConversationsReply,
                created,
                create=True,
                forwarded=forwarded,
            )
        if not req.conversation:
            raise InvalidRequest("conversation id required")
        cid = req.conversation
        if req.action == "export":
            _, conv = await self.ownership.read(cid)
            return ConversationsReply(
                conversation=ConversationInfo(**conv.info()),
                export={
                    "id": conv.id,
                    "title": conv.title,
                    "created": conv.created,
                    "system": self.settings.system_prompt,
                    "messages": [
                        m.model_dump(exclude_none=True) for m in without_updates(conv.messages)
                    ],
                    "log": [e.model_dump(exclude_none=True) for e in conv.log],
                },
            )

        async def local(actor: Actor) -> ConversationsReply:
            if req.action == "rename":
                actor.conv.title = req.title or ""
                await actor.persist()
                return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))
            await self.ownership.delete(actor)
            await self._purge_archive(cid)
            return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))

        return await self.ownership.owned(
            cid, "conversations", req, ConversationsReply, local, forwarded=forwarded
        )
