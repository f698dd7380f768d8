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
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.messages.recall import DEFAULT_PROJECT, ArchiveRequest, Block
from loki_shared.recall_label import recall_label
from loki_shared.recall_purge import member
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
from .owners import Owners, owners
from .search import best_blocks
from .snapshot import SNAPSHOT_EVERY, Snapshot, archive_id
from .sync import Catalog
from .text import MAX_SEQ, go_lower

log = logging.getLogger("loki.recall.archive")


def in_project(block: Block, project: str | None) -> bool:
    """Whether ``block`` belongs to ``project`` (None: any project; a block archived without
    a project belongs to the default project)."""
    return project is None or (block.project or DEFAULT_PROJECT) == project


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
        self.owners = Owners(redis)
        self.snapshot = Snapshot(snapshot, sealer, self._snapshot_arrays)
        self.catalog = Catalog()
        self._plain = Index()
        self._private: Index | None = None
        self._private_seqs: set[int] = set()
        self._loader: asyncio.Task[None] | None = None
        #: While the owner sets are completed at start: the owners of plain blocks read.
        self._unowned: list[tuple[int, str | None, str | None]] | None = None

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
            if self._unowned is not None:
                self._unowned.append((seq, data.get("conversation"), data.get("project")))
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
        deleted = await self.owners.deleted()
        self.catalog.deleted_from = len(deleted)
        owners_done = await self.owners.complete()
        top = await self.store.top()
        stored = await self.store.stored()
        # Before the owner sets cover every block, read every block once (no snapshot).
        snap = await asyncio.to_thread(self.snapshot.read) if owners_done else None
        if snap is not None:
            index, private = snap
            seqs = set(index.seqs().tolist())
            gone = (seqs | private) - stored
            if gone <= set(deleted) and not seqs & private:
                # Blocks deleted since the snapshot was saved leave the index at once.
                if index.remove(gone):
                    index.drop_removed()
                    self.snapshot.since = SNAPSHOT_EVERY  # rewrite it without them
                self._plain, self._private_seqs = index, private - gone
                self.catalog.restore((seqs | private) - gone)
                log.info("index snapshot restored: %d blocks", len(self.catalog))
            else:
                log.warning("index snapshot not used: it names blocks this archive lacks")
        missing = sorted(stored - self.catalog.known)
        self._plain.freeze_at = 1 << 15  # fewer, bigger frozen parts while loading
        self._unowned = None if owners_done else []
        try:
            await self.catalog.read(self.store, missing, self._ingest)
            if self._unowned is not None:
                await self.owners.add(self._unowned)
                await self.owners.complete(True)
                log.info("owner sets completed: %d blocks", len(self._unowned))
        finally:
            self._unowned = None
            self._plain.freeze()
            self._plain.freeze_at = FREEZE_AT
        # Seqs handed out but not stored yet (an archive in flight elsewhere).
        self.catalog.loaded(top)
        await self.apply_purges()
        self.snapshot.after_load()

    async def sync(self) -> None:
        """Catch up with blocks other recall instances stored or deleted since the last look,
        and apply the deletions recorded but not applied yet."""
        if await self.catalog.sync(self.store, self._ingest, self._forget):
            await self.apply_purges()

    # --- deletion --------------------------------------------------------------------------
    def _forget(self, seqs: set[int]) -> None:
        """Drop deleted ``seqs`` from this instance: the catalog and both indexes (their
        postings, and words no other block holds); the snapshot is rewritten soon."""
        self.catalog.remove(seqs)
        self._private_seqs -= seqs
        if self._plain.remove(seqs):
            self._plain.drop_removed()
            self.snapshot.since = SNAPSHOT_EVERY
            self.snapshot.maybe()
        if self._private is not None and self._private.remove(seqs):
            self._private.drop_removed()

    async def purge(self, conversation: str | None = None, project: str | None = None) -> list[int]:
        """Delete every block of ``conversation`` or of ``project`` (exactly one): recorded
        first (:mod:`loki_shared.recall_purge`), then applied in one Redis script; the seqs
        deleted now. Their seqs are never given out again.

        Raises:
            ValueError: neither or both are given.
            StoreUnavailable: Redis does not answer (the deletion stays recorded when the
                record was written, and is applied later).
        """
        name = member(conversation=conversation, project=project)
        await self.owners.record(name)
        return await self._apply(name)

    async def _apply(self, name: str) -> list[int]:
        seqs = await self.owners.purge(name)
        if seqs:
            self._forget(set(seqs))
            log.info("deleted %d archived blocks of %s", len(seqs), name.split(":", 1)[0])
        return seqs

    async def apply_purges(self) -> int:
        """Apply every deletion recorded and not applied yet (a conversation deleted while
        no recall instance answered); the number of blocks deleted.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        total = 0
        for name in await self.owners.pending():
            total += len(await self._apply(name))
        return total

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
            found: list[tuple[int, str | None, str | None]] = []
            async for chunk in self.store.fetch(seqs):
                if self._private is not index:
                    return
                for seq, blob in chunk:
                    block = self.store.open_safe(seq, blob)
                    if block is not None:
                        index.add(seq, go_lower(block.label), go_lower(block.content))
                        found.append((seq, block.conversation, block.project))
                await asyncio.sleep(0)
            await self._own_memory_blocks(found)
        except StoreUnavailable as exc:
            log.error("memory blocks not indexed: %s", exc)
            return
        log.info("memory blocks indexed: %d", len(index))

    async def _own_memory_blocks(self, found: list[tuple[int, str | None, str | None]]) -> None:
        """Memory blocks stored before the owner sets existed become deletable once readable:
        add them to their owner sets, then delete those whose conversation or project was
        deleted meanwhile."""
        await self.owners.add(found)
        names = sorted({n for _, c, p in found for n in owners(c, p) if n})
        for name, gone in zip(names, await self.owners.gone(names)):
            if gone:
                await self._apply(name)

    async def wait_loaded(self) -> None:
        """Wait until memory blocks are indexed after an unlock (tests, benchmarks)."""
        if self._loader is not None:
            await asyncio.shield(self._loader)

    # --- writes ----------------------------------------------------------------------------
    async def archive(self, req: ArchiveRequest) -> Block:
        """Store one block under the next seq; seal it with the memory key when held.

        Raises:
            MemoryLocked: the memory is encrypted (a KDF record exists) but locked.
            Deleted: the conversation or project was deleted (nothing stored).
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
            project=req.project,
        )
        await self.store.put(seq, self.store.seal(block, memory), req.conversation, req.project)
        self._record(seq, memory is not None, block.label, block.content)
        self.snapshot.maybe()
        return block

    # --- reads -----------------------------------------------------------------------------
    async def get(self, seq: int, project: str | None = None) -> Block | None:
        """The readable block ``seq``, or None (absent, out of range, locked memory block, or
        outside ``project`` when one is given).

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        if not 0 < seq <= MAX_SEQ:
            return None
        block = await self.store.get(seq)
        return block if block is not None and in_project(block, project) else None

    async def search(self, kws: set[str], limit: int, project: str | None = None) -> list[Block]:
        """The ``limit`` best readable blocks for ``kws`` (score, then seq, descending); only
        blocks of ``project`` when one is given.

        See :func:`loki_recall.search.best_blocks`. Raises :class:`StoreUnavailable` when
        Redis does not answer.
        """
        await self.sync()
        private = self._private if self.store.memory is not None else None
        return await best_blocks(
            kws,
            limit,
            (self._plain, private),
            self.store.get_many,
            lambda block: in_project(block, project),
        )

    async def page(
        self,
        after: int,
        max_bytes: int,
        conversation: str | None = None,
        project: str | None = None,
    ) -> tuple[list[Block], int | None]:
        """Readable blocks with seq > ``after`` in increasing seq, up to about ``max_bytes``
        of JSON (at least one), and the ``after`` of the next page (None at the end); only
        those archived by ``conversation`` / of ``project`` when given (read through their
        owner sets).

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        await self.sync()
        if conversation is None and project is None:
            seqs = self.catalog.sorted()
            start = self.catalog.after(after)
        else:
            sets = [
                set(await self.owners.owned(member(conversation=conversation)))
                if conversation is not None
                else None,
                set(await self.owners.owned(member(project=project)))
                if project is not None
                else None,
            ]
            seqs = sorted(set.intersection(*[x for x in sets if x is not None]))
            start = bisect_right(seqs, after)
        out: list[Block] = []
        size = 0
        i = start
        while i < len(seqs):
            chunk = seqs[i : i + 64]
            blocks = await self.store.get_many(chunk)
            for j, block in enumerate(blocks):
                if (
                    block is not None
                    and (conversation is None or block.conversation == conversation)
                    and in_project(block, project)
                ):
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


class ScopedReader:
    """A :class:`~loki_recall.tools.Reader` that sees only the blocks of one project (a
    block of another is "no archived block")."""

    def __init__(self, archive: Archive, project: str) -> None:
        self.archive = archive
        self.project = project

    async def get(self, seq: int) -> Block | None:
        return await self.archive.get(seq, self.project)

    async def search(self, kws: set[str], limit: int) -> list[Block]:
        return await self.archive.search(kws, limit, self.project)
