"""Fixtures shared by every test: real servers on free loopback ports.

Authorization is on everywhere (issue 22): :func:`start_nats` runs nats-server with the users
and permissions of :mod:`loki_shared.permissions` (one password per user, generated once per
test session in :data:`AUTH`) plus the test harness's own user ``test`` (no restriction: the
tests play every service's peers), and :func:`start_redis` runs Redis with the ACL users of
the same table (``default`` off) plus the harness's ``test`` (every key and command).
The URLs they return carry the harness's login (``nats://test:...@``, ``redis://test:...@``);
:func:`login_env` gives a service process its own user instead, as ``loki up`` does.

- ``nats_server`` / ``nats_url``: a real NATS with JetStream (session-wide, temp storage).
- ``redis_server`` / ``redis_url``: a real Redis (session-wide, temp dir); ``redis_db``
  flushes it before a test.
- ``llama_server`` / ``engine_url``: the real llama-server with the bundled SmolLM2 model
  (session-wide, one slot). A missing binary or model FAILS the test: the real engine is never
  skipped silently.
- ``service_env``: the ``LOKI_*`` environment a service process needs to reach them.

Nothing here talks to anything but 127.0.0.1.

Run in parallel (``make test``: pytest-xdist, ``LOKI_TEST_WORKERS`` processes), each worker
has its own servers (the session fixtures above are per worker). Tests are handed out a file
at a time (module fixtures are built once), except the folders of :data:`ONE_WORKER`, whose
files share one resource outside the process (the compose check's Docker project) and run on
one worker, one after another; the slowest folders are handed out first (:data:`FIRST`) so
the run does not end on one long file.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loki_shared import credentials, servers

# The servers' start-up lives once, in loki_shared.servers (the launcher and the benchmarks
# use it too); tests that start their own import start_nats / start_redis from here, which
# add the session's credentials.
RunningServer = servers.RunningServer

#: The test harness's NATS user: every permission (it plays the services' peers).
TEST_USER = "test"


@dataclass(frozen=True)
class SessionAuth:
    """The passwords of this test session: every user of the table, Redis, the harness."""

    creds: credentials.Credentials
    test_password: str

    def nats_extra(self) -> dict[str, tuple[str, dict[str, object]]]:
        return {TEST_USER: (self.test_password, {})}

    def redis_extra(self) -> dict[str, tuple[str, list[str]]]:
        return {TEST_USER: (self.test_password, ["~*", "&*", "+@all"])}


AUTH = SessionAuth(credentials.Credentials.generate(), secrets.token_urlsafe(16))


def _conf_path(data_dir: Path, kind: str) -> Path:
    return data_dir.parent / f"{data_dir.name}.{kind}-auth.conf"


def start_nats(data_dir: Path, **kwargs: Any) -> RunningServer:
    """:func:`loki_shared.servers.start_nats` with authorization on (every user of
    :mod:`loki_shared.permissions` and ``test``); the returned URL logs in as ``test``."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    conf = credentials.write_nats_config(
        _conf_path(data_dir, "nats"), AUTH.creds, extra=AUTH.nats_extra()
    )
    server = servers.start_nats(data_dir, config=conf, **kwargs)
    server.url = credentials.with_userinfo(server.url, TEST_USER, AUTH.test_password)
    return server


def start_nats_cluster(data_dir: Path, size: int = 3) -> dict[str, RunningServer]:
    """``size`` NATS servers (:func:`start_nats`, JetStream on) clustered on loopback as
    ``loki``, named ``n0``, ``n1``...; each one's data under ``data_dir/<name>``. The caller
    stops them (``stop(grace=2)``)."""
    client_ports = [servers.free_port() for _ in range(size)]
    route_ports = [servers.free_port() for _ in range(size)]
    nodes: dict[str, RunningServer] = {}
    for i in range(size):
        routes = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i)
        nodes[f"n{i}"] = start_nats(
            data_dir / f"n{i}",
            port=client_ports[i],
            extra=[
                "--name", f"n{i}",
                "--cluster_name", "loki",
                "--cluster", f"nats://127.0.0.1:{route_ports[i]}",
                "--routes", routes,
            ],
        )  # fmt: skip
    return nodes


def start_redis(data_dir: Path, **kwargs: Any) -> RunningServer:
    """:func:`loki_shared.servers.start_redis` with the ACL users (the session's passwords)
    and ``test``; the returned URL logs in as ``test``."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    conf = credentials.write_redis_config(
        _conf_path(data_dir, "redis"), AUTH.creds, extra=AUTH.redis_extra()
    )
    server = servers.start_redis(data_dir, config=conf, **kwargs)
    server.url = credentials.with_userinfo(server.url, TEST_USER, AUTH.test_password)
    return server


def login_env(user: str) -> dict[str, str]:
    """``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD`` / ``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD`` of ``user`` (a
    user of the table): a service process given these logs in as itself, whatever login its
    URLs carry."""
    return credentials.service_env(AUTH.creds, user)


#: ``url`` without the login in it.
plain_url = credentials.without_userinfo


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


@pytest.fixture
def http_mcp() -> Iterator[Callable[..., tuple[str, subprocess.Popen[bytes]]]]:
    """Start the test MCP server (``tests/fakes/mcp_server.py``) on Streamable HTTP:
    ``start(port=None, env=None)`` -> (url, process); every one is killed after the test."""
    from tests.fakes.mcp_server import SERVER, SLOW

    procs: list[subprocess.Popen[bytes]] = []

    def start(
        port: int | None = None, env: dict[str, str] | None = None
    ) -> tuple[str, subprocess.Popen[bytes]]:
        port = port or servers.free_port()
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(port)],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + SLOW
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server not up"
                time.sleep(0.2)
        return f"http://127.0.0.1:{port}/mcp", proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


#: Folders whose files share something outside the worker (the compose check's one Docker
#: project ``loki-check`` and its images): all of their tests go to one worker.
ONE_WORKER = ("tests/compose/",)

#: Folders handed out first: the longest units (the compose check builds and brings up a
#: whole stack; the chaos, end-to-end and lifecycle files start whole stacks).
FIRST = ("tests/compose/", "tests/chaos/", "tests/e2e/", "tests/lifecycle/")


def _unit(nodeid: str) -> str:
    """The unit a test is handed out in: its file, or its folder in :data:`ONE_WORKER`."""
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in ONE_WORKER if path.startswith(folder)), path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, order the units so the longest (:data:`FIRST`) are handed
    out first; the order of tests inside a file is kept. A run in one process keeps the
    collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, folder in enumerate(FIRST) if path.startswith(folder)), len(FIRST))

    items.sort(key=rank)  # stable: within a rank, collection order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler by scope, the scope being :func:`_unit`, handed out in the
    order :func:`pytest_collection_modifyitems` made (not by test count)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)
