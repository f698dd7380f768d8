"""The SSE machinery behind ``GET /api/chat``: replay, then live, with no gap and nothing twice.

The gateway's outgoing event hub: it fans a conversation's chat events out to every browser
watching it (not to be confused with :mod:`loki_shared.sse`, the decoder of incoming
llama-server / OpenAI streams).

How one client's stream is built (see :func:`conversation_stream`):

1. the client's feed is attached to the conversation's live subscription
   (``loki.chat.events.<id>``) and the SUB is flushed to the NATS server **before** anything
   else, so no event published from then on can be missed;
2. the display log is replayed from ``after_seq`` (the ``Last-Event-ID``, or 0) through
   ``loki.chat.replay``, page by page (``limit`` events per request); a long replay (more
   than ``LOKI_SSE_COALESCE_MIN`` events) is coalesced (consecutive text deltas of the same
   key merged into one event carrying the last seq), a short one is sent as logged;
3. live events follow; an event whose seq is not above the last one sent is dropped (it came
   with the replay); an event that would leave a hole (seq > last + 1, e.g. NATS dropped one)
   triggers a replay from the last seq sent first;
4. after the gateway's NATS connection comes back (NATS restarted, or the link broke), every
   open stream replays from the last seq it sent (:meth:`EventHub.resync`): events published
   while the connection was away never arrive live, and a turn's last events (its end) would
   otherwise wait for a next event that may never come.

Live events are written in batches of at most :data:`BATCH_MAX_EVENTS` events or
:data:`BATCH_MAX_BYTES` bytes per write. Each client has a bounded buffer
(``LOKI_SSE_CLIENT_BUFFER`` events): the NATS callback never waits for a client, and a client
whose buffer fills is sent ``event: reconnect`` (data ``{"last_seq": n}``) and closed; it
resumes by replay with ``Last-Event-ID``. A slow client therefore never slows the turn or the
other clients.

Every event frame is ``id: <seq>\\ndata: <json>\\n\\n`` with the data of
:meth:`loki_shared.messages.chat.ChatEvent.sse_data`; it is encoded once per event, whatever
the number of clients.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import anyio
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from loki_shared import subjects
from loki_shared.chat_log import coalesce
from loki_shared.errors import LokiError
from loki_shared.messages.chat import ChatEvent, ReplayReply, ReplayRequest

from .bus import READ_PATIENCE_S, Bus

log = logging.getLogger("loki.gateway.sse")

BATCH_MAX_EVENTS = 256
BATCH_MAX_BYTES = 128 * 1024


def encode_event(event: ChatEvent) -> bytes:
    """The SSE frame of one event: ``id: <seq>``, then one ``data:`` line of compact JSON
    (non-ASCII kept as UTF-8; JSON never holds a raw newline, so one line is enough)."""
    data = json.dumps(event.sse_data(), ensure_ascii=False, separators=(",", ":"))
    return f"id: {event.seq}\ndata: {data}\n\n".encode()


@dataclass
class LiveItem:
    """One live event as received: its seq and its encoded frame."""

    seq: int
    frame: bytes


@dataclass(eq=False)
class ClientFeed:
    """The bounded buffer of one SSE client. ``push`` never blocks: when ``limit`` items are
    already waiting, the feed is marked ``overflowed`` and stops taking items."""

    conversation: str
    limit: int
    items: deque[LiveItem] = field(default_factory=deque)
    overflowed: bool = False
    closing: str | None = None  # why the stream must end now (server shutting down)
    resync: bool = False  # events may have been missed live: replay before going on
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def close(self, reason: str) -> None:
        """End the stream at the next :meth:`take` (the client is told to reconnect)."""
        self.closing = reason
        self.wakeup.set()

    def mark_resync(self) -> None:
        """Ask the stream to replay from its last seq at the next :meth:`take` (the live
        subscription may have missed events)."""
        self.resync = True
        self.wakeup.set()

    def push(self, item: LiveItem) -> None:
        if self.overflowed:
            return
        if len(self.items) >= self.limit:
            self.overflowed = True
            self.items.clear()
        else:
            self.items.append(item)
        self.wakeup.set()

    async def take(self, max_events: int, max_bytes: int) -> list[LiveItem]:
        """Wait until something is buffered, then return up to ``max_events`` items whose
        frames total at most ``max_bytes`` (always at least one item). Returns [] once the
        feed has overflowed or is closing, and possibly [] when :attr:`resync` is set (the
        caller replays, clears it, and takes again)."""
        while not self.items and not self.overflowed and not self.closing and not self.resync:
            self.wakeup.clear()
            await self.wakeup.wait()
        if self.overflowed or self.closing:
            return []
        out: list[LiveItem] = []
        size = 0
        while self.items and len(out) < max_events:
            nxt = len(self.items[0].frame)
            if out and size + nxt > max_bytes:
                break
            out.append(self.items.popleft())
            size += nxt
        return out


class EventHub:
    """One NATS subscription per watched conversation, fanned out to its clients' feeds.

    ``attach`` returns only once the server has the subscription (``flush``), so a replay
    asked afterwards cannot miss an event. The subscription is dropped with the last client.
    """

    def __init__(self, client: Client, buffer: int) -> None:
        self.client = client
        self.buffer = buffer
        self._feeds: dict[str, set[ClientFeed]] = {}
        self._subs: dict[str, Subscription] = {}
        self._lock = asyncio.Lock()

    async def resync(self) -> None:
        """After a reconnection to NATS: make sure the server has the subscriptions again
        (``flush``), then mark every client's feed to replay from its last seq (see
        :meth:`ClientFeed.mark_resync`)."""
        try:
            await self.client.flush(timeout=5)
        except Exception:  # noqa: BLE001 - lost again: the next reconnection resyncs
            log.warning("NATS flush after reconnection failed")
        async with self._lock:
            feeds = [feed for group in self._feeds.values() for feed in group]
        for feed in feeds:
            feed.mark_resync()
        if feeds:
            log.info("NATS reconnected: %d SSE stream(s) replay what they missed", len(feeds))

    def clients(self, conversation: str) -> int:
        """Number of SSE clients attached to ``conversation``."""
        return len(self._feeds.get(conversation, ()))

    async def attach(self, conversation: str) -> ClientFeed:
        """Register a new client of ``conversation`` (subscribing if it is the first).

        Raises:
            ValueError: ``conversation`` is not a valid subject token.
        """
        subject = subjects.chat_events(conversation)
        feed = ClientFeed(conversation, self.buffer)
        async with self._lock:
            feeds = self._feeds.setdefault(conversation, set())
            feeds.add(feed)
            if conversation not in self._subs:
                self._subs[conversation] = await self.client.subscribe(
                    subject, cb=self._on_message, pending_msgs_limit=1_000_000
                )
                await self.client.flush(timeout=5)
        return feed

    async def detach(self, feed: ClientFeed) -> None:
        """Forget ``feed``; unsubscribe when it was the conversation's last client.

        Shielded: it runs in the cleanup of a disconnected client's cancelled task, and a
        half-done detach would leave the subscription behind.
        """
        with anyio.CancelScope(shield=True):
            async with self._lock:
                feeds = self._feeds.get(feed.conversation)
                if feeds is None:
                    return
                feeds.discard(feed)
                if feeds:
                    return
                del self._feeds[feed.conversation]
                sub = self._subs.pop(feed.conversation, None)
                if sub is not None:
                    try:
                        await sub.unsubscribe()
                    except Exception:  # noqa: BLE001 - connection closing: nothing to undo
                        pass

    async def _on_message(self, msg: NatsMsg) -> None:
        try:
            event = ChatEvent.model_validate_json(msg.data)
        except ValidationError:
            log.warning("dropping a malformed event on %s", msg.subject)
            return
        conversation = msg.subject[len(subjects.CHAT_EVENTS_PREFIX) + 1 :]
        feeds = self._feeds.get(conversation)
        if not feeds:
            return
        item = LiveItem(event.seq, encode_event(event))
        for feed in list(feeds):
            feed.push(item)


async def replay_page(bus: Bus, conversation: str, after_seq: int, limit: int) -> ReplayReply:
    """One ``loki.chat.replay`` page (events with seq > ``after_seq``).

    Raises:
        ServiceUnavailable, UpstreamError, ServiceError: see :meth:`Bus.request_ok`.
    """
    return await bus.request_ok(
        subjects.CHAT_REPLAY,
        ReplayRequest(conversation=conversation, after_seq=after_seq, limit=limit),
        ReplayReply,
        timeout=10.0,
        patience_s=READ_PATIENCE_S,
    )


async def history_page(
    bus: Bus, conversation: str, turns: int, before_seq: int | None
) -> ReplayReply:
    """The last ``turns`` turns of the display log before ``before_seq`` (None: the end),
    coalesced (``loki.chat.replay`` with ``turns``).

    Raises:
        ServiceUnavailable, UpstreamError, ServiceError: see :meth:`Bus.request_ok`.
    """
    reply = await bus.request_ok(
        subjects.CHAT_REPLAY,
        ReplayRequest(conversation=conversation, turns=turns, before_seq=before_seq),
        ReplayReply,
        timeout=10.0,
        patience_s=READ_PATIENCE_S,
    )
    reply.events = coalesce(reply.events)
    return reply


def frames_in_batches(events: list[ChatEvent]) -> list[bytes]:
    """Encode ``events`` and group the frames into writes of at most
    :data:`BATCH_MAX_EVENTS` events / :data:`BATCH_MAX_BYTES` bytes."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for event in events:
        frame = encode_event(event)
        if current and (len(current) >= BATCH_MAX_EVENTS or size + len(frame) > BATCH_MAX_BYTES):
            chunks.append(b"".join(current))
            current, size = [], 0
        current.append(frame)
        size += len(frame)
    if current:
        chunks.append(b"".join(current))
    return chunks


