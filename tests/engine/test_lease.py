"""The lease manager: one request per slot at a time, FIFO per slot, queues independent,
expiry of a dead holder, renewal, waiting for a ready engine."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from loki_shared.messages.engine import LeaseRequest
from loki_supervisor.errors import Busy, NotFound, Unavailable
from loki_supervisor.lease_book import LeaseManager, Target
from loki_supervisor.routing import EngineView

TWO = EngineView(external=False, total_slots=2, slot_n_ctx=(2048, 2048), ctx=2048)
ONE = EngineView(external=False, total_slots=1, slot_n_ctx=(2048,), ctx=2048)
EXT = EngineView(external=True, total_slots=0, slot_n_ctx=(), ctx=2048)


def manager(view, ttl=30.0):
    state = {"target": Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=view)}
    return LeaseManager(lambda: state["target"], ttl=ttl), state


target = Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE)


def req(kind="main", wait=5.0, **kw):
    return LeaseRequest(kind=kind, conversation="c1", wait_s=wait, **kw)


async def test_one_slot_is_fifo_one_at_a_time():
    lm, _ = manager(ONE)
    first = await lm.acquire(req("main"))
    assert first.id_slot is None and first.shares_main_slot and first.api_key == "k"
    order: list[str] = []

    async def take(kind):
        lease = await lm.acquire(req(kind))
        order.append(kind)
        return lease

    t1 = asyncio.create_task(take("verify"))
    await asyncio.sleep(0.01)
    t2 = asyncio.create_task(take("main"))
    await asyncio.sleep(0.05)
    assert order == [] and lm.waiting == 2
    lm.release(first.lease_id)
    l1 = await t1
    await asyncio.sleep(0.05)
    assert order == ["verify"] and not t2.done()
    lm.release(l1.lease_id)
    await t2
    assert order == ["verify", "main"]


async def test_two_slots_queues_do_not_block_each_other():
    lm, _ = manager(TWO)
    main = await lm.acquire(req("main"))
    side = await lm.acquire(req("verify"))
    assert (main.id_slot, side.id_slot) == (0, 1)
    assert main.shares_main_slot and not side.shares_main_slot
    # slot 1 busy: a second side request waits, a second main request for slot 0 too.
    waiting_side = asyncio.create_task(lm.acquire(req("subagent")))
    await asyncio.sleep(0.02)
    lm.release(main.lease_id)
    main2 = await asyncio.wait_for(lm.acquire(req("main")), 1)
    assert main2.id_slot == 0 and not waiting_side.done()
    lm.release(side.lease_id)
    assert (await asyncio.wait_for(waiting_side, 1)).id_slot == 1


async def test_wait_bounded_busy_and_unavailable():
    lm, state = manager(ONE)
    held = await lm.acquire(req())
    with pytest.raises(Busy):
        await lm.acquire(req(wait=0.1))
    assert lm.waiting == 0
    lm.release(held.lease_id)
    state["target"] = None
    with pytest.raises(Unavailable):
        await lm.acquire(req(wait=0.1))


async def test_waiter_is_served_when_engine_becomes_ready():
    lm, state = manager(ONE)
    saved, state["target"] = state["target"], None
    task = asyncio.create_task(lm.acquire(req(wait=2)))
    await asyncio.sleep(0.05)
    assert not task.done()
    state["target"] = saved
    lm.pump()
    assert (await asyncio.wait_for(task, 1)).lease_id


async def test_dead_holder_lease_expires_and_next_waiter_gets_the_slot():
    lm, _ = manager(ONE, ttl=0.3)
    lm.start()
    try:
        await lm.acquire(req())  # never released: its holder "died"
        nxt = await asyncio.wait_for(lm.acquire(req(wait=5)), 3)
        assert nxt.lease_id and lm.in_flight == 1
    finally:
        await lm.close()


async def test_renewal_keeps_a_lease_and_release_twice_is_not_found():
    lm, _ = manager(ONE, ttl=0.4)
    lm.start()
    try:
        lease = await lm.acquire(req())
        for _ in range(4):
            await asyncio.sleep(0.2)
            lm.renew(lease.lease_id)
        assert lm.in_flight == 1
        lm.release(lease.lease_id)
        with pytest.raises(NotFound):
            lm.release(lease.lease_id)
        with pytest.raises(NotFound):
            lm.renew(lease.lease_id)
    finally:
        await lm.close()


async def test_a_grant_never_claimed_is_given_back_after_the_claim_window():
    """Issue 22: a waiter that died before its grant arrived (a killed chat instance) holds
    the slot for the claim window, not the TTL; a claimed lease lives its TTL."""
    lm = LeaseManager(lambda: target, ttl=30.0, claim_s=0.3)
    lm.start()
    try:
        t0 = asyncio.get_running_loop().time()
        await lm.acquire(req())  # granted, never renewed: nobody received it
        nxt = await asyncio.wait_for(lm.acquire(req(wait=5)), 3)
        assert asyncio.get_running_loop().time() - t0 < 2.0
        lm.renew(nxt.lease_id)  # the claim
        await asyncio.sleep(0.8)
        assert nxt.lease_id in lm.held  # past the claim window, within the TTL
    finally:
        await lm.close()


async def test_an_unclaimed_grant_drops_its_holders_other_waiters_and_leases():
    lm = LeaseManager(lambda: target, ttl=0.5, claim_s=0.3)
    other = await lm.acquire(req(kind="verify", holder="chat-a:1"))
    lm.renew(other.lease_id)  # claimed, then the process died with its waiters queued
    lm.release(other.lease_id)
    dead_held = await lm.acquire(req(holder="chat-a:1"))
    lm.renew(dead_held.lease_id)
    dead_waiters = [asyncio.create_task(lm.acquire(req(wait=30, holder="chat-a:1")))]
    await asyncio.sleep(0.02)
    await asyncio.sleep(0.6)  # its last renewal is a TTL old: the holder died
    lm.release(dead_held.lease_id)  # the first dead waiter is granted; nobody claims it
    await asyncio.sleep(0)
    dead_waiters.append(asyncio.create_task(lm.acquire(req(wait=30, holder="chat-a:1"))))
    live = asyncio.create_task(lm.acquire(req(wait=30, holder="chat-b:2")))
    await asyncio.sleep(0.02)
    lm.start()
    try:
        granted = await asyncio.wait_for(live, 2)  # one claim window, not one per dead waiter
        assert granted.lease_id in lm.held
        with pytest.raises(Unavailable):
            await dead_waiters[1]
        assert lm.waiting == 0
    finally:
        await lm.close()


async def test_a_late_claim_of_a_holder_that_renewed_lately_drops_nothing_else():
    """A live holder (renewed within the TTL) whose claim was late loses that grant only."""
    lm = LeaseManager(lambda: target, ttl=30.0, claim_s=0.3)
    held = await lm.acquire(req(holder="chat-a:1"))
    lm.renew(held.lease_id)
    waiter = asyncio.create_task(lm.acquire(req(wait=30, holder="chat-a:1")))
    await asyncio.sleep(0.02)
    lm.release(held.lease_id)  # the waiter is granted; its claim does not come in time
    await asyncio.sleep(0.02)
    later = asyncio.create_task(lm.acquire(req(wait=30, holder="chat-a:1")))
    await asyncio.sleep(0.02)
    lm.start()
    try:
        assert (await asyncio.wait_for(later, 2)).lease_id  # served, not refused
        assert (await waiter).lease_id
    finally:
        await lm.close()


async def test_an_expired_lease_is_logged_with_why_it_went(caplog):
    caplog.set_level(logging.WARNING, logger="loki_supervisor.lease")
    lm = LeaseManager(lambda: target, ttl=30.0, claim_s=0.3)
    first = await lm.acquire(req(holder="chat-a:1"))
    lm.renew(first.lease_id)  # chat-a is alive: it renewed just now
    lm.release(first.lease_id)
    late = await lm.acquire(req(holder="chat-a:1"))  # granted, its claim never comes
    assert lm.expire(time.monotonic() + 1.0)[0].lease.lease_id == late.lease_id
    said = caplog.records[-1].getMessage()
    assert late.lease_id in said and said.endswith("without release or renewal")
    orphan = await lm.acquire(req(holder="chat-b:2"))  # a holder never seen again
    lm.expire(time.monotonic() + 31.0)
    said = caplog.records[-1].getMessage()
    assert orphan.lease_id in said and said.endswith("(holder chat-b:2 gone)")


async def test_a_dead_holders_live_leases_go_with_its_unclaimed_grant():
    lm, _ = manager(TWO, ttl=30.0)
    t0 = time.monotonic()
    main = await lm.acquire(req("main", holder="chat-a:1", ttl_s=120))
    lm.renew(main.lease_id)  # claimed, good for 120 s; the holder last seen now
    side = await lm.acquire(req("verify", holder="chat-a:1"))  # never claimed
    gone = {h.lease.lease_id for h in lm.expire(t0 + 31.0)}  # chat-a silent past the TTL
    assert gone == {side.lease_id, main.lease_id}  # its live lease goes with it
    assert lm.held == {}


async def test_a_claimed_lease_that_expires_takes_nothing_else_with_it():
    """A lease its holder received (renewed once) and then stopped renewing goes alone:
    the holder's next request, queued behind it, is served, not refused."""
    lm, _ = manager(ONE, ttl=30.0)
    t0 = time.monotonic()
    first = await lm.acquire(req(holder="chat-a:1"))
    lm.renew(first.lease_id)
    queued = asyncio.create_task(lm.acquire(req(wait=60, holder="chat-a:1")))
    await asyncio.sleep(0.02)
    assert [h.lease.lease_id for h in lm.expire(t0 + 31.0)] == [first.lease_id]
    assert (await asyncio.wait_for(queued, 1)).lease_id in lm.held


