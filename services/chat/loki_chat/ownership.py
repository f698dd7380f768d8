"""Which conversations this chat instance owns, and forwarding to the owner of the others.

A conversation is served by one instance at a time, the holder of its Redis lock
(:mod:`.store`). A request landing on another instance is forwarded to the owner on
``loki.chat.instance.<owner>``; when the owner is gone (killed), the lock expires and the next
request takes it over, loads the last persisted blob and goes on. All state changes of a
conversation happen in its owner, and every write is fenced by the lock's token.

The lock keeper renews the locks this instance holds every third of ``LOKI_LOCK_TTL_S`` and
releases a conversation idle for ``LOKI_IDLE_RELEASE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from loki_shared import subjects
from loki_shared.messages.base import Reply
from loki_shared.messages.chat import ConversationKind, ForwardRequest

from .actor import Actor, Shared
from .conversation import Conversation
from .errors import ConversationNotFound, NotOwner

log = logging.getLogger("loki.chat.service")

R = TypeVar("R", bound=BaseModel)


class Ownership:
    """The actors of the conversations this instance owns.

    Args:
        shared: the instance's shared parts (its store knows this instance's id).
    """

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store = shared.store
        self.instance = shared.store.instance
        self.actors: dict[str, Actor] = {}
        self._guards: dict[str, asyncio.Lock] = {}
        self._keeper: asyncio.Task[None] | None = None

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
        to the instance that holds it (``op`` and ``payload`` make the
        :class:`~loki_shared.messages.chat.ForwardRequest`). A dead owner's lock is waited
        out (its expiry).

        Raises:
            ConversationNotFound: no such conversation and ``create`` is false.
            NotOwner: the owner could not be reached before the lock's expiry, or this
                request was already forwarded here and this instance does not own ``cid``.
        """
        deadline = time.monotonic() + self.shared.settings.lock_ttl_s + 10
        while True:
            actor = await self.take(cid, create)
            if actor is not None:
                actor.last_access = time.monotonic()
                return await local(actor)
            if forwarded:
                raise NotOwner(f"{self.instance} does not own {cid}")
            owner = await self.store.owner(cid)
            if owner and owner != self.instance:
                try:
                    reply = await self.shared.bus.request(
                        subjects.chat_instance(owner),
                        ForwardRequest(op=op, payload=payload.model_dump()),
                        reply_type,
                        5.0,
                    )
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

    async def take(self, cid: str, create: bool, kind: ConversationKind = "main") -> Actor | None:
        """The local actor of ``cid``, taking the lock (and loading the blob) when it is
        free; None when another instance holds it. A conversation created here is of
        ``kind`` from its first write (a task run's never shows in the person's list).

        Raises:
            ConversationNotFound: no stored conversation and ``create`` is false.
        """
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
                    project = await self.shared.project.project_for_new()
                    conv = Conversation(id=cid, project=project, kind=kind)
                    await self.store.save(conv, value)
                elif conv.persisted.legacy:  # a version-1 blob: rewritten in today's layout
                    await self.store.save(conv, value)
            except BaseException:  # the lock released whatever ends the load, then re-raised
                await self.store.release(cid, value)
                raise
            if conv.turn_open:
                # a previous owner died mid-turn: it may have published seqs it never
                # persisted; continue after them so no seq is ever reused
                conv.seq = max(conv.seq, await self.store.reserved_seq(cid))
            actor = Actor(self.shared, conv, value)
            self.actors[cid] = actor
            log.info("instance %s owns %s", self.instance, cid)
            await actor.recover()
            return actor

    def local(self, cid: str) -> Actor | None:
        """The actor of ``cid`` when this instance owns it (None: it does not)."""
        actor = self.actors.get(cid)
        return actor if actor is not None and not actor.lost else None

    async def read(
        self, cid: str, log_after: int | None = None
    ) -> tuple[Actor | None, Conversation]:
        """The conversation for a read: the local owner's, else the stored blob (with only
        the display log after ``log_after`` when given: :meth:`Store.load`; read-only).

        Raises:
            ConversationNotFound: absent.
        """
        actor = self.local(cid)
        if actor is not None:
            return actor, actor.conv
        conv = await self.store.load(cid, log_after)
        if conv is None:
            raise ConversationNotFound(f"no conversation {cid}")
        return None, conv

    async def delete(self, actor: Actor) -> None:
        """Delete the stored conversation of ``actor`` and forget it (its queue is
        dropped and its running turn stopped first)."""
        actor.conv.pending.clear()
        await actor.halt()
        await self.store.delete(actor.conv.id, actor.lock_value)
        if self.shared.shelf is not None:
            await self.shared.shelf.drop(actor.conv.id)
        actor.lost = True
        self.actors.pop(actor.conv.id, None)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the lock keeper (renews owned locks; releases idle conversations)."""
        self._keeper = asyncio.create_task(self._keep_locks())

    async def _keep_locks(self) -> None:
        period = self.shared.settings.lock_ttl_s / 3
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
                        and idle > self.shared.settings.idle_release_s
                    ):
                        self.actors.pop(cid, None)
                        actor.lost = True
                        await self.store.release(cid, actor.lock_value)
                except Exception:  # one conversation's failure never stops the keeper's loop
                    log.warning("lock keeping of %s failed", cid, exc_info=True)

    async def close(self) -> None:
        """Stop every turn (partial replies kept and persisted), release the locks."""
        if self._keeper:
            self._keeper.cancel()
        actors = list(self.actors.items())
        await asyncio.gather(*(a.halt() for _, a in actors), return_exceptions=True)
        for cid, actor in actors:
            # Redis away: the lock expires by itself; the other conversations are released
            with contextlib.suppress(Exception):
                await self.store.release(cid, actor.lock_value)
        self.actors.clear()
