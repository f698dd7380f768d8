"""The memory service's state in one Redis: projects, pages and trackers over one vault."""

from __future__ import annotations

from redis.asyncio import Redis

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