@dataclass
class StreamState:
    """The seq of the last event this client has been sent."""

    last_seq: int


async def _replay_from(
    bus: Bus,
    conversation: str,
    state: StreamState,
    page: int,
    first: ReplayReply | None = None,
    coalesce_min: int = 0,
) -> AsyncIterator[bytes]:
    """Replay the log after ``state.last_seq`` page by page. A long replay (more than
    ``coalesce_min`` events to send, from the first page's ``last_seq``) is coalesced; a
    short one is sent event by event, exactly as logged."""
    reply = first
    merge: bool | None = None
    while True:
        if reply is None:
            reply = await replay_page(bus, conversation, state.last_seq, page)
        if merge is None:
            merge = reply.last_seq - state.last_seq > coalesce_min
        events = [e for e in reply.events if e.seq > state.last_seq]
        if events:
            for chunk in frames_in_batches(coalesce(events) if merge else events):
                yield chunk
            state.last_seq = events[-1].seq
        if not reply.more or not events:
            return
        reply = None


#: Tries of the replay after a reconnection (the chat service may reconnect a moment later
#: than the gateway), :data:`RESYNC_PAUSE_S` apart; then the stream ends with ``reconnect``.
RESYNC_TRIES = 20
RESYNC_PAUSE_S = 0.5


