"""Redis in a backup: every key under ``loki:``, read in one atomic step, written back as is.

:func:`snapshot` runs one Lua script: Redis executes a script atomically, so the copy is a
point-in-time view of every ``loki:*`` key even while the services keep writing (a
conversation blob and its index entry, written together by one script, are never half-copied).
Values are copied as stored — still sealed with the service key (and the memory key for
private blocks) — so a backup never needs to open them.

Keys with an expiry are runtime state (a conversation's owner lock, for one) and are left out:
a restored lock would name an instance that no longer exists. Persistent data never has an
expiry (docs/architecture.md, "Storage").

Types: strings, hashes, lists, sets, sorted sets, and the entries of streams (their consumer
groups are runtime state and are not kept). A key of another type fails the backup.

The whole reply is held in memory once; Redis holds the data in memory anyway.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

PATTERN = "loki:*"

_SNAPSHOT = """
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local t = redis.call('TYPE', k)['ok']
  if redis.call('PTTL', k) ~= -1 then
    table.insert(out, {k, 'volatile'})
  elseif t == 'string' then
    table.insert(out, {k, t, redis.call('GET', k)})
  elseif t == 'hash' then
    table.insert(out, {k, t, redis.call('HGETALL', k)})
  elseif t == 'list' then
    table.insert(out, {k, t, redis.call('LRANGE', k, 0, -1)})
  elseif t == 'set' then
    table.insert(out, {k, t, redis.call('SMEMBERS', k)})
  elseif t == 'zset' then
    table.insert(out, {k, t, redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')})
  elseif t == 'stream' then
    table.insert(out, {k, t, redis.call('XRANGE', k, '-', '+')})
  else
    table.insert(out, {k, t})
  end
end
return out
"""


class RedisBackupError(Exception):
    """A key of a type the backup cannot copy, or a target that already holds Loki data."""


@dataclass
class RedisKey:
    """One key: ``type`` is Redis's type name; ``value`` is bytes (string), a list of bytes
    (hash: field, value, field, value...; list; set; zset: member, score...), or for a stream
    a list of ``(id, [field, value, ...])``."""

    key: bytes
    type: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (bytes as base64)."""
        if self.type == "string":
            value: Any = _b64(self.value)
        elif self.type == "stream":
            value = [[_b64(i), [_b64(x) for x in fv]] for i, fv in self.value]
        else:
            value = [_b64(x) for x in self.value]
        return {"key": _b64(self.key), "type": self.type, "value": value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RedisKey:
        """Inverse of :meth:`to_json`.

        Raises:
            RedisBackupError: an unknown type.
        """
        t = data["type"]
        if t not in ("string", "hash", "list", "set", "zset", "stream"):
            raise RedisBackupError(f"unknown Redis type in the backup: {t}")
        raw = data["value"]
        if t == "string":
            value: Any = _unb64(raw)
        elif t == "stream":
            value = [(_unb64(i), [_unb64(x) for x in fv]) for i, fv in raw]
        else:
            value = [_unb64(x) for x in raw]
        return cls(_unb64(data["key"]), t, value)


@dataclass
class RedisSnapshot:
    keys: list[RedisKey] = field(default_factory=list)
    volatile: int = 0


async def snapshot(client: aioredis.Redis) -> RedisSnapshot:
    """Copy every persistent ``loki:*`` key at one instant (one Lua script).

    Raises:
        RedisBackupError: a key has a type this backup does not copy.
        redis.exceptions.RedisError: Redis is unreachable or refused the script.
    """
    rows = await client.eval(_SNAPSHOT, 0, PATTERN)
    out = RedisSnapshot()
    for row in rows:
        key, kind = bytes(row[0]), row[1].decode() if isinstance(row[1], bytes) else row[1]
        if kind == "volatile":
            out.volatile += 1
            continue
        if len(row) < 3:
            raise RedisBackupError(f"key {key!r} has type {kind}, which a backup cannot copy")
        value = row[2]
        if kind == "stream":
            value = [(bytes(i), [bytes(x) for x in fv]) for i, fv in value]
        elif kind != "string":
            value = [bytes(x) for x in value]
        out.keys.append(RedisKey(key, kind, value))
    out.keys.sort(key=lambda k: k.key)
    return out


async def ensure_empty(client: aioredis.Redis) -> None:
    """Refuse a Redis that already holds Loki keys (a restore never merges).

    Raises:
        RedisBackupError: at least one ``loki:*`` key exists.
    """
    async for key in client.scan_iter(match=PATTERN, count=100):
        raise RedisBackupError(
            f"the target Redis already holds Loki data (for one, {key!r}): restore only "
            "into an empty store"
        )


async def load(client: aioredis.Redis, keys: list[RedisKey]) -> None:
    """Write ``keys`` in one MULTI/EXEC transaction (all or nothing).

    Raises:
        redis.exceptions.RedisError: Redis refused the transaction (nothing was written).
    """
    pipe = client.pipeline(transaction=True)
    for k in keys:
        v = k.value
        if k.type == "string":
            pipe.set(k.key, v)
        elif k.type == "hash":
            pipe.hset(k.key, mapping=dict(zip(v[0::2], v[1::2], strict=True)))
        elif k.type == "list":
            pipe.rpush(k.key, *v)
        elif k.type == "set":
            pipe.sadd(k.key, *v)
        elif k.type == "zset":
            pipe.zadd(k.key, {m: float(s) for m, s in zip(v[0::2], v[1::2], strict=True)})
        elif k.type == "stream":
            for entry_id, fv in v:
                pipe.xadd(k.key, dict(zip(fv[0::2], fv[1::2], strict=True)), id=entry_id)
    await pipe.execute()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
