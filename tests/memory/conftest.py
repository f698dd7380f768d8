"""Fixtures of the memory service tests: the service in-process on the real NATS and Redis,
a typed client (the shared :class:`~loki_shared.projects_client.ProjectsClient`) and a raw
NATS connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from redis.asyncio import Redis

from loki_memory.service import MemoryService
from loki_memory.settings import Settings
from loki_shared.projects_client import ProjectsClient


def memory_settings(nats_url: str, redis_url: str, home: Path) -> Settings:
    return Settings(
        nats_url=nats_url,
        redis_url=redis_url,
        home=home,
        secret_key="test-secret-key-0123456789",
        memory_poll_s=0.5,
    )


@pytest.fixture
async def memory(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[MemoryService]:
    """A memory service started in-process on an empty Redis."""
    service = MemoryService(memory_settings(nats_url, redis_db, tmp_path / "home"))
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.drain()


@pytest.fixture
def client(nc: NATS, memory: MemoryService) -> ProjectsClient:
    return ProjectsClient.from_nats(nc)


@pytest.fixture
async def redis(redis_db: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_db)
    yield r
    await r.aclose()