async def _resync(
    bus: Bus, feed: ClientFeed, state: StreamState, page: int, coalesce_min: int
) -> AsyncIterator[bytes]:
    """The replay after a reconnection to NATS, tried again while the chat service does not
    answer yet (:data:`RESYNC_TRIES`); past that the feed is closed, so the client is told to
    reconnect and resumes with ``Last-Event-ID``."""
    for attempt in range(RESYNC_TRIES):
        try:
            async for chunk in _replay_from(
                bus, feed.conversation, state, page, coalesce_min=coalesce_min
            ):
                yield chunk
            return
        except LokiError as exc:
            log.info("replay after reconnection (%s, try %d): %s", feed.conversation, attempt, exc)
            await asyncio.sleep(RESYNC_PAUSE_S)
    feed.close("the event bus was away")


async def conversation_stream(
    bus: Bus,
    hub: EventHub,
    feed: ClientFeed,
    first_page: ReplayReply,
    after_seq: int,
    page: int,
    coalesce_min: int = 0,
) -> AsyncGenerator[bytes, None]:
    """The byte chunks of one client's SSE stream (see the module docstring).

    ``feed`` must have been attached before ``first_page`` was asked; the feed is detached
    when the stream ends or the client goes away.
    """
    state = StreamState(after_seq)
    try:
        yield b"retry: 2000\n\n"
        if first_page.older and first_page.events:
            # a tail page: where the older history begins (GET /api/chat/history)
            data = json.dumps({"before": first_page.events[0].seq})
            yield f"event: history\ndata: {data}\n\n".encode()
        async for chunk in _replay_from(
            bus, feed.conversation, state, page, first_page, coalesce_min
        ):
            yield chunk
        while True:
            items = await feed.take(BATCH_MAX_EVENTS, BATCH_MAX_BYTES)
            if feed.resync and not (feed.overflowed or feed.closing):
                # NATS came back: what was published meanwhile is only in the log
                feed.resync = False
                async for chunk in _resync(bus, feed, state, page, coalesce_min):
                    yield chunk
                if not items:
                    continue
            if not items:  # overflowed (too far behind) or the server is stopping
                reason = feed.closing or "too far behind"
                log.info(
                    "SSE client of %s at seq %d told to reconnect: %s",
                    feed.conversation,
                    state.last_seq,
                    reason,
                )
                data = json.dumps({"last_seq": state.last_seq, "reason": reason})
                yield f"event: reconnect\ndata: {data}\n\n".encode()
                return
            batch: list[bytes] = []
            for item in items:
                if item.seq <= state.last_seq:
                    continue
                if item.seq > state.last_seq + 1:
                    # A hole: fill it from the log before going on.
                    if batch:
                        yield b"".join(batch)
                        batch = []
                    async for chunk in _replay_from(
                        bus, feed.conversation, state, page, coalesce_min=coalesce_min
                    ):
                        yield chunk
                    if item.seq <= state.last_seq:
                        continue
                batch.append(item.frame)
                state.last_seq = item.seq
            if batch:
                yield b"".join(batch)
    finally:
        await hub.detach(feed)