async def test_closing_fails_every_waiter_at_once():
    lm = LeaseManager(lambda: None)  # the engine is not ready: requests wait
    waiters = [asyncio.create_task(lm.acquire(req(wait=30))) for _ in range(2)]
    await asyncio.sleep(0.02)
    assert lm.waiting == 2
    await lm.close()
    for waiter in waiters:
        with pytest.raises(Unavailable, match="supervisor stopping"):
            await asyncio.wait_for(waiter, 1)


async def test_external_preset_has_no_slot_and_no_limit():
    lm, _ = manager(EXT)
    leases = [await lm.acquire(req(k)) for k in ("main", "verify", "main", "foreign")]
    assert all(x.id_slot is None and x.external and not x.shares_main_slot for x in leases)
    assert lm.in_flight == 4


async def test_pause_holds_grants_until_resume():
    lm, _ = manager(ONE)
    lm.pause()
    task = asyncio.create_task(lm.acquire(req(wait=2)))
    await asyncio.sleep(0.05)
    assert not task.done()
    lm.resume()
    assert (await asyncio.wait_for(task, 1)).lease_id


async def test_lease_carries_the_step_cap_of_the_preset():
    """Issue 23: ``max_tokens`` per preset — its own value, else a quarter of the window on
    a local engine, none for an external preset; every lease carries it."""
    from loki_shared.messages.engine import Preset
    from loki_supervisor.presets import step_cap

    assert step_cap(Preset(id="p"), 2048) == 512
    assert step_cap(Preset(id="p", max_tokens=300), 2048) == 300
    assert step_cap(Preset(id="x", external=True), 2048) is None
    assert step_cap(Preset(id="x", external=True, max_tokens=1000), 2048) == 1000
    target = Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE, max_tokens=512)
    lm = LeaseManager(lambda: target, ttl=30.0)
    lease = await lm.acquire(req())
    assert lease.max_tokens == 512
    lm.release(lease.lease_id)


