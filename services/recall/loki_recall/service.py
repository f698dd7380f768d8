"""The recall service: NATS handlers (FastStream) over an :class:`~loki_recall.archive.Archive`.

Subjects served (queue group ``recall``): ``loki.recall.archive``, ``loki.recall.tool``,
``loki.recall.block``, ``loki.recall.blocks``, ``loki.recall.purge``. Subscribed by every instance:
``loki.memory.key`` (the gateway hands over or withdraws the memory key). At start the
service reads the whole archive from Redis (building the search index) *before* it subscribes,
so it never answers from a partial index, then asks ``loki.memory.status`` for the key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis

from loki_shared import lifecycle, subjects
from loki_shared.memkey import MemoryKeyFollower
from loki_shared.messages.events import ArchiveEvent
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    BlockReply,
    BlockRequest,
    BlocksReply,
    BlocksRequest,
    PurgeReply,
    PurgeRequest,
    ToolReply,
    ToolRequest,
)
from loki_shared.nats import make_broker, stop_broker, until_routable
from loki_shared.sealing import service_sealer

from . import tools
from .archive import Archive, ScopedReader
from .errors import BadRequest, StoreUnavailable, UnknownTool
from .settings import Settings

log = logging.getLogger("loki.recall")


M = TypeVar("M", bound=BaseModel)


def _decode(model: type[M], body: bytes) -> M:
    """``body`` as ``model``.

    Raises:
        BadRequest: not valid JSON for ``model``.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BadRequest(f"invalid {model.__name__}: {exc.errors()[:1]}") from exc


class RecallService:
    """One recall service instance.

    Use ``await start()`` then ``await stop()``; :attr:`archive` is the archive it serves.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.secret_key.get_secret_value() if settings.secret_key else None
        self.redis = Redis.from_url(settings.redis_url, **settings.redis_options())
        snapshot = settings.home / "recall-index.snap" if settings.recall_snapshot else None
        self.archive = Archive(self.redis, service_sealer(settings.home, secret), snapshot)
        self.broker: NatsBroker = make_broker(
            settings.nats_url, "recall", login=settings.nats_options()
        )
        self.keys = MemoryKeyFollower(self.broker, self.redis, self.archive.set_memory_key, log)
        self.keys.subscribe()
        self._poller: asyncio.Task[None] | None = None
        self._register()

    # --- handlers --------------------------------------------------------------------------
    def _register(self) -> None:
        """Subscribe the handlers. Requests are decoded here from the raw body with pydantic
        (exact big integers; a malformed request gets an ``invalid_request`` reply rather
        than silence). What a handler raises is answered by the broker's exception
        middleware (:func:`loki_shared.errors.exception_middleware`)."""
        broker, archive = self.broker, self.archive
        workers = self.settings.recall_workers
        q = subjects.QUEUE_RECALL

        @broker.subscriber(subjects.RECALL_ARCHIVE, queue=q, max_workers=workers)
        async def on_archive(msg: NatsMessage) -> ArchiveReply:
            block = await archive.archive(_decode(ArchiveRequest, msg.body))
            try:
                await broker.publish(
                    ArchiveEvent(
                        id=block.id,
                        seq=block.seq,
                        conversation=block.conversation,
                        ts=block.created,
                    ),
                    subjects.EVENTS_ARCHIVE,
                )
            except Exception as exc:  # noqa: BLE001 - audit is best effort
                log.warning("archive event not published: %s", exc)
            return ArchiveReply(id=block.id, seq=block.seq)

        @broker.subscriber(subjects.RECALL_TOOL, queue=q, max_workers=workers)
        async def on_tool(msg: NatsMessage) -> ToolReply:
            req = _decode(ToolRequest, msg.body)
            reader: tools.Reader = archive
            if req.scope is not None:
                reader = ScopedReader(archive, req.scope.project)
            if req.name == tools.RECALL:
                text = await tools.recall(req.arguments, reader)
            elif req.name == tools.RECALL_SEARCH:
                text = await tools.recall_search(req.arguments, reader)
            else:
                raise UnknownTool(f"unknown tool {req.name!r}")
            return ToolReply(text=text)

        @broker.subscriber(subjects.RECALL_BLOCK, queue=q, max_workers=workers)
        async def on_block(msg: NatsMessage) -> BlockReply:
            req = _decode(BlockRequest, msg.body)
            return BlockReply(block=await archive.get(req.seq))

        @broker.subscriber(subjects.RECALL_BLOCKS, queue=q, max_workers=workers)
        async def on_blocks(msg: NatsMessage) -> BlocksReply:
            req = _decode(BlocksRequest, msg.body)
            blocks, next_after = await archive.page(
                req.after, max(req.max_bytes, 1), req.conversation, req.project
            )
            return BlocksReply(blocks=blocks, next_after=next_after)

        @broker.subscriber(subjects.RECALL_PURGE, queue=q, max_workers=workers)
        async def on_purge(msg: NatsMessage) -> PurgeReply:
            req = _decode(PurgeRequest, msg.body)
            if (req.conversation is None) == (req.project is None):
                raise BadRequest("name exactly one of conversation, project")
            seqs = await archive.purge(req.conversation, req.project)
            return PurgeReply(seqs=seqs)

    # --- catch-up ------------------------------------------------------------------------
    async def _catch_up(self) -> None:
        """After each memory-state question (every ``LOKI_RECALL_MEMORY_POLL_S``): catch up
        with the archive (deletions recorded while no instance answered are applied there)."""
        try:
            await self.archive.sync()
        except StoreUnavailable as exc:
            log.warning("archive catch-up failed: %s", exc)

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the archive, then serve.

        Waits (retrying every second) while Redis does not answer.
        """
        t0 = time.monotonic()
        while True:
            try:
                await self.archive.load()
                break
            except StoreUnavailable as exc:  # Redis not up yet: wait for it
                log.warning("archive not loaded (%s); retrying", exc)
                await asyncio.sleep(1.0)
        stats = self.archive.stats()
        log.info(
            "archive loaded: %d blocks, %d words, %.1f s",
            stats["blocks"],
            stats["vocabulary"],
            time.monotonic() - t0,
        )
        await self.broker.start()
        probe = BlockRequest(seq=0).model_dump_json().encode()
        await until_routable(self.broker.connection, subjects.RECALL_BLOCK, probe, log)
        self._poller = asyncio.create_task(
            self.keys.follow(self.settings.recall_memory_poll_s, then=self._catch_up)
        )
        log.info("recall service serving")

    async def stop(self, steps: lifecycle.Steps | None = None) -> None:
        """Stop serving, each step bounded by ``steps`` (default: a budget of
        ``LOKI_STOP_TIMEOUT_S``): the NATS subscribers (requests running get the time left),
        the index snapshot (local disk), Redis."""
        steps = steps or lifecycle.Steps(self.settings.stop_timeout_s, log)
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        await stop_broker(self.broker, steps, steps.left() * 0.5)
        await steps.run("save the index snapshot", self.archive.close)
        await steps.run("close Redis", self.redis.aclose, 1.0)
