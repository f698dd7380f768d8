"""The chat service on NATS: conversations, their owners, their queues and events.

Subjects served (queue group ``chat``): ``loki.chat.send``, ``loki.chat.control``,
``loki.chat.state``, ``loki.chat.replay``, ``loki.chat.conversations``; plus this instance's
own ``loki.chat.instance.<id>`` where other instances forward requests for conversations it
owns. Every display event is published on ``loki.chat.events.<conversation>``: the very
objects appended to the Log, in seq order.

Ownership: a conversation is served by one instance at a time, the holder of its Redis lock
(:mod:`.store`). A request landing on another instance is forwarded to the owner; when the
owner is gone (killed), the lock expires and the next request takes it over, loads the last
persisted blob and goes on. All state changes of a conversation happen in its owner, and
every write is fenced by the lock's token.

Queue: a send while a turn runs is queued (FIFO, persisted with the blob) and runs next;
it is never refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from loki_shared import subjects
from loki_shared.messages.base import ErrorInfo, Reply
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
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.messages.perf import PerfRecord

from .compaction import CompactionPolicy
from .context import ContextPolicy, ContextView
from .conversation import Conversation
from .engine import EngineClient
from .errors import ChatError, ConversationNotFound, FencedWrite, LeaseError, NotOwner
from .settings import Settings
from .store import Store, new_conversation_id
from .tools import ToolBox, recall_tools
from .turn import TurnRunner

log = logging.getLogger("loki.chat.service")

R = TypeVar("R", bound=BaseModel)

#: Display seqs reserved in Redis at a time (one small write per block of events).
SEQ_BLOCK = 64
#: Bound of one replay reply's events, in bytes of JSON (below NATS's 1 MiB default).
REPLAY_MAX_BYTES = 700_000


class Actor:
    """The owner-side state of one conversation (implements the turn loop's host)."""

    def __init__(self, svc: ChatService, conv: Conversation, lock_value: str) -> None:
        self.svc = svc
        self.conv = conv
        self.lock_value = lock_value
        self.settings = svc.settings
        self.toolbox = svc.toolbox
        self.engine = svc.engine
        self.policy = svc.policy
        self.stop = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None
        self.lost = False
        self.last_access = time.monotonic()
        self._emit_lock = asyncio.Lock()
        self._persist_lock = asyncio.Lock()
        self._renewers: dict[str, asyncio.Task[None]] = {}
        self.reserved = 0  # seqs up to this one are reserved in Redis

    @property
    def busy(self) -> bool:
        return self.worker is not None and not self.worker.done()

    # -- TurnHost -------------------------------------------------------------------------
    async def emit(self, delta: dict[str, Any] | None = None, **fields: Any):
        """Append a display event to the Log and publish it (in seq order). Seqs are
        reserved in Redis ahead of publication (blocks of :data:`SEQ_BLOCK`)."""
        async with self._emit_lock:
            if self.conv.seq + 1 > self.reserved and not self.lost:
                try:
                    self.reserved = self.conv.seq + SEQ_BLOCK
                    await self.svc.store.reserve_seq(self.conv.id, self.lock_value, self.reserved)
                except FencedWrite:
                    self.lost = True
                    self.stop.set()
            event = self.conv.new_event(delta, **fields)
            await self.svc.publish_event(event)
            return event

    async def persist(self) -> None:
        if self.lost:
            return
        async with self._persist_lock:
            self.conv.updated = time.time()
            try:
                await self.svc.store.save(self.conv, self.lock_value)
            except FencedWrite:
                log.error("conversation %s: lock lost, stopping", self.conv.id)
                self.lost = True
                self.stop.set()

    async def lease(self) -> Lease:
        lease = await self.svc.lease(self.conv.id)
        if lease.ttl_s and lease.lease_id:
            self._renewers[lease.lease_id] = asyncio.create_task(self._renew_lease(lease))
        return lease

    async def _renew_lease(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(max(0.5, lease.ttl_s / 2))
            try:
                await self.svc.request(
                    subjects.ENGINE_RENEW, RenewRequest(lease_id=lease.lease_id), Lease, 5.0
                )
            except Exception:  # noqa: BLE001 - the release or the stream will tell
                log.warning("lease %s renewal failed", lease.lease_id)

    async def release(self, lease: Lease, usage: dict[str, Any] | None = None) -> None:
        task = self._renewers.pop(lease.lease_id, None)
        if task:
            task.cancel()
        await self.svc.release(lease, usage)

    def publish_perf(self, record: PerfRecord) -> None:
        self.svc.publish_perf(record)

    async def total_slots(self) -> int | None:
        return await self.svc.total_slots()

    def policy_extra(self) -> dict[str, Any]:
        return self.svc.policy_extra()

    # -- queue ----------------------------------------------------------------------------
    async def recover(self) -> None:
        """After taking the conversation over: close a turn a dead owner left open, then run
        what was queued."""
        if self.conv.turn_open:
            self.conv.turn_open = False
            while (
                self.conv.messages
                and self.conv.messages[-1].loki
                and self.conv.messages[-1].loki.injected in ("budget", "act")
            ):
                self.conv.messages.pop()
            await self.emit(
                {},
                finish_reason="error",
                loki={
                    "event": "turn_end",
                    "error": "interrupted: the chat service serving this turn stopped",
                    "interrupted": True,
                },
            )
            await self.persist()
        if self.conv.pending:
            self._ensure_worker()

    async def enqueue(self, text: str) -> bool:
        """Queue a user message; return True when it waits behind a running turn."""
        busy = self.busy
        self.conv.pending.append(text)
        await self.persist()
        self._ensure_worker()
        return busy

    def _ensure_worker(self) -> None:
        if not self.busy:
            self.worker = asyncio.create_task(self._work(), name=f"turns-{self.conv.id}")

    async def _work(self) -> None:
        while self.conv.pending and not self.lost and not self.svc.closing:
            self.stop.clear()
            text = self.conv.pending[0]
            try:
                await TurnRunner(self, text).run()
            except Exception:
                log.exception("turn failed in %s", self.conv.id)
                if self.conv.pending and self.conv.pending[0] == text:
                    self.conv.pending.pop(0)
                self.conv.turn_open = False
                try:
                    await self.persist()
                except Exception:
                    log.exception("could not persist %s", self.conv.id)
                    await asyncio.sleep(1)
            self.last_access = time.monotonic()

    async def halt(self, timeout: float = 10.0) -> None:
        """Stop the running turn and wait for the worker (queued messages stay queued)."""
        if self.busy:
            self.stop.set()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self.worker), timeout)


