"""A lease waiter whose supervisor dies (``loki_shared.lease``, issue 22's chaos run): against
REAL supervisor processes (``python -m loki_supervisor`` following the scripted fake engine,
one slot) on a NATS of their own. The waiter queued behind a held lease is asked again of the
supervisor started after a ``kill -9``, and is granted within seconds, not at its NATS
timeout; a waiter behind a live supervisor is never asked twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from loki_shared import subjects
from loki_shared.lease import lease
from loki_shared.messages.engine import LeaseRequest
from tests.conftest import login_env, start_nats
from tests.fakes.fake_engine import FakeEngine
from tests.shared.test_lease import _info, _wait_ready


@pytest.fixture
def orphan_nats(tmp_path: Path) -> Iterator[str]:
    server = start_nats(tmp_path / "nats")
    yield server.url
    server.stop()


class Supervisors:
    """Starts supervisor processes (the same settings each time) and kills them."""

    def __init__(self, nats_url: str, redis_url: str, home: Path, engine_url: str) -> None:
        self.nats_url = nats_url
        self.home = home
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
        env.update(
            LOKI_NATS_URL=nats_url,
            **login_env("engine-supervisor"),
            LOKI_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/10",
            LOKI_HOME=str(home),
            LOKI_SECRET_KEY="lease-test-secret-0123456789",
            LOKI_LEASE_TTL="30",
            LOKI_ENGINE_URL=engine_url,
            PYTHONUNBUFFERED="1",
        )
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    async def start(self) -> subprocess.Popen[bytes]:
        log_path = self.home / f"supervisor-{len(self.procs)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "loki_supervisor"], env=self.env, stdout=log, stderr=log
            )
        self.procs.append(proc)
        await _wait_ready(self.nats_url, proc, log_path)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


@pytest.fixture
def supervisors(orphan_nats: str, redis_url: str, tmp_path: Path) -> Iterator[Supervisors]:
    with FakeEngine() as engine:
        sups = Supervisors(orphan_nats, redis_url, tmp_path, engine.url)
        try:
            yield sups
        finally:
            sups.stop_all()


def counting(nc, asked: Counter[str]):
    """A request function over ``nc`` that counts the requests by subject."""

    async def request(subject: str, payload: bytes, timeout: float) -> bytes:
        asked[subject] += 1
        return (await nc.request(subject, payload, timeout=timeout)).data

    return request


async def test_a_waiter_is_asked_again_of_the_supervisor_started_after_a_kill(
    orphan_nats, supervisors
):
    first = await supervisors.start()
    nc = await nats.connect(orphan_nats)
    asked: Counter[str] = Counter()
    try:
        boot = (await _info(nc)).boot
        assert boot
        holder = lease(nc, LeaseRequest(kind="foreign", wait_s=25))
        await holder.__aenter__()  # the one slot, held (never released by a dead process)

        async def wait_for_slot() -> float:
            t0 = time.monotonic()
            async with lease(counting(nc, asked), LeaseRequest(kind="foreign", wait_s=25)):
                return time.monotonic() - t0

        waiter = asyncio.create_task(wait_for_slot())
        await asyncio.sleep(1.5)  # queued behind the holder, its supervisor checked alive
        assert not waiter.done() and asked[subjects.ENGINE_LEASE] == 1
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        t_kill = time.monotonic()
        await supervisors.start()
        assert (await _info(nc)).boot != boot
        waited = await asyncio.wait_for(waiter, 25)
        granted_after_kill = time.monotonic() - t_kill
        print(f"granted {granted_after_kill:.1f} s after the kill (waited {waited:.1f} s)")
        assert asked[subjects.ENGINE_LEASE] == 2  # asked again once, of the new supervisor
        assert granted_after_kill < 15  # its NATS timeout was 30 s away
        await holder.__aexit__(None, None, None)  # its supervisor is gone: refused, fine
    finally:
        await nc.drain()


async def test_a_waiter_behind_a_live_supervisor_is_asked_once(orphan_nats, supervisors):
    await supervisors.start()
    nc = await nats.connect(orphan_nats)
    asked: Counter[str] = Counter()
    try:
        async with lease(nc, LeaseRequest(kind="foreign", wait_s=25)):
            waiter = asyncio.create_task(
                lease(counting(nc, asked), LeaseRequest(kind="foreign", wait_s=25)).__aenter__()
            )
            await asyncio.sleep(3.0)  # checks at 0.1, 1.1, 2.1 s: the same boot each time
            assert not waiter.done()
        held = await asyncio.wait_for(waiter, 10)
        await held.__aexit__(None, None, None)
        assert asked[subjects.ENGINE_LEASE] == 1
        assert asked[subjects.ENGINE_INFO] >= 2
    finally:
        await nc.drain()
