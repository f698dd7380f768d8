"""Blocks in Redis: the global sequence, sealing, and reads (one block, many, or in chunks).

Redis layout:

- ``loki:recall:seq`` — the global sequence (``INCR``: from 1, strictly increasing, never
  reused, atomic across every recall instance);
- ``loki:recall:blocks`` — a hash ``<seq>`` → sealed block;
- ``loki:recall:owner:...`` — the owner sets, written by :meth:`BlockStore.put` with the block
  (see :mod:`loki_recall.owners`); a block is never stored for a conversation or project named
  in ``loki:recall:gone`` (:mod:`loki_shared.recall_purge`).

A stored block is sealed with the service key (associated data ``loki:recall:block:<seq>``,
so a blob moved to another seq does not open). Inside, one kind byte: ``P`` then the block's
JSON, or ``M`` then the JSON sealed again with the user's memory key (associated data
``loki:recall:block:<seq>:memory``) — the case for every block archived while the memory is
encrypted. Without the memory key an ``M`` block is unreadable, and every read treats it as
absent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.memkey import KDF_REDIS_KEY
from loki_shared.messages.recall import Block
from loki_shared.recall_purge import GONE_KEY, PURGE_KEY
from loki_shared.sealing import Sealer, SealError

from .errors import Deleted, MemoryLocked, StoreUnavailable
from .keys import BLOCKS_KEY, DELETED_KEY, SEQ_KEY
from .owners import owner_key, owners

KIND_PLAIN = b"P"
KIND_MEMORY = b"M"
#: Blocks asked of Redis in one ``HMGET``.
FETCH_CHUNK = 512
# KEYS: the seq counter. ARGV: '1' when the memory key is not held, the KDF key's name. The
# KDF key is read by name rather than declared in KEYS: Redis checks a script's declared keys
# as written, and the recall service may only read it (its ACL user has it read-only); the
# EXISTS inside is checked as the read it is. Atomic with the INCR, so no block is numbered
# after the memory became encrypted without the check seeing it.
_NEXT_SEQ = """
if ARGV[1] == '1' and redis.call('EXISTS', ARGV[2]) == 1 then return 0 end
return redis.call('INCR', KEYS[1])
"""
# KEYS: blocks, gone, owner set of the conversation (or of the project again), of the project.
# ARGV: seq, blob, conversation member ('' when none), project member.
_STORE = """
if (ARGV[3] ~= '' and redis.call('SISMEMBER', KEYS[2], ARGV[3]) == 1)
   or redis.call('SISMEMBER', KEYS[2], ARGV[4]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('SADD', KEYS[3], ARGV[1]) end
redis.call('SADD', KEYS[4], ARGV[1])
return 1
"""
log = logging.getLogger("loki.recall.archive")


def block_aad(seq: int) -> bytes:
    """Associated data of the service-key seal of block ``seq``."""
    return b"loki:recall:block:%d" % seq


def memory_aad(seq: int) -> bytes:
    """Associated data of the memory-key seal of block ``seq``."""
    return b"loki:recall:block:%d:memory" % seq


def _encode(block: Block) -> bytes:
    # ensure_ascii keeps any str (lone surrogates included) exact through the round trip.
    data = {
        "label": block.label,
        "role": block.role,
        "tool_name": block.tool_name,
        "content": block.content,
        "created": block.created,
        "conversation": block.conversation,
    }
    if block.project is not None:  # absent: the default project (blocks stored before)
        data["project"] = block.project
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _decode(seq: int, raw: bytes) -> Block:
    data = json.loads(raw)
    return Block(seq=seq, id=f"r{seq}", **data)


class BlockStore:
    """Sealed blocks in one Redis; :attr:`memory` is the memory key's sealer while held.

    Every Redis failure is raised as :class:`~loki_recall.errors.StoreUnavailable`.
    """

    def __init__(self, redis: Redis, sealer: Sealer) -> None:
        self.redis = redis
        self.sealer = sealer
        self.memory: Sealer | None = None
        self._next_seq = redis.register_script(_NEXT_SEQ)
        self._store = redis.register_script(_STORE)

    # --- sealing ---------------------------------------------------------------------------
    def outer(self, seq: int, blob: bytes) -> tuple[bytes, bytes]:
        """``(kind, body)`` of a stored blob, opened with the service key only.

        Raises:
            SealError: the blob does not open with the service key.
        """
        inner = self.sealer.open(blob, block_aad(seq))
        return inner[:1], inner[1:]

    def open(self, seq: int, blob: bytes) -> Block | None:
        """The block in ``blob``, or None when it is a memory block and the key is not held.

        Raises:
            SealError: the blob does not open (wrong service key, tampered, moved).
        """
        kind, body = self.outer(seq, blob)
        if kind == KIND_MEMORY:
            memory = self.memory
            if memory is None:
                return None
            body = memory.open(body, memory_aad(seq))
        elif kind != KIND_PLAIN:
            raise SealError(f"block {seq}: unknown kind {kind!r}")
        return _decode(seq, body)

    def open_safe(self, seq: int, blob: bytes | None) -> Block | None:
        """:meth:`open`, with None (and an error log) for a blob that does not open."""
        if blob is None:
            return None
        try:
            return self.open(seq, blob)
        except (SealError, ValueError) as exc:
            log.error("block r%d does not open: %s", seq, exc)
            return None

    def seal(self, block: Block, memory: Sealer | None) -> bytes:
        """The stored blob of ``block``: sealed with ``memory`` first when given."""
        body = _encode(block)
        seq = block.seq
        if memory is not None:
            inner = KIND_MEMORY + memory.seal(body, memory_aad(seq))
        else:
            inner = KIND_PLAIN + body
        return self.sealer.seal(inner, block_aad(seq))

    # --- Redis -----------------------------------------------------------------------------
    async def next_seq(self, memory_held: bool) -> int:
        """The next global seq, in one round trip.

        Raises:
            MemoryLocked: the memory is encrypted (a KDF record exists) and ``memory_held``
                is false.
            StoreUnavailable: Redis does not answer.
        """
        try:
            seq = int(
                await self._next_seq(keys=[SEQ_KEY], args=[0 if memory_held else 1, KDF_REDIS_KEY])
            )
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        if seq == 0:
            raise MemoryLocked("the memory is locked: unlock it to archive")
        return seq

    async def put(
        self, seq: int, blob: bytes, conversation: str | None, project: str | None
    ) -> None:
        """Store ``blob`` under ``seq`` and add it to its owner sets, in one script.

        Raises:
            Deleted: the conversation or project was deleted (nothing stored).
            StoreUnavailable: Redis does not answer.
        """
        conv, proj = owners(conversation, project)
        try:
            ok = await self._store(
                keys=[BLOCKS_KEY, GONE_KEY, owner_key(conv or proj), owner_key(proj)],
                args=[str(seq), blob, conv, proj],
            )
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        if not ok:
            raise Deleted("the conversation or project of this block was deleted")

    async def look(self, deleted_from: int) -> tuple[int, list[int], int]:
        """One round trip: the last seq given out, the deleted seqs from position
        ``deleted_from`` of the deletion list, and the number of pending deletions.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.get(SEQ_KEY)
                pipe.lrange(DELETED_KEY, deleted_from, -1)
                pipe.scard(PURGE_KEY)
                top, deleted, pending = await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return int(top or 0), [int(s) for s in deleted], int(pending)

    async def top(self) -> int:
        """The last seq the counter gave out (0: none). Raises :class:`StoreUnavailable`."""
        try:
            return int(await self.redis.get(SEQ_KEY) or 0)
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def stored(self) -> set[int]:
        """Every stored seq. Raises :class:`StoreUnavailable`."""
        try:
            return {int(f) for f in await self.redis.hkeys(BLOCKS_KEY)}
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def raw(self, seqs: list[int]) -> list[bytes | None]:
        """The stored blobs of ``seqs`` (None where absent), one ``HMGET``.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        try:
            blobs = await self.redis.hmget(BLOCKS_KEY, [str(s) for s in seqs])
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return cast("list[bytes | None]", blobs)  # a client without decode_responses

    async def fetch(self, seqs: Iterable[int]) -> AsyncIterator[list[tuple[int, bytes]]]:
        """The stored ``(seq, blob)`` pairs of ``seqs``, by chunks of :data:`FETCH_CHUNK`
        (absent seqs left out). Raises :class:`StoreUnavailable`."""
        want = list(seqs)
        for i in range(0, len(want), FETCH_CHUNK):
            chunk = want[i : i + FETCH_CHUNK]
            blobs = await self.raw(chunk)
            yield [(seq, blob) for seq, blob in zip(chunk, blobs) if blob is not None]

    async def get(self, seq: int) -> Block | None:
        """The readable block ``seq`` or None. Raises :class:`StoreUnavailable`."""
        try:
            blob = await self.redis.hget(BLOCKS_KEY, str(seq))
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return self.open_safe(seq, cast("bytes | None", blob))

    async def get_many(self, seqs: list[int]) -> list[Block | None]:
        """The readable blocks of ``seqs`` (None where absent or unreadable), aligned."""
        return [self.open_safe(s, b) for s, b in zip(seqs, await self.raw(seqs))]
