"""Fixtures shared by every test: real servers on free loopback ports.

- ``nats_server`` / ``nats_url``: a real NATS with JetStream (session-wide, temp storage).
- ``redis_server`` / ``redis_url``: a real Redis (session-wide, temp dir); ``redis_db``
  flushes it before a test.
- ``llama_server`` / ``engine_url``: the real llama-server with the bundled SmolLM2 model
  (session-wide, one slot). A missing binary or model FAILS the test: the real engine is never
  skipped silently.
- ``service_env``: the ``LOKI_*`` environment a service process needs to reach them.

Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loki_shared import servers

# The servers' start-up lives once, in loki_shared.servers (the launcher and the benchmarks
# use it too); tests that start their own import these names from here or from there.
RunningServer = servers.RunningServer
start_nats = servers.start_nats
start_redis = servers.start_redis


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="loki-test-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_server(tmp_root: Path) -> Iterator[RunningServer]:
    server = start_nats(tmp_root / "nats")
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: RunningServer) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def redis_server(tmp_root: Path) -> Iterator[RunningServer]:
    server = start_redis(tmp_root / "redis")
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RunningServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_db(redis_url: str) -> str:
    """The session Redis, emptied before the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.close()
    return redis_url


@pytest.fixture(scope="session")
def llama_server(tmp_root: Path) -> Iterator[RunningServer]:
    server = servers.start_llama(data_dir=tmp_root / "llama")
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def engine_url(llama_server: RunningServer) -> str:
    return llama_server.url


@pytest.fixture
def service_env(nats_url: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for a service subprocess: real NATS/Redis, a fresh LOKI_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_REDIS_URL=redis_url,
        LOKI_HOME=str(tmp_path / "home"),
        LOKI_SECRET_KEY="test-secret-key-0123456789",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