class ChatService:
    """The service: owners of conversations, NATS handlers, engine and recall clients.

    Args:
        settings: the service settings.
        broker: a FastStream ``NatsBroker`` (handlers are registered by :meth:`register`).
        store: the Redis store.
        http: the shared ``httpx.AsyncClient`` for the engine.
        toolbox: tools offered to the model (default: ``recall`` and ``recall_search``).
        policy: the compaction seam (default :class:`~loki_chat.compaction.CompactionPolicy`;
            :class:`NoCompaction` never compacts).
    """

    def __init__(
        self,
        settings: Settings,
        broker: Any,
        store: Store,
        http: httpx.AsyncClient,
        toolbox: ToolBox | None = None,
        policy: ContextPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.store = store
        self.instance = store.instance
        self.http = http
        self.engine = EngineClient(http, settings.retry_delays, settings.engine_timeout_s)
        self.toolbox = toolbox or ToolBox(recall_tools(self.request, settings.recall_timeout_s))
        self.policy: ContextPolicy = policy or CompactionPolicy(settings)
        self.actors: dict[str, Actor] = {}
        self._guards: dict[str, asyncio.Lock] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self.closing = False

    # -- NATS plumbing --------------------------------------------------------------------
    def register(self) -> None:
        """Declare the subscribers on the broker (before it starts)."""
        b = self.broker
        q = subjects.QUEUE_CHAT

        @b.subscriber(subjects.CHAT_SEND, queue=q, max_workers=32)
        async def on_send(msg: SendRequest) -> SendReply:
            return await self.guarded(self.send(msg), SendReply)

        @b.subscriber(subjects.CHAT_CONTROL, queue=q, max_workers=16)
        async def on_control(msg: ControlRequest) -> ControlReply:
            return await self.guarded(self.control(msg), ControlReply)

        @b.subscriber(subjects.CHAT_STATE, queue=q, max_workers=16)
        async def on_state(msg: StateRequest) -> StateReply:
            return await self.guarded(self.state(msg), StateReply)

        @b.subscriber(subjects.CHAT_REPLAY, queue=q, max_workers=16)
        async def on_replay(msg: ReplayRequest) -> ReplayReply:
            return await self.guarded(self.replay(msg), ReplayReply)

        @b.subscriber(subjects.CHAT_CONVERSATIONS, queue=q, max_workers=16)
        async def on_conversations(msg: ConversationsRequest) -> ConversationsReply:
            return await self.guarded(self.conversations(msg), ConversationsReply)

        @b.subscriber(subjects.chat_instance(self.instance), max_workers=32)
        async def on_forward(msg: ForwardRequest) -> dict[str, Any]:
            return await self.forwarded(msg)

    async def guarded(self, coro: Awaitable[R], reply_type: type[R]) -> R:
        """Await a handler; turn a ChatError into the reply's ``error``."""
        try:
            return await coro
        except ConversationNotFound as exc:
            return reply_type(error=ErrorInfo(type="not_found", message=str(exc)))
        except NotOwner as exc:
            return reply_type(error=ErrorInfo(type="busy", message=str(exc)))
        except ChatError as exc:
            return reply_type(error=ErrorInfo(type="unavailable", message=str(exc)))
        except Exception as exc:
            log.exception("handler failed")
            return reply_type(error=ErrorInfo(type="internal", message=str(exc)))

    async def request(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float
    ) -> R:
        """NATS request/reply with a typed reply (raises on no responders or timeout)."""
        msg = await self.broker.request(message, subject, timeout=timeout)
        return reply_type.model_validate_json(msg.body)

    async def publish_event(self, event: Any) -> None:
        try:
            await self.broker.publish(event, subjects.chat_events(event.conversation))
        except Exception:  # noqa: BLE001 - the Log keeps it; replay will deliver it
            log.warning("event %s of %s not published", event.seq, event.conversation)

    def publish_perf(self, record: PerfRecord) -> None:
        from loki_shared.perf_publish import publish_record

        self._spawn(publish_record(self.broker, record))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def lease(self, cid: str) -> Lease:
        """A ``main`` lease from the supervisor.

        Raises:
            LeaseError: no answer, an error reply, or no base URL.
        """
        wait = max(1.0, self.settings.lease_timeout_s - 5)
        try:
            lease = await self.request(
                subjects.ENGINE_LEASE,
                LeaseRequest(kind="main", conversation=cid, wait_s=wait),
                Lease,
                self.settings.lease_timeout_s,
            )
        except Exception as exc:
            raise LeaseError(f"no lease from the engine supervisor ({type(exc).__name__})") from exc
        if lease.error is not None:
            raise LeaseError(lease.error.message)
        if not lease.base_url:
            raise LeaseError("lease without base_url")
        return lease

    async def release(self, lease: Lease, usage: dict[str, Any] | None = None) -> None:
        """Give the lease back; ``usage`` (decoded, of a ``main`` completion) tells the
        supervisor ``prompt_tokens`` and ``cached_tokens`` when known."""
        if not lease.lease_id:
            return
        usage = usage or {}
        req = ReleaseRequest(
            lease_id=lease.lease_id,
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=usage.get("cached_tokens"),
        )
        try:
            await self.request(subjects.ENGINE_RELEASE, req, ReleaseReply, 5.0)
        except Exception:  # noqa: BLE001 - the lease expires by itself
            log.warning("lease %s not released", lease.lease_id)

    async def total_slots(self) -> int | None:
        try:
            info = await self.request(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2.0)
        except Exception:  # noqa: BLE001
            return None
        return info.total_slots or None

    def policy_extra(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "http": self.http,
            "settings": self.settings,
            "lease": self.lease,
            "release": self.release,
            "store": self.store,
        }

    # -- ownership ------------------------------------------------------------------------
    async def owned(
        self,
        cid: str,
        op: str,
        payload: BaseModel,
        reply_type: type[R],
        local: Callable[[Actor], Awaitable[R]],
        create: bool = False,
        forwarded: bool = False,
    ) -> R:
        """Run ``local`` in the owner of ``cid``: here (taking the lock if free) or forwarded
        to the instance that holds it. A dead owner's lock is waited out (its expiry).

        Raises:
            ConversationNotFound: no such conversation and ``create`` is false.
            NotOwner: the owner could not be reached before the lock's expiry.
        """
        deadline = time.monotonic() + self.settings.lock_ttl_s + 10
        while True:
            actor = await self._take(cid, create)
            if actor is not None:
                actor.last_access = time.monotonic()
                return await local(actor)
            if forwarded:
                raise NotOwner(f"{self.instance} does not own {cid}")
            owner = await self.store.owner(cid)
            if owner and owner != self.instance:
                try:
                    msg = await self.broker.request(
                        ForwardRequest(op=op, payload=payload.model_dump()),
                        subjects.chat_instance(owner),
                        timeout=5.0,
                    )
                    reply = reply_type.model_validate_json(msg.body)
                    if not (
                        isinstance(reply, Reply)
                        and reply.error is not None
                        and reply.error.type == "busy"
                    ):
                        return reply
                except Exception:  # noqa: BLE001 - owner dead or slow: wait for the lock
                    log.info("owner %s of %s does not answer; waiting for its lock", owner, cid)
            if time.monotonic() > deadline:
                raise NotOwner(
                    f"conversation {cid} is owned by an instance that does not answer", owner
                )
            await asyncio.sleep(0.25)

    async def _take(self, cid: str, create: bool) -> Actor | None:
        actor = self.actors.get(cid)
        if actor is not None and not actor.lost:
            return actor
        guard = self._guards.setdefault(cid, asyncio.Lock())
        async with guard:
            actor = self.actors.get(cid)
            if actor is not None and not actor.lost:
                return actor
            value = await self.store.try_acquire(cid)
            if value is None:
                return None
            try:
                conv = await self.store.load(cid)
                if conv is None:
                    if not create:
                        raise ConversationNotFound(f"no conversation {cid}")
                    conv = Conversation(id=cid)
                    await self.store.save(conv, value)
            except BaseException:
                await self.store.release(cid, value)
                raise
            if conv.turn_open:
                # a previous owner died mid-turn: it may have published seqs it never
                # persisted; continue after them so no seq is ever reused
                conv.seq = max(conv.seq, await self.store.reserved_seq(cid))
            actor = Actor(self, conv, value)
            self.actors[cid] = actor
            log.info("instance %s owns %s", self.instance, cid)
            await actor.recover()
            return actor

    async def forwarded(self, msg: ForwardRequest) -> dict[str, Any]:
        """Serve a request another instance forwarded to this owner."""
        ops: dict[str, tuple[type[BaseModel], Callable[..., Awaitable[Any]], type[Reply]]] = {
            "send": (SendRequest, self.send, SendReply),
            "control": (ControlRequest, self.control, ControlReply),
            "state": (StateRequest, self.state, StateReply),
            "replay": (ReplayRequest, self.replay, ReplayReply),
            "conversations": (ConversationsRequest, self.conversations, ConversationsReply),
        }
        if msg.op not in ops:
            return Reply(error=ErrorInfo(type="invalid_request", message=msg.op)).model_dump()
        req_type, fn, reply_type = ops[msg.op]
        reply = await self.guarded(
            fn(req_type.model_validate(msg.payload), forwarded=True), reply_type
        )
        return reply.model_dump()

    async def _read(self, cid: str) -> tuple[Actor | None, Conversation]:
        """The conversation for a read: the local owner's, else the stored blob (taking the
        conversation over when a dead owner left a turn or a queue to finish).

        Raises:
            ConversationNotFound: absent.
        """
        actor = self.actors.get(cid)
        if actor is not None and not actor.lost:
            return actor, actor.conv
        conv = await self.store.load(cid)
        if conv is None:
            raise ConversationNotFound(f"no conversation {cid}")
        return None, conv

    # -- handlers -------------------------------------------------------------------------
    async def send(self, req: SendRequest, forwarded: bool = False) -> SendReply:
        """Start a turn, or queue it behind the running one (never refused)."""
        cid = req.conversation or new_conversation_id()
        subjects.chat_events(cid)  # validates the id

        async def local(actor: Actor) -> SendReply:
            queued = await actor.enqueue(req.content)
            return SendReply(conversation=cid, queued=queued)

        return await self.owned(
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
        ``compact`` it through the compaction policy."""

        async def local(actor: Actor) -> ControlReply:
            if req.action == "stop":
                was = actor.busy
                actor.stop.set()
                return ControlReply(ok=True, detail="stopping" if was else "idle")
            if req.action == "reset":
                actor.conv.pending.clear()
                await actor.halt()
                actor.conv.messages.clear()
                actor.conv.log.clear()
                actor.conv.meter.invalidate()
                actor.conv.turn_open = False
                await actor.emit({}, loki={"event": "reset"})
                await actor.persist()
                return ControlReply(ok=True, detail="reset")
            if actor.busy:
                return ControlReply(ok=False, detail="a turn is running")
            conv = actor.conv
            view = ContextView(
                conversation=conv,
                trigger="manual",
                n_ctx=conv.meter.n_ctx or 0,
                ctx_used=conv.meter.used(self.settings.system_prompt, conv.messages),
                emit=lambda delta, meta: actor.emit(delta, loki=meta),
                extra=self.policy_extra(),
            )
            changed = await self.policy.maybe_compact(view)
            if changed:
                await actor.persist()
            return ControlReply(
                ok=bool(changed), detail="compacted" if changed else "nothing compacted"
            )

        return await self.owned(
            req.conversation, "control", req, ControlReply, local, forwarded=forwarded
        )

    async def state(self, req: StateRequest, forwarded: bool = False) -> StateReply:
        """Model-view messages (system first), ``ctx_used``, and the turn's status."""
        actor, conv = await self._read(req.conversation)
        if actor is None and (conv.turn_open or conv.pending):
            return await self.owned(
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
            last_seq=conv.seq,
        )

    async def replay(self, req: ReplayRequest, forwarded: bool = False) -> ReplayReply:
        """Display events after ``after_seq`` (the owner's in-memory Log when owned here)."""
        actor, conv = await self._read(req.conversation)
        if actor is None:
            owner = await self.store.owner(req.conversation)
            if owner and owner != self.instance and not forwarded:
                return await self.owned(
                    req.conversation,
                    "replay",
                    req,
                    ReplayReply,
                    lambda a: self._replay_of(a.conv, req),
                )
            if conv.turn_open or conv.pending:
                return await self.owned(
                    req.conversation,
                    "replay",
                    req,
                    ReplayReply,
                    lambda a: self._replay_of(a.conv, req),
                    forwarded=forwarded,
                )
        return await self._replay_of(conv, req)

    async def _replay_of(self, conv: Conversation, req: ReplayRequest) -> ReplayReply:
        """Events after ``after_seq``, at most ``limit``, and at most about
        :data:`REPLAY_MAX_BYTES` of JSON (NATS caps a message at 1 MiB by default): ``more``
        tells the caller to ask again from the last seq it got."""
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

    async def conversations(
        self, req: ConversationsRequest, forwarded: bool = False
    ) -> ConversationsReply:
        """``list`` (newest first), ``create``, ``rename``, ``delete`` (the stored blob is
        removed), ``export`` (messages and log)."""
        if req.action == "list":
            infos = await self.store.list_infos()
            return ConversationsReply(conversations=[ConversationInfo(**i) for i in infos])
        if req.action == "create":
            cid = new_conversation_id()

            async def created(actor: Actor) -> ConversationsReply:
                if req.title:
                    actor.conv.title = req.title
                    await actor.persist()
                return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))

            return await self.owned(
                cid,
                "conversations",
                req,
                ConversationsReply,
                created,
                create=True,
                forwarded=forwarded,
            )
        if not req.conversation:
            raise ChatError("conversation id required")
        cid = req.conversation
        if req.action == "export":
            _, conv = await self._read(cid)
            return ConversationsReply(
                conversation=ConversationInfo(**conv.info()),
                export={
                    "id": conv.id,
                    "title": conv.title,
                    "created": conv.created,
                    "system": self.settings.system_prompt,
                    "messages": [m.model_dump(exclude_none=True) for m in conv.messages],
                    "log": [e.model_dump(exclude_none=True) for e in conv.log],
                },
            )

        async def local(actor: Actor) -> ConversationsReply:
            if req.action == "rename":
                actor.conv.title = req.title or ""
                await actor.persist()
                return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))
            actor.conv.pending.clear()
            await actor.halt()
            await self.store.delete(cid, actor.lock_value)
            actor.lost = True
            self.actors.pop(cid, None)
            return ConversationsReply(conversation=ConversationInfo(**actor.conv.info()))

        return await self.owned(
            cid, "conversations", req, ConversationsReply, local, forwarded=forwarded
        )

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """After ``broker.start()``: make sure the server has our subscriptions (so a
        request sent right after gets an answer), then start the lock keeper (renews owned
        locks; releases idle conversations)."""
        state = getattr(getattr(self.broker, "config", None), "connection_state", None)
        if state is not None:
            with contextlib.suppress(Exception):
                await state.connection.flush(timeout=5)
        self._keeper = asyncio.create_task(self._keep_locks())

    async def _keep_locks(self) -> None:
        period = self.settings.lock_ttl_s / 3
        while True:
            await asyncio.sleep(period)
            for cid, actor in list(self.actors.items()):
                try:
                    if not await self.store.renew(cid, actor.lock_value):
                        log.error("lost the lock of %s", cid)
                        actor.lost = True
                        actor.stop.set()
                        self.actors.pop(cid, None)
                        continue
                    idle = time.monotonic() - actor.last_access
                    if (
                        not actor.busy
                        and not actor.conv.pending
                        and idle > self.settings.idle_release_s
                    ):
                        self.actors.pop(cid, None)
                        actor.lost = True
                        await self.store.release(cid, actor.lock_value)
                except Exception:
                    log.warning("lock keeping of %s failed", cid, exc_info=True)

    async def close(self) -> None:
        """Stop every turn (partial replies kept and persisted), release the locks."""
        self.closing = True
        if self._keeper:
            self._keeper.cancel()
        actors = list(self.actors.items())
        await asyncio.gather(*(a.halt() for _, a in actors), return_exceptions=True)
        for cid, actor in actors:
            with contextlib.suppress(Exception):
                await self.store.release(cid, actor.lock_value)
        self.actors.clear()
        if self._bg:
            await asyncio.wait(self._bg, timeout=3)


def instance_id(settings: Settings) -> str:
    """This instance's id (``LOKI_INSTANCE_ID`` or random; a valid subject token)."""
    return settings.instance_id or uuid.uuid4().hex[:12]
