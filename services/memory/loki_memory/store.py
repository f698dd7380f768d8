"""The memory service's state in one Redis: projects, pages and trackers over one vault."""

from __future__ import annotations

from redis.asyncio import Redis

from loki_shared.sealing import Sealer

from .pages import Pages
from .projects import Projects
from .trackers import Trackers
from .vault import Vault


class Store:
    """:attr:`projects`, :attr:`pages` and :attr:`trackers` sharing one Redis and vault.

    Args:
        redis: an asyncio Redis client (bytes responses).
        service_key: the 32-byte service key.
    """

    def __init__(self, redis: Redis, service_key: bytes) -> None:
        self.redis = redis
        self.vault = Vault(redis, service_key)
        self.projects = Projects(redis, self.vault)
        self.pages = Pages(redis, self.vault)
        self.trackers = Trackers(redis, self.vault)

    async def set_memory_key(self, key: bytes | None) -> None:
        """Hold ``key`` (32 bytes) as the memory key, or forget it (None); what the tracker
        cache opened with the key before is dropped either way."""
        self.vault.memory = Sealer(key) if key is not None else None
        self.trackers.cache.clear()