async def test_every_lease_says_whether_the_endpoint_sees_images():
    """Vision is read again at every lease (the chat offers ``see_image`` step by step): a
    target that loses its projector grants leases without vision from then on."""
    state = {"target": Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE)}
    lm = LeaseManager(lambda: state["target"], ttl=30.0)
    state["target"] = Target(
        base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE, vision=True
    )
    lease = await lm.acquire(req())
    assert lease.vision is True
    lm.release(lease.lease_id)
    state["target"] = Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE)
    lease = await lm.acquire(req())
    assert lease.vision is False
    lm.release(lease.lease_id)


@pytest.mark.parametrize("value,want", [(None, None), ("", None), ("on", True), ("off", False)])
async def test_lease_carries_the_preset_verify_feature(value, want):
    """Issue 19: a preset's feature ``VERIFY`` (on/off) rides on every lease; absent or
    empty: None (the chat's ``LOKI_VERIFY`` decides)."""
    from loki_shared.messages.engine import Preset
    from loki_supervisor.plan import tristate

    features = {} if value is None else {"VERIFY": value}
    verify = tristate(Preset(id="p", features=features).features.get("VERIFY"))
    assert verify is want
    target = Target(base_url="http://127.0.0.1:1", model="m", api_key="k", view=ONE, verify=verify)
    lm = LeaseManager(lambda: target, ttl=30.0)
    lease = await lm.acquire(req(kind="verify"))
    assert lease.verify is want and lease.kind == "verify"
    lm.release(lease.lease_id)
