"""The one engine-lease client (``loki_shared.lease``), against the REAL supervisor
(``python -m loki_supervisor`` following the scripted fake engine through
``LOKI_ENGINE_URL``, one slot, ``LOKI_LEASE_TTL=1.5``) on a NATS of its own: renewal every
``ttl/3``, expiry of a lease that is not renewed, release on every way out (body returned,
raised, cancelled; cancelled or stopped while waiting), refusals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from loki_shared import subjects
from loki_shared.lease import LeaseError, LeaseStopped, lease, renew_interval, requester
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, LeaseRequest
from loki_shared.nats import make_broker
from tests.conftest import login_env, start_nats
from tests.fakes.fake_engine import FakeEngine

TTL = 1.5


@pytest.fixture(scope="module")
def lease_nats(tmp_path_factory) -> Iterator[str]:
    server = start_nats(tmp_path_factory.mktemp("lease-nats") / "nats")
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def supervisor(lease_nats: str, redis_url: str, tmp_path_factory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("lease-sup")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=lease_nats,
        **login_env("engine-supervisor"),
        LOKI_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/9",  # a database of its own
        LOKI_HOME=str(home),
        LOKI_SECRET_KEY="lease-test-secret-0123456789",
        LOKI_LEASE_TTL=str(TTL),
        LOKI_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    log_path = home / "supervisor.log"
    with FakeEngine() as engine, open(log_path, "wb") as log:
        env["LOKI_ENGINE_URL"] = engine.url
        proc = subprocess.Popen(
            [sys.executable, "-m", "loki_supervisor"], env=env, stdout=log, stderr=log
        )
        try:
            asyncio.run(_wait_ready(lease_nats, proc, log_path))
            yield log_path
        finally:
            proc.terminate()
            proc.wait(30)


async def _wait_ready(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    nc = await nats.connect(url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail("supervisor exited:\n" + log_path.read_text()[-3000:])
            try:
                if (await _info(nc)).state == "ready":
                    return
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                pass
            await asyncio.sleep(0.1)
        pytest.fail("supervisor not ready:\n" + log_path.read_text()[-3000:])
    finally:
        await nc.drain()


async def _info(nc) -> EngineInfo:
    msg = await nc.request(
        subjects.ENGINE_INFO, EngineInfoRequest().model_dump_json().encode(), timeout=2
    )
    return EngineInfo.model_validate_json(msg.data)


@pytest.fixture
async def nc(lease_nats: str, supervisor: Path) -> AsyncIterator[nats.aio.client.Client]:
    client = await nats.connect(lease_nats)
    yield client
    await client.drain()


def foreign(wait_s: float = 5.0) -> LeaseRequest:
    return LeaseRequest(kind="foreign", wait_s=wait_s)


async def held_count(nc) -> int:
    return (await _info(nc)).in_flight


async def settle(nc, expected: int = 0, within: float = 1.0) -> int:
    """Leases held once the count reaches ``expected`` or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    count = await held_count(nc)
    while count != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        count = await held_count(nc)
    return count


def test_renewal_is_every_third_of_the_ttl():
    assert renew_interval(30.0) == 10.0
    assert renew_interval(TTL) == 0.5
    assert renew_interval(0.0) is None


async def test_held_lease_is_renewed_and_keeps_its_slot_past_its_ttl(nc):
    async with lease(nc, foreign()) as held:
        assert held.lease.ttl_s == TTL and held.lease.base_url
        await asyncio.sleep(3 * TTL)  # unrenewed, it would have expired twice over
        # the one slot is still ours: another request waits for it, then is refused
        with pytest.raises(LeaseError) as err:
            async with lease(nc, foreign(wait_s=0.5)):
                pass
        assert err.value.type == "busy"
        assert held.renewals >= 7 and not held.lost  # every 0.5 s (ttl/2 would give 6)
    assert held.released
    assert await held_count(nc) == 0


