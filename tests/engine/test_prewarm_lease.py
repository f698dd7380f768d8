"""PREWARM on the supervisor's side: a ``prewarm`` lease is pre-empted by any real request for
its queue (revoked at once: its renewal is refused; the waiter gets the slot), never by
another prewarm; with two slots it goes to slot 0 and leaves slot 1 alone."""

from __future__ import annotations

import asyncio

import pytest

from loki_supervisor.errors import Busy, NotFound

from .test_lease import ONE, TWO, manager, req


@pytest.mark.parametrize("kind", ["main", "verify", "compact", "foreign"])
async def test_a_real_request_preempts_a_prewarm_at_once(kind):
    lm, _ = manager(ONE)
    warm = await lm.acquire(req("prewarm"))
    real = await asyncio.wait_for(lm.acquire(req(kind)), 1.0)  # not queued behind it
    assert real.kind == kind and lm.preempted == [warm.lease_id]
    with pytest.raises(NotFound):
        lm.renew(warm.lease_id)  # the holder learns it at its next renewal
    assert set(lm.held) == {real.lease_id}


async def test_a_prewarm_waits_behind_a_real_request_and_another_prewarm():
    lm, _ = manager(ONE)
    main = await lm.acquire(req("main"))
    with pytest.raises(Busy):  # a prewarm never pre-empts a real request
        await lm.acquire(req("prewarm", wait=0.2))
    lm.release(main.lease_id)
    warm = await lm.acquire(req("prewarm"))
    with pytest.raises(Busy):  # nor another prewarm
        await lm.acquire(req("prewarm", wait=0.2))
    assert lm.preempted == [] and set(lm.held) == {warm.lease_id}


async def test_two_slots_prewarm_goes_to_slot_0_and_only_slot_0_requests_preempt_it():
    lm, _ = manager(TWO)
    warm = await lm.acquire(req("prewarm"))
    assert warm.id_slot == 0
    side = await lm.acquire(req("verify"))  # slot 1: the prewarm stays
    assert side.id_slot == 1 and lm.preempted == []
    main = await asyncio.wait_for(lm.acquire(req("main")), 1.0)
    assert main.id_slot == 0 and lm.preempted == [warm.lease_id]
