"""Who owns which block, and deletions, in Redis.

- ``loki:recall:owner:c:<conversation>`` and ``loki:recall:owner:p:<project>`` — the seqs a
  conversation archived and the seqs of a project (every block is in its project's set,
  :data:`~loki_shared.messages.recall.DEFAULT_PROJECT` when archived without one), written
  by the script that stores the block (:meth:`loki_recall.blocks.BlockStore.put`), so a
  deletion finds every block even while memory blocks are unreadable. They name seqs and ids,
  never content;
- ``loki:recall:deleted`` — every deleted seq, in order (other instances drop them from their
  index at their next catch-up);
- ``loki:recall:owners_v1`` — set once every block stored before the owner sets existed has
  been added to them (a one-time full read at start);
- ``loki:recall:purge`` / ``loki:recall:gone`` — deletions pending / done
  (:mod:`loki_shared.recall_purge`, also written by the chat store's delete).
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.messages.recall import DEFAULT_PROJECT
from loki_shared.recall_purge import GONE_KEY, PURGE_KEY, member

from .errors import StoreUnavailable
from .keys import BLOCKS_KEY, DELETED_KEY, OWNER_PREFIX, OWNERS_DONE_KEY

# KEYS: blocks, owner set, purge set, deleted list. ARGV: the member. Returns the seqs deleted.
_PURGE = """
local out = {}
for _, s in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('HDEL', KEYS[1], s) == 1 then
    out[#out + 1] = s
    redis.call('RPUSH', KEYS[4], s)
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return out
"""


def owner_key(name: str) -> str:
    """The Redis set of the seqs owned by ``name`` (a :func:`~loki_shared.recall_purge.member`)."""
    return OWNER_PREFIX + name


def owners(conversation: str | None, project: str | None) -> tuple[str, str]:
    """The members a block belongs to: its conversation's (``""`` when none) and its
    project's (the default project when None)."""
    conv = member(conversation=conversation) if conversation is not None else ""
    return conv, member(project=project or DEFAULT_PROJECT)


class Owners:
    """The owner sets and the deletion records of one Redis.

    Every Redis failure is raised as :class:`~loki_recall.errors.StoreUnavailable`.
    """

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._purge = redis.register_script(_PURGE)

    async def add(self, items: list[tuple[int, str | None, str | None]]) -> None:
        """Add ``(seq, conversation, project)`` of blocks stored before the owner sets
        existed to them (idempotent)."""
        if not items:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for seq, conversation, project in items:
                    for name in owners(conversation, project):
                        if name:
                            pipe.sadd(owner_key(name), seq)
                await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def owned(self, name: str) -> list[int]:
        """The seqs in the owner set of ``name``, increasing."""
        try:
            return sorted(int(s) for s in await self.redis.smembers(owner_key(name)))
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def record(self, name: str) -> None:
        """Record a deletion (pending, and gone for good) before applying it."""
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.sadd(PURGE_KEY, name)
                pipe.sadd(GONE_KEY, name)
                await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def purge(self, name: str) -> list[int]:
        """Delete every block owned by ``name`` and clear its pending record, in one script;
        the seqs deleted, increasing (appended to ``loki:recall:deleted``)."""
        try:
            out = await self._purge(
                keys=[BLOCKS_KEY, owner_key(name), PURGE_KEY, DELETED_KEY], args=[name]
            )
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return sorted(int(s) for s in out)

    async def pending(self) -> list[str]:
        """The deletions recorded and not applied yet."""
        try:
            members = await self.redis.smembers(PURGE_KEY)
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    async def gone(self, names: list[str]) -> list[bool]:
        """Whether each of ``names`` was deleted."""
        if not names:
            return []
        try:
            return [bool(x) for x in await self.redis.smismember(GONE_KEY, names)]
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def deleted(self) -> list[int]:
        """Every deleted seq, in the order of deletion."""
        try:
            return [int(s) for s in await self.redis.lrange(DELETED_KEY, 0, -1)]
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def complete(self, done: bool = False) -> bool:
        """Whether the owner sets cover every block (``done``: record that they do now)."""
        try:
            if done:
                await self.redis.set(OWNERS_DONE_KEY, b"1")
                return True
            return bool(await self.redis.exists(OWNERS_DONE_KEY))
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
