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

from faststream.nats import NatsBroker

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
from loki_shared.redis_client import redis_client
from loki_shared.sealing import service_sealer
from loki_shared.serve import serve

from . import tools
from .archive import Archive, ScopedReader
from .errors import BadRequest, StoreUnavailable, UnknownTool
from .settings import Settings

log = logging.getLogger("loki.recall")


class RecallService:
    """One recall service instance.

    Use ``await start()`` then ``await stop()``; :attr:`archive` is the archive it serves.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.secret_key.get_secret_value() if settings.secret_key else None
        self.redis = redis_client(settings)
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
        """Answer the recall subjects with :func:`loki_shared.serve.serve` (queue group
        ``recall``, ``LOKI_RECALL_WORKERS`` at once each): a malformed request gets an
        ``invalid_request`` reply, what a handler raises is answered by the broker's
        exception middleware (:func:`loki_shared.errors.exception_middleware`)."""
        broker, q, workers = self.broker, subjects.QUEUE_RECALL, self.settings.recall_workers
        serve(broker, subjects.RECALL_ARCHIVE, self._on_archive, queue=q, max_workers=workers)
        serve(broker, subjects.RECALL_TOOL, self._on_tool, queue=q, max_workers=workers)
        serve(broker, subjects.RECALL_BLOCK, self._on_block, queue=q, max_workers=workers)
        serve(broker, subjects.RECALL_BLOCKS, self._on_blocks, queue=q, max_workers=workers)
        serve(broker, subjects.RECALL_PURGE, self._on_purge, queue=q, max_workers=workers)

    async def _on_archive(self, req: ArchiveRequest) -> ArchiveReply:
        block = await self.archive.archive(req)
        try:
            await self.broker.publish(
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

    async def _on_tool(self, req: ToolRequest) -> ToolReply:
        reader: tools.Reader = self.archive
        if req.scope is not None:
            reader = ScopedReader(self.archive, req.scope.project)
        if req.name == tools.RECALL:
            text = await tools.recall(req.arguments, reader)
        elif req.name == tools.RECALL_SEARCH:
            text = await tools.recall_search(req.arguments, reader)
        else:
            raise UnknownTool(f"unknown tool {req.name!r}")
        return ToolReply(text=text)

    async def _on_block(self, req: BlockRequest) -> BlockReply:
        return BlockReply(block=await self.archive.get(req.seq))

    async def _on_blocks(self, req: BlocksRequest) -> BlocksReply:
        blocks, next_after = await self.archive.page(
            req.after, max(req.max_bytes, 1), req.conversation, req.project
        )
        return BlocksReply(blocks=blocks, next_after=next_after)

    async def _on_purge(self, req: PurgeRequest) -> PurgeReply:
        if (req.conversation is None) == (req.project is None):
            raise BadRequest("name exactly one of conversation, project")
        seqs = await self.archive.purge(req.conversation, req.project)
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
