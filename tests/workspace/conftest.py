"""Fixtures of the workspace service tests (and of any test that needs the service: import
them, e.g. ``from tests.workspace.conftest import workspace_service, ask``).

- ``workspace``: the service in-process on the real NATS and Redis, its ``LOKI_HOME`` in the
  test's temporary folder (workspaces under ``LOKI_HOME/workspaces``).
- ``workspace_process``: ``python -m loki_workspace`` as a real process, logged in as its own
  NATS and Redis user, with a secret in its environment (:data:`SECRET_ENV`) that no sandbox
  may see; module-wide (each test uses its own project).
- :func:`ask`: one request on a ``loki.workspace.*`` subject, the reply parsed as the
  contract's model.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from pydantic import BaseModel

from loki_shared import servers, subjects
from loki_workspace.service import WorkspaceService
from loki_workspace.settings import Settings
from tests.conftest import login_env, plain_url

#: A variable set in the service process's environment: a sandboxed command must not see it.
SECRET_ENV = "LOKI_TEST_SANDBOX_SECRET"


def workspace_settings(nats_url: str, redis_url: str, home: Path, **kw: Any) -> Settings:
    """Settings of a service on these servers with ``LOKI_HOME`` = ``home``."""
    return Settings(nats_url=nats_url, redis_url=redis_url, home=home, **kw)


@pytest.fixture
async def workspace(
    nats_url: str, redis_db: str, tmp_path: Path
) -> AsyncIterator[WorkspaceService]:
    """The workspace service started in-process (``LOKI_HOME`` = ``tmp_path/home``)."""
    service = WorkspaceService(workspace_settings(nats_url, redis_db, tmp_path / "home"))
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.drain()


async def ask(nc: NATS, subject: str, timeout: float = 60.0, **fields: Any) -> Any:
    """Send the request of ``subject`` (its contract model built from ``fields``) and return
    the reply model (its ``error`` set when the service refused)."""
    row = subjects.EXCHANGES[subject]
    assert row.reply is not None
    body = row.request(**fields).model_dump_json().encode()
    msg = await nc.request(subject, body, timeout=timeout)
    reply: BaseModel = row.reply.model_validate_json(msg.data)
    return reply


def new_project() -> str:
    """A fresh project id (the module-wide process serves many tests)."""
    return "p" + secrets.token_hex(6)


@dataclass
class WorkspaceProcess:
    """The running ``python -m loki_workspace``: its process, environment and ``LOKI_HOME``."""

    proc: servers.ManagedProcess
    env: dict[str, str]
    home: Path

    def alive(self) -> bool:
        return self.proc.alive()


@pytest.fixture(scope="module")
def workspace_process(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkspaceProcess]:
    """``python -m loki_workspace`` on the real NATS and Redis as its own users, healthy."""
    home = tmp_path_factory.mktemp("ws-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        login_env("workspace"),
        LOKI_NATS_URL=plain_url(nats_url),
        LOKI_REDIS_URL=plain_url(redis_url),
        LOKI_HOME=str(home),
        LOKI_STOP_TIMEOUT_S="5",
        PYTHONUNBUFFERED="1",
    )
    env[SECRET_ENV] = "s3cr3t-" + secrets.token_hex(8)
    proc = servers.ManagedProcess("workspace", [sys.executable, "-m", "loki_workspace"], env=env)
    proc.start()
    try:
        health = [sys.executable, "-m", "loki_shared.health", "workspace"]
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(health, env=env, capture_output=True, timeout=20)
            if done.returncode == 0:
                break
            assert proc.alive(), "\n".join(proc.tail)
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.3)
        yield WorkspaceProcess(proc, env, home)
    finally:
        proc.stop(grace=5)


async def healthy(nc: NATS) -> bool:
    """Whether the workspace service answers its health subject ``ok``."""
    msg = await nc.request(subjects.health("workspace"), b"{}", timeout=5)
    return b'"ok":true' in msg.data.replace(b" ", b"")
