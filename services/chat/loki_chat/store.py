"""Conversations in Redis: one sealed blob each, and one owner at a time.

Keys (values sealed with :mod:`loki_shared.sealing`, AAD = the Redis key, or
``<index key>:<id>`` for index entries):

- ``loki:chat:conv:<id>`` — the conversation blob (Messages + Log + seq + queue + meter);
- ``loki:chat:index`` — hash ``id -> {id, title, created, updated}`` (sealed);
- ``loki:chat:lock:<id>`` — the owner: ``"<instance>|<fencing token>"``, with an expiry
  (``lock_ttl_s``), renewed by the owner;
- ``loki:chat:fence:<id>`` — the fencing-token counter (INCR on every acquisition);
- ``loki:chat:seq:<id>`` — the highest seq the owner may have published live (reserved ahead
  in blocks, before publishing): after a crash mid-turn, the next owner continues after it,
  so a seq seen live but never persisted is never given to another event.

Every write is a Lua script that first checks the lock still holds this owner's exact value
(instance and token): an instance whose lock expired and was taken over by another can no
longer write, even if it still believes it owns the conversation.
"""

from __future__ import annotations

import json
import uuid

import redis.asyncio as aioredis

from loki_shared import recall_purge
from loki_shared.sealing import Sealer

from .conversation import Conversation
from .errors import FencedWrite

PREFIX = "loki:chat"
INDEX = f"{PREFIX}:index"

_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
return 1
"""
_DELETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[1])
redis.call('SADD', KEYS[5], ARGV[3])
redis.call('SADD', KEYS[6], ARGV[3])
return 1
"""
_RESERVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
"""
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


def conv_key(cid: str) -> str:
    return f"{PREFIX}:conv:{cid}"


def lock_key(cid: str) -> str:
    return f"{PREFIX}:lock:{cid}"


def fence_key(cid: str) -> str:
    return f"{PREFIX}:fence:{cid}"


def seq_key(cid: str) -> str:
    return f"{PREFIX}:seq:{cid}"


def new_conversation_id() -> str:
    """A fresh id (32 hex characters: a valid NATS subject token)."""
    return uuid.uuid4().hex


class Store:
    """Sealed conversation blobs and ownership locks.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        sealer: the service sealer.
        instance: this instance's id (written in lock values).
        lock_ttl_s: lock expiry in seconds.
    """

    def __init__(
        self, client: aioredis.Redis, sealer: Sealer, instance: str, lock_ttl_s: float
    ) -> None:
        self.r = client
        self.sealer = sealer
        self.instance = instance
        self.ttl_ms = int(lock_ttl_s * 1000)
        self._write = client.register_script(_WRITE)
        self._delete = client.register_script(_DELETE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._reserve = client.register_script(_RESERVE)

    # -- locks ------------------------------------------------------------------------------
    async def try_acquire(self, cid: str) -> str | None:
        """Take the lock of ``cid`` if free; return the lock value (with a new fencing
        token) or None when another owner holds it."""
        token = await self.r.incr(fence_key(cid))
        value = f"{self.instance}|{token}"
        ok = await self.r.set(lock_key(cid), value, nx=True, px=self.ttl_ms)
        return value if ok else None

    async def owner(self, cid: str) -> str | None:
        """The instance holding ``cid``'s lock, or None."""
        raw = await self.r.get(lock_key(cid))
        if raw is None:
            return None
        return raw.decode().split("|", 1)[0]

    async def renew(self, cid: str, value: str) -> bool:
        return bool(await self._renew(keys=[lock_key(cid)], args=[value, self.ttl_ms]))

    async def release(self, cid: str, value: str) -> bool:
        return bool(await self._release(keys=[lock_key(cid)], args=[value]))

    # -- blobs ------------------------------------------------------------------------------
    async def load(self, cid: str) -> Conversation | None:
        """The stored conversation, or None when absent.

        Raises:
            loki_shared.sealing.SealError: the blob does not open with this key.
        """
        key = conv_key(cid)
        blob = await self.r.get(key)
        if blob is None:
            return None
        data = json.loads(self.sealer.open(blob, key.encode()))
        return Conversation.from_blob(data)

    async def save(self, conv: Conversation, lock_value: str) -> None:
        """Write the whole conversation as one sealed blob, and its index entry, atomically,
        only while ``lock_value`` still holds the lock.

        Raises:
            FencedWrite: the lock is no longer this owner's.
        """
        key = conv_key(conv.id)
        blob = self.sealer.seal(
            json.dumps(conv.to_blob(), ensure_ascii=False).encode(), key.encode()
        )
        info = self.sealer.seal(json.dumps(conv.info()).encode(), f"{INDEX}:{conv.id}".encode())
        ok = await self._write(
            keys=[lock_key(conv.id), key, INDEX], args=[lock_value, blob, conv.id, info]
        )
        if not ok:
            raise FencedWrite(f"lock of {conv.id} lost; write refused")

    async def delete(self, cid: str, lock_value: str) -> None:
        """Remove the blob, its index entry and the lock, and record (same atomic script)
        that the recall service must delete the blocks it archived
        (:mod:`loki_shared.recall_purge`).

        Raises:
            FencedWrite: the lock is no longer this owner's.
        """
        ok = await self._delete(
            keys=[
                lock_key(cid),
                conv_key(cid),
                INDEX,
                seq_key(cid),
                recall_purge.PURGE_KEY,
                recall_purge.GONE_KEY,
            ],
            args=[lock_value, cid, recall_purge.member(conversation=cid)],
        )
        if not ok:
            raise FencedWrite(f"lock of {cid} lost; delete refused")

    async def reserve_seq(self, cid: str, lock_value: str, upto: int) -> None:
        """Record that seqs up to ``upto`` may be published live (fenced like a write).

        Raises:
            FencedWrite: the lock is no longer this owner's.
        """
        ok = await self._reserve(keys=[lock_key(cid), seq_key(cid)], args=[lock_value, upto])
        if not ok:
            raise FencedWrite(f"lock of {cid} lost; seq reservation refused")

    async def reserved_seq(self, cid: str) -> int:
        """The highest seq a previous owner may have published (0 when none)."""
        raw = await self.r.get(seq_key(cid))
        return int(raw) if raw else 0

    async def list_infos(self) -> list[dict]:
        """Index entries (newest first); unreadable ones are skipped."""
        raw = await self.r.hgetall(INDEX)
        out = []
        for cid, blob in raw.items():
            cid_s = cid.decode()
            try:
                out.append(json.loads(self.sealer.open(blob, f"{INDEX}:{cid_s}".encode())))
            except Exception:  # noqa: BLE001 - a blob sealed with another key
                continue
        out.sort(key=lambda d: d.get("updated", 0), reverse=True)
        return out