async def test_a_lease_not_renewed_expires_and_its_holder_learns_it(nc, supervisor):
    base = requester(nc)
    renewals_blocked = True

    async def renewals_lost(subject: str, payload: bytes, timeout: float) -> bytes:
        if subject == subjects.ENGINE_RENEW and renewals_blocked:
            raise nats.errors.TimeoutError  # the holder's renewals do not get through
        return await base(subject, payload, timeout)

    async with lease(renewals_lost, foreign()) as stalled:
        t0 = time.monotonic()
        async with lease(nc, foreign(wait_s=10)) as other:  # granted once the first expires
            waited = time.monotonic() - t0
            assert other.lease.lease_id != stalled.lease.lease_id
        assert TTL - 0.2 <= waited <= TTL + 1.5
        renewals_blocked = False
        deadline = time.monotonic() + 3
        while not stalled.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert stalled.lost and stalled.renewals == 0
    assert not stalled.released  # the supervisor no longer held it
    assert await held_count(nc) == 0
    assert "expired" in supervisor.read_text()


async def test_released_when_the_body_raises_or_is_cancelled(nc):
    with pytest.raises(RuntimeError):
        async with lease(nc, foreign()) as held:
            assert await held_count(nc) == 1
            raise RuntimeError("the request failed")
    assert held.released and await held_count(nc) == 0

    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with lease(nc, foreign()):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold_forever())
    await asyncio.wait_for(entered.wait(), 5)
    assert await held_count(nc) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await settle(nc, 0) == 0


async def test_a_detached_exit_does_not_wait_for_the_release(nc):
    """``detach`` answering True at the exit (a process stopping): the holder goes on before
    the supervisor answers, and the release still arrives in the background; False: the exit
    waits for the answer as usual."""
    answered = asyncio.Event()

    async def slow_request(subject: str, payload: bytes, timeout: float) -> bytes:
        reply = await requester(nc)(subject, payload, timeout)
        if subject == subjects.ENGINE_RELEASE:
            await asyncio.sleep(0.5)  # a supervisor slow to answer
            answered.set()
        return reply

    for detached in (True, False):
        answered.clear()
        async with lease(slow_request, foreign(), detach=lambda d=detached: d) as held:
            assert await held_count(nc) == 1
        assert answered.is_set() is not detached
        assert held.released is not detached
        await asyncio.wait_for(answered.wait(), 5)
        assert await settle(nc, 0) == 0


async def test_a_lease_granted_after_its_waiter_left_is_released_at_once(nc):
    """Cancelled while waiting, or stopped while waiting: when the supervisor grants the
    lease after that, it is released at once, not left to expire (TTL 1.5 s)."""
    for how in ("cancel", "stop"):
        async with lease(nc, foreign()):
            stop = asyncio.Event()
            waiter = asyncio.create_task(_enter(nc, stop))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            if how == "cancel":
                waiter.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiter
            else:
                stop.set()
                with pytest.raises(LeaseStopped):
                    await waiter
        # the holder left: the supervisor grants the slot to the gone waiter, whose
        # client releases it (expiry would take 1.5 s and more)
        assert await settle(nc, 0, within=1.0) == 0, how
        async with lease(nc, foreign(wait_s=0.5)) as again:  # free for the next one
            assert again.lease.lease_id


async def _enter(nc, stop: asyncio.Event) -> None:
    async with lease(nc, foreign(wait_s=10), stop=stop):
        pytest.fail("the waiter should not have been served")


async def test_through_a_faststream_broker_and_refusals(lease_nats, nc, tmp_path):
    broker = make_broker(lease_nats, "lease-test")
    await broker.start()
    try:
        async with lease(broker, foreign()) as held:
            assert await held_count(nc) == 1
            held.report(prompt_tokens=12, cached_tokens=8)
        assert held.released and held.release_reply is not None and held.release_reply.ok
        assert await held_count(nc) == 0
    finally:
        await broker.stop()
    # nobody answers: a LeaseError of type no_answer, quickly
    lonely = start_nats(tmp_path / "lonely")
    try:
        other = await nats.connect(lonely.url)
        try:
            with pytest.raises(LeaseError) as err:
                async with lease(other, foreign(wait_s=1)):
                    pass
            assert err.value.type == "no_answer"
        finally:
            await other.drain()
    finally:
        lonely.stop()
