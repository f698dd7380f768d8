"""The archive: blocks sealed in Redis, the global sequence, and the in-memory search index.

Redis layout:

- ``loki:recall:seq`` — the global sequence (``INCR``: from 1, strictly increasing, never
  reused, atomic across every recall instance);
- ``loki:recall:blocks`` — a hash ``<seq>`` → sealed block.

A stored block is sealed with the service key (associated data ``loki:recall:block:<seq>``,
so a blob moved to another seq does not open). Inside, one kind byte: ``P`` then the block's
JSON, or ``M`` then the JSON sealed again with the user's memory key (associated data
``loki:recall:block:<seq>:memory``) — the case for every block archived while the memory is
encrypted. Without the memory key an ``M`` block is unreadable, and every read treats it as
absent.

Reads of one block go to Redis. Searches use two :class:`~loki_recall.index.Index` objects
(blocks readable with the service key alone, and memory blocks, the latter only while the
memory key is held — a lock drops it whole), then check each returned block with the exact
rule on its text fetched from Redis. Before each search or listing the archive catches up with
blocks other recall instances stored (the sequence counter says which seqs may exist).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import secrets
import time
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.memkey import KDF_REDIS_KEY
from loki_shared.messages.recall import ArchiveRequest, Block
from loki_shared.recall_label import recall_label
from loki_shared.sealing import Sealer, SealError

from .errors import MemoryLocked, StoreUnavailable
from .index import FREEZE_AT, Index
from .text import MAX_SEQ, go_lower, score

SEQ_KEY = "loki:recall:seq"
BLOCKS_KEY = "loki:recall:blocks"
#: A random name of this archive, so an index snapshot is never used on another archive.
ARCHIVE_ID_KEY = "loki:recall:archive_id"
#: An index snapshot is written after this many newly indexed blocks, and at stop.
SNAPSHOT_EVERY = 20_000
KIND_PLAIN = b"P"
KIND_MEMORY = b"M"
#: How long a seq the counter gave out but that is not stored yet is looked for again.
PENDING_S = 60.0
FETCH_CHUNK = 512
_NEXT_SEQ = """
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
return redis.call('INCR', KEYS[1])
"""

log = logging.getLogger("loki.recall.archive")


def block_aad(seq: int) -> bytes:
    return b"loki:recall:block:%d" % seq


def memory_aad(seq: int) -> bytes:
    return b"loki:recall:block:%d:memory" % seq


def _encode(block: Block) -> bytes:
    # ensure_ascii keeps any str (lone surrogates included) exact through the round trip.
    return json.dumps(
        {
            "label": block.label,
            "role": block.role,
            "tool_name": block.tool_name,
            "content": block.content,
            "created": block.created,
            "conversation": block.conversation,
        },
        ensure_ascii=True,
        separators=(",", ":"),
    ).encode("ascii")


def _decode(seq: int, raw: bytes) -> Block:
    data = json.loads(raw)
    return Block(seq=seq, id=f"r{seq}", **data)


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
        self.snapshot = snapshot
        self._archive_id = ""
        self._since_snapshot = 0
        self._saving: asyncio.Task[None] | None = None
        self._memory: Sealer | None = None
        self._plain = Index()
        self._private: Index | None = None
        self._private_seqs: set[int] = set()
        self._known: set[int] = set()
        self._sorted: list[int] = []
        self._sorted_dirty = False
        self._synced = 0
        self._pending: dict[int, float] = {}
        self._sync_lock = asyncio.Lock()
        self._loader: asyncio.Task[None] | None = None
        self._next_seq = redis.register_script(_NEXT_SEQ)

    # --- state -----------------------------------------------------------------------------
    @property
    def unlocked(self) -> bool:
        """Whether the memory key is held."""
        return self._memory is not None

    def stats(self) -> dict[str, int]:
        """Counts for logs and benchmarks: blocks known, indexed, memory blocks, vocabulary."""
        return {
            "blocks": len(self._known),
            "indexed": len(self._plain) + (len(self._private) if self._private else 0),
            "memory_blocks": len(self._private_seqs),
            "vocabulary": self._plain.vocabulary,
            "index_bytes": self._plain.memory_bytes()
            + (self._private.memory_bytes() if self._private else 0),
        }

    # --- sealing ---------------------------------------------------------------------------
    def _open(self, seq: int, blob: bytes) -> Block | None:
        """The block in ``blob``, or None when it is a memory block and the key is not held.

        Raises:
            SealError: the blob does not open (wrong service key, tampered, moved).
        """
        inner = self.sealer.open(blob, block_aad(seq))
        kind, body = inner[:1], inner[1:]
        if kind == KIND_MEMORY:
            memory = self._memory
            if memory is None:
                return None
            body = memory.open(body, memory_aad(seq))
        elif kind != KIND_PLAIN:
            raise SealError(f"block {seq}: unknown kind {kind!r}")
        return _decode(seq, body)

    def _open_safe(self, seq: int, blob: bytes | None) -> Block | None:
        if blob is None:
            return None
        try:
            return self._open(seq, blob)
        except (SealError, ValueError) as exc:
            log.error("block r%d does not open: %s", seq, exc)
            return None

    # --- indexing --------------------------------------------------------------------------
    def _ingest(self, seq: int, blob: bytes) -> None:
        """Record a stored block (idempotent): seq, kind, and its words when readable."""
        if seq in self._known:
            return
        try:
            inner = self.sealer.open(blob, block_aad(seq))
        except SealError as exc:
            log.error("block r%d does not open with the service key: %s", seq, exc)
            return
        if inner[:1] != KIND_MEMORY:
            data = json.loads(inner[1:])
            self._record(seq, False, data["label"], data["content"])
            return
        label = content = None
        if self._private is not None and self._memory is not None:
            try:
                data = json.loads(self._memory.open(inner[1:], memory_aad(seq)))
                label, content = data["label"], data["content"]
            except SealError as exc:
                log.error("memory block r%d does not open with the memory key: %s", seq, exc)
        self._record(seq, True, label, content)

    def _record(self, seq: int, private: bool, label: str | None, content: str | None) -> None:
        """Note block ``seq`` as stored and index its texts (None: not readable now)."""
        if seq in self._known:
            return
        self._known.add(seq)
        if self._sorted and seq < self._sorted[-1]:
            self._sorted_dirty = True
        self._sorted.append(seq)
        if private:
            self._private_seqs.add(seq)
            if self._private is not None and label is not None and content is not None:
                self._private.add(seq, go_lower(label), go_lower(content))
        elif label is not None and content is not None:
            self._plain.add(seq, go_lower(label), go_lower(content))
            self._since_snapshot += 1

    def _sorted_seqs(self) -> list[int]:
        if self._sorted_dirty:
            self._sorted.sort()
            self._sorted_dirty = False
        return self._sorted

    async def _get_archive_id(self) -> str:
        await self.redis.set(ARCHIVE_ID_KEY, secrets.token_hex(16), nx=True)
        return (await self.redis.get(ARCHIVE_ID_KEY)).decode("ascii")

    def _snapshot_aad(self) -> bytes:
        return b"loki:recall:index-snapshot:" + self._archive_id.encode("ascii")

    def _read_snapshot(self) -> tuple[Index, set[int]] | None:
        """The saved index and memory-block seqs, or None (absent, other archive, damaged)."""
        if self.snapshot is None or not self.snapshot.exists():
            return None
        try:
            raw = self.sealer.open(self.snapshot.read_bytes(), self._snapshot_aad())
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            private = {int(x) for x in arrays.pop("private")}
            return Index.from_arrays(arrays), private
        except (OSError, SealError, KeyError, ValueError) as exc:
            log.warning("index snapshot not used: %s", exc)
            return None

    async def save_snapshot(self) -> None:
        """Save the index of service-key blocks (never memory blocks' words) to
        :attr:`snapshot`, sealed with the service key; written to a temporary file and
        renamed, so a crash leaves the previous snapshot."""
        if self.snapshot is None or not self._archive_id:
            return
        self._since_snapshot = 0
        arrays = self._plain.to_arrays()
        arrays["private"] = np.array(sorted(self._private_seqs), dtype=np.uint64)
        aad, path, sealer = self._snapshot_aad(), self.snapshot, self.sealer

        def write() -> None:
            buf = io.BytesIO()
            np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy types ** as allow_pickle
            blob = sealer.seal(buf.getvalue(), aad)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, path)

        t0 = time.monotonic()
        await asyncio.to_thread(write)
        log.info("index snapshot saved: %d blocks, %.1f s", len(self._plain), time.monotonic() - t0)

    def _maybe_snapshot(self) -> None:
        if (
            self.snapshot is not None
            and self._since_snapshot >= SNAPSHOT_EVERY
            and (self._saving is None or self._saving.done())
        ):
            self._saving = asyncio.create_task(self.save_snapshot())

    async def close(self) -> None:
        """Stop background work; save the index snapshot when blocks were indexed since."""
        await self.set_memory_key(None)
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)
        if self._since_snapshot:
            try:
                await self.save_snapshot()
            except OSError as exc:
                log.warning("index snapshot not saved: %s", exc)

    async def load(self) -> None:
        """Read the archive once (start-up): restore the index snapshot when it matches this
        archive, then read and index only the blocks it does not cover.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        try:
            self._archive_id = await self._get_archive_id()
            top = int(await self.redis.get(SEQ_KEY) or 0)
            stored = {int(f) for f in await self.redis.hkeys(BLOCKS_KEY)}
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        snap = await asyncio.to_thread(self._read_snapshot)
        if snap is not None:
            index, private = snap
            seqs = set(index.seqs().tolist())
            if seqs <= stored and private <= stored and not seqs & private:
                self._plain, self._private_seqs = index, private
                self._known = seqs | private
                self._sorted = sorted(self._known)
                log.info("index snapshot restored: %d blocks", len(self._known))
            else:
                log.warning("index snapshot not used: it names blocks this archive lacks")
        missing = sorted(stored - self._known)
        self._plain.freeze_at = 1 << 15  # fewer, bigger frozen parts while loading
        try:
            for i in range(0, len(missing), FETCH_CHUNK):
                chunk = missing[i : i + FETCH_CHUNK]
                blobs = await self.redis.hmget(BLOCKS_KEY, [str(s) for s in chunk])
                for seq, blob in zip(chunk, blobs):
                    if blob is not None:
                        self._ingest(seq, blob)
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        finally:
            self._plain.freeze()
            self._plain.freeze_at = FREEZE_AT
        now = time.monotonic()
        self._synced = max(top, self._synced)
        # Seqs handed out but not stored yet (an archive in flight elsewhere).
        if len(self._known) < top:
            for seq in range(1, top + 1):
                if seq not in self._known:
                    self._pending[seq] = now
            if len(self._pending) > 10_000:  # long-dead gaps: do not chase them
                self._pending = dict(sorted(self._pending.items())[-10_000:])
        if self._since_snapshot >= SNAPSHOT_EVERY // 4:
            self._since_snapshot = SNAPSHOT_EVERY
            self._maybe_snapshot()

    async def sync(self) -> None:
        """Catch up with blocks other recall instances stored since the last look."""
        async with self._sync_lock:
            try:
                top = int(await self.redis.get(SEQ_KEY) or 0)
                now = time.monotonic()
                for seq in range(self._synced + 1, top + 1):
                    if seq not in self._known:
                        self._pending.setdefault(seq, now)
                self._synced = max(self._synced, top)
                want = [s for s in self._pending if s not in self._known]
                for i in range(0, len(want), FETCH_CHUNK):
                    chunk = want[i : i + FETCH_CHUNK]
                    blobs = await self.redis.hmget(BLOCKS_KEY, [str(s) for s in chunk])
                    for seq, blob in zip(chunk, blobs):
                        if blob is not None:
                            self._ingest(seq, blob)
            except RedisError as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc
            for seq, since in list(self._pending.items()):
                if seq in self._known or now - since > PENDING_S:
                    del self._pending[seq]

    # --- memory key ------------------------------------------------------------------------
    async def set_memory_key(self, key: bytes | None) -> None:
        """Hold ``key`` (unlock: memory blocks are indexed again, in the background) or forget
        it (``None``, lock: memory blocks become unreadable at once)."""
        if self._loader is not None:
            self._loader.cancel()
            self._loader = None
        if key is None:
            self._memory = None
            self._private = None
            return
        self._memory = Sealer(key)
        self._private = Index()
        # The seqs to load are fixed now: a memory block archived from here on is indexed by
        # the archive path itself, never twice.
        self._loader = asyncio.create_task(
            self._load_private(self._private, sorted(self._private_seqs))
        )

    async def _load_private(self, index: Index, seqs: list[int]) -> None:
        for i in range(0, len(seqs), FETCH_CHUNK):
            chunk = seqs[i : i + FETCH_CHUNK]
            try:
                blobs = await self.redis.hmget(BLOCKS_KEY, [str(s) for s in chunk])
            except RedisError as exc:
                log.error("memory blocks not indexed: redis: %s", exc)
                return
            if self._private is not index:
                return
            for seq, blob in zip(chunk, blobs):
                block = self._open_safe(seq, blob)
                if block is not None:
                    index.add(seq, go_lower(block.label), go_lower(block.content))
            await asyncio.sleep(0)
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
        memory = self._memory
        try:
            # One round trip: refuse (0) when the memory is encrypted and this instance has no
            # key, else INCR the global sequence.
            seq = int(
                await self._next_seq(
                    keys=[SEQ_KEY, KDF_REDIS_KEY], args=[1 if memory is None else 0]
                )
            )
            if seq == 0:
                raise MemoryLocked("the memory is locked: unlock it to archive")
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
            body = _encode(block)
            if memory is not None:
                inner = KIND_MEMORY + memory.seal(body, memory_aad(seq))
            else:
                inner = KIND_PLAIN + body
            blob = self.sealer.seal(inner, block_aad(seq))
            await self.redis.hset(BLOCKS_KEY, str(seq), blob)
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        self._record(seq, memory is not None, block.label, block.content)
        self._maybe_snapshot()
        return block

    # --- reads -----------------------------------------------------------------------------
    async def get(self, seq: int) -> Block | None:
        """The readable block ``seq``, or None (absent, out of range, or locked memory block).

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        if not 0 < seq <= MAX_SEQ:
            return None
        try:
            blob = await self.redis.hget(BLOCKS_KEY, str(seq))
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return self._open_safe(seq, blob)

    async def _get_many(self, seqs: list[int]) -> list[Block | None]:
        try:
            blobs = await self.redis.hmget(BLOCKS_KEY, [str(s) for s in seqs])
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return [self._open_safe(s, b) for s, b in zip(seqs, blobs)]

    async def search(self, kws: set[str], limit: int) -> list[Block]:
        """The ``limit`` best readable blocks for ``kws`` (score, then seq, descending).

        The indexes give each candidate an upper bound of its score; candidates are checked
        with the exact rule in bound order until no unchecked one can enter the top
        ``limit``. Raises :class:`StoreUnavailable` when Redis does not answer.
        """
        await self.sync()
        bounds, seqs = [], []
        for index in (self._plain, self._private if self._memory is not None else None):
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
            for block in await self._get_many(chunk):
                if block is None:
                    continue
                points = score(kws, go_lower(block.label), go_lower(block.content))
                if points > 0:
                    hits.append((points, block.seq, block))
            hits.sort(key=lambda t: (t[0], t[1]), reverse=True)
            del hits[limit:]
        return [b for _, _, b in hits]

    async def page(self, after: int, max_bytes: int) -> tuple[list[Block], int | None]:
        """Readable blocks with seq > ``after`` in increasing seq, up to about ``max_bytes``
        of JSON (at least one), and the ``after`` of the next page (None at the end)."""
        await self.sync()
        seqs = self._sorted_seqs()
        start = bisect_right(seqs, after)
        out: list[Block] = []
        size = 0
        i = start
        while i < len(seqs):
            chunk = seqs[i : i + 64]
            blocks = await self._get_many(chunk)
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
