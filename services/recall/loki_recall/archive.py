"""The archive: blocks sealed in Redis (:mod:`~loki_recall.blocks`), the in-memory search
index (:mod:`~loki_recall.index`), its snapshot (:mod:`~loki_recall.snapshot`) and the catch-up
with other instances (:mod:`~loki_recall.sync`).

Reads of one block go to Redis. Searches use two :class:`~loki_recall.index.Index` objects
(blocks readable with the service key alone, and memory blocks, the latter only while the
memory key is held — a lock drops it whole), then check each returned block with the exact
rule on its text fetched from Redis. Before each search or listing the archive catches up with
blocks other recall instances stored (the sequence counter says which seqs may exist).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.messages.recall import ArchiveRequest, Block
from loki_shared.recall_label import recall_label
from loki_shared.sealing import Sealer, SealError

from .blocks import (  # noqa: F401 - re-exported: tests and the bench name them here
    BLOCKS_KEY,
    KIND_MEMORY,
    SEQ_KEY,
    BlockStore,
    _decode,
    block_aad,
    memory_aad,
)
from .errors import StoreUnavailable
from .index import FREEZE_AT, Index
from .snapshot import Snapshot, archive_id
from .sync import Catalog
from .text import MAX_SEQ, go_lower, score

log = logging.getLogger("loki.recall.archive")


class Archive:
    """The recall archive over one Redis connection.

    Args:
        redis: an asyncio Redis client (bytes responses).
        sealer: the service key's sealer.
        snapshot: file where the index of the blocks readable with the service key is saved
            (sealed with the service key) so a restart reads only the blocks stored since;
            None: no snapshot, a restart reads every block.
    """

    def __init__(self, redis: Redis, sealer: Sealer, snapshot: Path | None = None) -> None:
        self.redis = redis
        self.sealer = sealer
        self.store = BlockStore(redis, sealer)
        self.snapshot = Snapshot(snapshot, sealer, self._snapshot_arrays)
        self.catalog = Catalog()
        self._plain = Index()
        self._private: Index | None = None
        self._private_seqs: set[int] = set()
        self._loader: asyncio.Task[None] | None = None

    # --- state -----------------------------------------------------------------------------
    @property
    def unlocked(self) -> bool:
        """Whether the memory key is held."""
        return self.store.memory is not None

    def stats(self) -> dict[str, int]:
        """Counts for logs and benchmarks: blocks known, indexed, memory blocks, vocabulary."""
        return {
            "blocks": len(self.catalog),
            "indexed": len(self._plain) + (len(self._private) if self._private else 0),
            "memory_blocks": len(self._private_seqs),
            "vocabulary": self._plain.vocabulary,
            "index_bytes": self._plain.memory_bytes()
            + (self._private.memory_bytes() if self._private else 0),
        }

    # --- indexing --------------------------------------------------------------------------
    def _ingest(self, seq: int, blob: bytes) -> None:
        """Record a stored block (idempotent): seq, kind, and its words when readable."""
        if seq in self.catalog:
            return
        try:
            kind, body = self.store.outer(seq, blob)
        except SealError as exc:
            log.error("block r%d does not open with the service key: %s", seq, exc)
            return
        if kind != KIND_MEMORY:
            data = json.loads(body)
            self._record(seq, False, data["label"], data["content"])
            return
        label = content = None
        memory = self.store.memory
        if self._private is not None and memory is not None:
            try:
                data = json.loads(memory.open(body, memory_aad(seq)))
                label, content = data["label"], data["content"]
            except SealError as exc:
                log.error("memory block r%d does not open with the memory key: %s", seq, exc)
        self._record(seq, True, label, content)

    def _record(self, seq: int, private: bool, label: str | None, content: str | None) -> None:
        """Note block ``seq`` as stored and index its texts (None: not readable now)."""
        if not self.catalog.add(seq):
            return
        if private:
            self._private_seqs.add(seq)
            if self._private is not None and label is not None and content is not None:
                self._private.add(seq, go_lower(label), go_lower(content))
        elif label is not None and content is not None:
            self._plain.add(seq, go_lower(label), go_lower(content))
            self.snapshot.since += 1

    # --- snapshot and loading --------------------------------------------------------------
    def _snapshot_arrays(self) -> dict[str, np.ndarray]:
        arrays = self._plain.to_arrays()
        arrays["private"] = np.array(sorted(self._private_seqs), dtype=np.uint64)
        return arrays

    async def save_snapshot(self) -> None:
        """Save the index of service-key blocks (never memory blocks' words) to the
        snapshot file, sealed with the service key (see :mod:`loki_recall.snapshot`)."""
        await self.snapshot.save()

    async def close(self) -> None:
        """Stop background work; save the index snapshot when blocks were indexed since."""
        await self.set_memory_key(None)
        await self.snapshot.close()

    async def load(self) -> None:
        """Read the archive once (start-up): restore the index snapshot when it matches this
        archive, then read and index only the blocks it does not cover.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        try:
            self.snapshot.archive_id = await archive_id(self.redis)
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        top = await self.store.top()
        stored = await self.store.stored()
        snap = await asyncio.to_thread(self.snapshot.read)
        if snap is not None:
            index, private = snap
            seqs = set(index.seqs().tolist())
            if seqs <= stored and private <= stored and not seqs & private:
                self._plain, self._private_seqs = index, private
                self.catalog.restore(seqs | private)
                log.info("index snapshot restored: %d blocks", len(self.catalog))
            else:
                log.warning("index snapshot not used: it names blocks this archive lacks")
        missing = sorted(stored - self.catalog.known)
        self._plain.freeze_at = 1 << 15  # fewer, bigger frozen parts while loading
        try:
            await self.catalog.read(self.store, missing, self._ingest)
        finally:
            self._plain.freeze()
            self._plain.freeze_at = FREEZE_AT
        # Seqs handed out but not stored yet (an archive in flight elsewhere).
        self.catalog.loaded(top)
        self.snapshot.after_load()

    async def sync(self) -> None:
        """Catch up with blocks other recall instances stored since the last look."""
        await self.catalog.sync(self.store, self._ingest)

    # --- memory key ------------------------------------------------------------------------
    async def set_memory_key(self, key: bytes | None) -> None:
        """Hold ``key`` (unlock: memory blocks are indexed again, in the background) or forget
        it (``None``, lock: memory blocks become unreadable at once)."""
        if self._loader is not None:
            self._loader.cancel()
            self._loader = None
        if key is None:
            self.store.memory = None
            self._private = None
            return
        self.store.memory = Sealer(key)
        self._private = Index()
        # The seqs to load are fixed now: a memory block archived from here on is indexed by
        # the archive path itself, never twice.
        self._loader = asyncio.create_task(
            self._load_private(self._private, sorted(self._private_seqs))
        )

    async def _load_private(self, index: Index, seqs: list[int]) -> None:
        try:
            async for chunk in self.store.fetch(seqs):
                if self._private is not index:
                    return
                for seq, blob in chunk:
                    block = self.store.open_safe(seq, blob)
                    if block is not None:
                        index.add(seq, go_lower(block.label), go_lower(block.content))
                await asyncio.sleep(0)
        except StoreUnavailable as exc:
            log.error("memory blocks not indexed: %s", exc)
            return
        log.info("memory blocks indexed: %d", len(index))

    async def wait_loaded(self) -> None:
        """Wait until memory blocks are indexed after an unlock (tests, benchmarks)."""
        if self._loader is not None:
            await asyncio.shield(self._loader)

    # --- writes ----------------------------------------------------------------------------
    async def archive(self, req: ArchiveRequest) -> Block:
        """Store one block under the next seq; seal it with the memory key when held.

        Raises:
            MemoryLocked: the memory is encrypted (a KDF record exists) but locked.
            StoreUnavailable: Redis does not answer.
        """
        memory = self.store.memory
        # One round trip: refuse when the memory is encrypted and this instance has no key,
        # else INCR the global sequence.
        seq = await self.store.next_seq(memory is not None)
        block = Block(
            seq=seq,
            id=f"r{seq}",
            label=req.label or recall_label(req.role, req.content, req.tool_name),
            role=req.role,
            tool_name=req.tool_name,
            content=req.content,
            created=time.time(),
            conversation=req.conversation,
        )
        await self.store.put(seq, self.store.seal(block, memory))
        self._record(seq, memory is not None, block.label, block.content)
        self.snapshot.maybe()
        return block

    # --- reads -----------------------------------------------------------------------------
    async def get(self, seq: int) -> Block | None:
        """The readable block ``seq``, or None (absent, out of range, or locked memory block).

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        if not 0 < seq <= MAX_SEQ:
            return None
        return await self.store.get(seq)

    async def search(self, kws: set[str], limit: int) -> list[Block]:
        """The ``limit`` best readable blocks for ``kws`` (score, then seq, descending).

        The indexes give each candidate an upper bound of its score; candidates are checked
        with the exact rule in bound order until no unchecked one can enter the top
        ``limit``. Raises :class:`StoreUnavailable` when Redis does not answer.
        """
        await self.sync()
        bounds, seqs = [], []
        for index in (self._plain, self._private if self.store.memory is not None else None):
            if index is None or not len(index):
                continue
            b, s = index.candidates(kws)
            bounds.append(b)
            seqs.append(s)
        if not bounds:
            return []
        bound = np.concatenate(bounds)
        seq = np.concatenate(seqs)
        order = np.lexsort((seq, bound))[::-1]
        hits: list[tuple[int, int, Block]] = []
        pos, total = 0, len(order)
        step = max(limit, 8)
        while pos < total:
            if len(hits) >= limit:
                worst = hits[limit - 1]
                nxt = order[pos]
                if (worst[0], worst[1]) > (int(bound[nxt]), int(seq[nxt])):
                    break
            chunk = [int(seq[i]) for i in order[pos : pos + step]]
            pos += len(chunk)
            for block in await self.store.get_many(chunk):
                if block is None:
                    continue
                s = score(kws, go_lower(block.label), go_lower(block.content))
                if s > 0:
                    hits.append((s, block.seq, block))
            hits.sort(key=lambda t: (t[0], t[1]), reverse=True)
            del hits[limit:]
        return [b for _, _, b in hits]

    async def page(self, after: int, max_bytes: int) -> tuple[list[Block], int | None]:
        """Readable blocks with seq > ``after`` in increasing seq, up to about ``max_bytes``
        of JSON (at least one), and the ``after`` of the next page (None at the end)."""
        await self.sync()
        seqs = self.catalog.sorted()
        start = self.catalog.after(after)
        out: list[Block] = []
        size = 0
        i = start
        while i < len(seqs):
            chunk = seqs[i : i + 64]
            blocks = await self.store.get_many(chunk)
            for j, block in enumerate(blocks):
                if block is not None:
                    n = len(block.model_dump_json()) + 1
                    if out and size + n > max_bytes:
                        return out, chunk[j - 1] if j else seqs[i - 1]
                    out.append(block)
                    size += n
            i += len(chunk)
        return out, None

    async def all_blocks(self) -> Iterable[Block]:
        """Every readable block in increasing seq (tests and baselines; reads everything)."""
        out: list[Block] = []
        after: int | None = 0
        while after is not None:
            page, after = await self.page(after, 4_000_000)
            out.extend(page)
        return out
