"""Fixtures of the recall tests: the recall service in-process on the real NATS and Redis,
and a typed NATS request client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from loki_recall.service import RecallService
from tests.recall.recall_helpers import Client, recall_settings


@pytest.fixture
async def recall(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[RecallService]:
    """A recall service started in-process on an empty Redis."""
    service = RecallService(recall_settings(nats_url, redis_db, tmp_path / "home"))
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_url)
    yield Client(nc)
    await nc.drain()
