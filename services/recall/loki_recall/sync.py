"""Which seqs this instance knows, and catching up with blocks other instances stored.

The sequence counter says which seqs may exist: a seq given out but not stored yet (an
archive in flight on another instance) is looked for again at each catch-up for
:data:`PENDING_S` seconds, then given up (the archive failed after taking its seq).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable

from .blocks import BlockStore

#: How long a seq the counter gave out but that is not stored yet is looked for again.
PENDING_S = 60.0
#: At most this many such seqs are chased after a start (long-dead gaps are not).
MAX_PENDING = 10_000

Ingest = Callable[[int, bytes], None]
Forget = Callable[[set[int]], None]


class Catalog:
    """The stored seqs this instance has seen (``known``), in order on demand."""

    def __init__(self) -> None:
        self.known: set[int] = set()
        self._sorted: list[int] = []
        self._sorted_dirty = False
        self._synced = 0
        self._pending: dict[int, float] = {}
        self._lock = asyncio.Lock()
        #: How many entries of the deletion list (``loki:recall:deleted``) were applied.
        self.deleted_from = 0

    def __len__(self) -> int:
        return len(self.known)

    def __contains__(self, seq: object) -> bool:
        return seq in self.known

    def add(self, seq: int) -> bool:
        """Note ``seq`` as stored; whether it was new."""
        if seq in self.known:
            return False
        self.known.add(seq)
        if self._sorted and seq < self._sorted[-1]:
            self._sorted_dirty = True
        self._sorted.append(seq)
        return True

    def remove(self, seqs: set[int]) -> None:
        """Forget deleted ``seqs`` (they are never given out again, so never pending)."""
        for seq in seqs:
            self._pending.pop(seq, None)
        if not seqs & self.known:
            return
        self.known -= seqs
        self._sorted = [s for s in self._sorted if s not in seqs]

    def restore(self, seqs: set[int]) -> None:
        """Start from ``seqs`` (an index snapshot's)."""
        self.known = set(seqs)
        self._sorted = sorted(self.known)
        self._sorted_dirty = False

    def sorted(self) -> list[int]:
        """Every known seq, increasing (the list itself: do not modify)."""
        if self._sorted_dirty:
            self._sorted.sort()
            self._sorted_dirty = False
        return self._sorted

    def after(self, seq: int) -> int:
        """Position in :meth:`sorted` of the first seq above ``seq``."""
        return bisect_right(self.sorted(), seq)

    async def read(self, store: BlockStore, seqs: Iterable[int], ingest: Ingest) -> None:
        """Fetch the stored blocks of ``seqs`` and hand each to ``ingest(seq, blob)``.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        async for chunk in store.fetch(seqs):
            for seq, blob in chunk:
                ingest(seq, blob)

    def loaded(self, top: int) -> None:
        """After the start-up read: seqs up to ``top`` not stored yet become pending."""
        now = time.monotonic()
        self._synced = max(top, self._synced)
        if len(self.known) < top:
            for seq in range(1, top + 1):
                if seq not in self.known:
                    self._pending[seq] = now
            if len(self._pending) > MAX_PENDING:  # long-dead gaps: do not chase them
                self._pending = dict(sorted(self._pending.items())[-MAX_PENDING:])

    async def sync(self, store: BlockStore, ingest: Ingest, forget: Forget) -> int:
        """Catch up with blocks other recall instances stored or deleted since the last look
        (deleted seqs go to ``forget``); the number of deletions recorded but not applied.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        async with self._lock:
            top, deleted, pending_purges = await store.look(self.deleted_from)
            self.deleted_from += len(deleted)
            if deleted:
                forget(set(deleted))
            now = time.monotonic()
            for seq in range(self._synced + 1, top + 1):
                if seq not in self.known:
                    self._pending.setdefault(seq, now)
            self._synced = max(self._synced, top)
            await self.read(store, [s for s in self._pending if s not in self.known], ingest)
            for seq, since in list(self._pending.items()):
                if seq in self.known or now - since > PENDING_S:
                    del self._pending[seq]
            return pending_purges
