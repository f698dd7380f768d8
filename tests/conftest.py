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
from dataclasses import dataclass
from pathlib import Path

import pytest

from loki_shared import servers


@dataclass
class RunningServer:
    url: str
    port: int
    process: servers.ManagedProcess
    data_dir: Path


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="loki-test-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def start_nats(data_dir: Path) -> RunningServer:
    """Start a JetStream NATS on a free port storing under ``data_dir``."""
    port = servers.free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = servers.ManagedProcess("nats", servers.nats_command(port, data_dir)).start()
    proc.wait_port(port)
    return RunningServer(f"nats://127.0.0.1:{port}", port, proc, data_dir)


def start_redis(data_dir: Path) -> RunningServer:
    """Start a Redis (append-only) on a free port storing under ``data_dir``."""
    port = servers.free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = servers.ManagedProcess("redis", servers.redis_command(port, data_dir)).start()
    proc.wait_port(port)
    return RunningServer(f"redis://127.0.0.1:{port}/0", port, proc, data_dir)


def start_llama(
    data_dir: Path, ctx: int = 4096, parallel: int = 1, extra: list[str] | None = None
) -> RunningServer:
    """Start the real llama-server with the bundled model; wait until ``/health`` is ok."""
    port = servers.free_port()
    argv = servers.llama_command(port, ctx=ctx, parallel=parallel, extra=extra or [])
    proc = servers.ManagedProcess("llama-server", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/health", timeout=120)
    except servers.ServerStartError:
        proc.stop()
        raise
    return RunningServer(url, port, proc, data_dir)


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
    server = start_llama(tmp_root / "llama")
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
