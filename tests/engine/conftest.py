"""Fixtures of the engine supervisor tests: a real ``python -m loki_supervisor`` process on
the test NATS/Redis, launching the real llama-server with the bundled model (small CTX)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
import redis
from pydantic import BaseModel

from loki_shared import servers, subjects
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest
from loki_supervisor.presets import ACTIVE_KEY, PRESETS_KEY


@dataclass
class SupervisorProc:
    proc: subprocess.Popen
    env: dict[str, str]
    log_path: Path
    states: list[dict] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_pids(self) -> list[int]:
        """Child processes of the supervisor (the llama-server it launched)."""
        pids: list[int] = []
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        for task in task_dir.iterdir():
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode


def start_supervisor(env: dict[str, str], log_path: Path) -> SupervisorProc:
    """Run ``python -m loki_supervisor`` with ``env``; its output goes to ``log_path``."""
    fh = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loki_supervisor"],
        env=env,
        stdout=fh,
        stderr=subprocess.STDOUT,
    )
    return SupervisorProc(proc, env, log_path)


async def request(nc, subject: str, msg: BaseModel, reply_type, timeout: float = 10.0):
    """One NATS request with a pydantic message; reply decoded as ``reply_type``."""
    r = await nc.request(subject, msg.model_dump_json().encode(), timeout=timeout)
    return reply_type.model_validate_json(r.data)


async def wait_info(
    nc, predicate, timeout: float = 120.0, sup: SupervisorProc | None = None
) -> EngineInfo:
    """Poll ``loki.engine.info`` until ``predicate(info)``; fail with the supervisor log."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        if sup is not None and sup.proc.poll() is not None:
            pytest.fail(f"supervisor exited {sup.proc.returncode}:\n{sup.log()[-3000:]}")
        try:
            info = await request(nc, subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2)
            if predicate(info):
                return info
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        await asyncio.sleep(0.2)
    log = sup.log()[-3000:] if sup else ""
    pytest.fail(f"engine info never matched; last {info}\n{log}")


@pytest.fixture
def engine_env(service_env: dict[str, str], redis_url: str) -> dict[str, str]:
    """Supervisor environment: the real engine (found now: a missing one FAILS), CTX 2048.

    The session's Redis is shared: presets an earlier test stored (an ``env`` preset overrides
    the ``LOKI_*`` settings) are removed, so each supervisor starts from its environment."""
    servers.find_llama_server()
    servers.find_bundled_model()
    with redis.Redis.from_url(redis_url) as r:
        r.delete(PRESETS_KEY, ACTIVE_KEY)
    env = dict(service_env)
    env.update(LOKI_CTX="2048", LOKI_ENGINE_THREADS="2", LOKI_LOG_LEVEL="INFO")
    return env


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.aio.client.Client]:
    client = await nats.connect(nats_url)
    yield client
    await client.drain()


@pytest.fixture
def supervisor_factory(tmp_path: Path) -> Iterator:
    """Start supervisors; every one is stopped (SIGTERM) at the end of the test."""
    started: list[SupervisorProc] = []

    def make(env: dict[str, str], name: str = "sup") -> SupervisorProc:
        sup = start_supervisor(env, tmp_path / f"{name}.log")
        started.append(sup)
        return sup

    yield make
    for sup in started:
        sup.stop()


async def collect_states(nc, into: list[dict]):
    """Subscribe to ``loki.engine.state`` and append every event (as dict) to ``into``."""

    async def cb(msg):
        into.append(json.loads(msg.data))

    return await nc.subscribe(subjects.ENGINE_STATE, cb=cb)


def chat(
    base_url: str,
    content: str,
    id_slot: int | None = None,
    api_key: str | None = None,
    max_tokens: int = 4,
) -> dict:
    """One non-streamed chat completion against the engine; returns the JSON body."""
    import httpx

    body: dict = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_prompt": True,
    }
    if id_slot is not None:
        body["id_slot"] = id_slot
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    return r.json()


def port_of(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


def blocked_signals(pid: int) -> int:
    """The ``SigBlk`` mask of ``pid`` (``/proc/<pid>/status``), as an integer."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigBlk line for {pid}")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return False
