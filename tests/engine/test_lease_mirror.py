"""The lease mirror (replicated supervisors, issue 44) against a real Redis: the leader's held
leases and slot book written fenced by its term, loaded back by a new leader (renewals keep
working, api keys never stored), an old leader's write refused."""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis

from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import LeaseRequest
from loki_supervisor.leadership import LEADER_KEY, Term
from loki_supervisor.lease_book import EngineTarget, LeaseManager, PoolRouting, Target
from loki_supervisor.lease_mirror import BOOK_KEY, LEASES_KEY, Fenced, LeaseMirror
from loki_supervisor.routing import EngineView
from loki_supervisor.slot_book import SlotBook
from tests.conftest import AUTH, login_env

ONE = EngineView(external=False, total_slots=1, slot_n_ctx=(2048,), ctx=2048)
TWO = EngineView(external=False, total_slots=2, slot_n_ctx=(2048, 2048), ctx=2048)
SECRET_KEY = "sk-engine-key-never-in-redis"


def target(url: str = "http://127.0.0.1:1", view: EngineView = ONE) -> Target:
    return Target(base_url=url, model="m", api_key=SECRET_KEY, view=view, n_ctx=2048)


@pytest.fixture
async def r(redis_db: str):
    """The session Redis (emptied) as the supervisor's own ACL user."""
    user = login_env("engine-supervisor")
    client = aioredis.Redis.from_url(
        redis_db, username=user["LOKI_REDIS_USER"], password=user["LOKI_REDIS_PASSWORD"]
    )
    assert AUTH.creds.redis["engine-supervisor"] == user["LOKI_REDIS_PASSWORD"]
    yield client
    await client.aclose()


async def lead(r, epoch: int, instance: str) -> Term:
    term = Term(epoch, instance)
    await r.set(LEADER_KEY, term.value, px=30_000)
    return term


def ask(conversation: str, kind: str = "main", holder: str = "chat-1", **kw) -> LeaseRequest:
    return LeaseRequest(kind=kind, conversation=conversation, holder=holder, wait_s=2, **kw)


async def test_round_trip_a_new_leader_keeps_the_leases_and_renewals_work(r):
    term = await lead(r, 1, "a")
    old = LeaseManager(lambda: target(view=TWO), ttl=6.0, claim_s=2.0)
    mirror = LeaseMirror(r, old, lambda: term)
    first = await old.acquire(ask("c1"))
    second = await old.acquire(ask("c2", kind="verify", holder="chat-2"))
    old.renew(first.lease_id)  # claimed; the second is not
    assert await mirror.sync()

    stored = await r.hgetall(LEASES_KEY)
    assert {k.decode() for k in stored} == {first.lease_id, second.lease_id}
    raw = b"".join(stored.values()).decode()
    assert SECRET_KEY not in raw and "api_key" not in raw

    # the old leader dies; a new one loads the mirror before granting
    await lead(r, 2, "b")
    new = LeaseManager(lambda: target(view=TWO), ttl=6.0, claim_s=2.0)
    before = time.monotonic()
    loaded = LeaseMirror(r, new, lambda: Term(2, "b"))
    assert await loaded.load(lambda lease: SECRET_KEY) == 2
    h1, h2 = new.held[first.lease_id], new.held[second.lease_id]
    assert (h1.queue, h1.conversation, h1.holder, h1.claimed) == (
        old.held[first.lease_id].queue,
        "c1",
        "chat-1",
        True,
    )
    assert (h2.conversation, h2.holder, h2.claimed) == ("c2", "chat-2", False)
    assert h1.lease == first.model_copy(update={"api_key": SECRET_KEY})
    # the takeover is not counted against the holders: a full TTL (claimed), a claim window
    assert h1.deadline >= before + 6.0 and h2.deadline >= before + 2.0
    assert new.renew(first.lease_id).lease_id == first.lease_id
    assert new.renew(second.lease_id).lease_id == second.lease_id
    # and the slots are still taken: a third main request for slot 0 waits
    assert new.in_flight == 2


async def test_release_and_expiry_are_written_and_nothing_when_nothing_changed(r):
    term = await lead(r, 3, "a")
    lm = LeaseManager(lambda: target(), ttl=6.0, claim_s=0.05)
    mirror = LeaseMirror(r, lm, lambda: term)
    kept = await lm.acquire(ask("c1"))
    lm.renew(kept.lease_id)
    await mirror.sync()
    writes = mirror.writes
    assert await mirror.sync() and mirror.writes == writes  # no change: no write
    lm.release(kept.lease_id)
    gone = await lm.acquire(ask("c2"))  # never claimed: expires after 0.05 s
    await mirror.sync()
    assert set(await r.hkeys(LEASES_KEY)) == {gone.lease_id.encode()}
    time.sleep(0.1)
    assert [h.lease.lease_id for h in lm.expire()] == [gone.lease_id]
    await mirror.sync()
    assert await r.hlen(LEASES_KEY) == 0


async def test_an_old_leaders_write_is_refused(r):
    old_term = await lead(r, 4, "a")
    lm = LeaseManager(lambda: target(view=TWO), ttl=6.0)
    mirror = LeaseMirror(r, lm, lambda: old_term)
    await lm.acquire(ask("c1"))
    await mirror.sync()
    await lead(r, 5, "b")  # a takes too long; its key expired and b leads now
    await lm.acquire(ask("c2", kind="verify"))  # a still thinks it leads
    with pytest.raises(Fenced):
        await mirror.sync()
    assert mirror.refused == 1
    assert await r.hlen(LEASES_KEY) == 1  # only what a wrote while it led
    # nor does a term of the same instance with another epoch pass
    stale = LeaseMirror(r, lm, lambda: Term(4, "b"))
    with pytest.raises(Fenced):
        await stale.sync()


async def test_not_leading_writes_nothing(r):
    lm = LeaseManager(lambda: target(), ttl=6.0)
    await lm.acquire(ask("c1"))
    assert await LeaseMirror(r, lm, lambda: None).sync() is False
    assert await r.exists(LEASES_KEY) == 0


async def test_a_lease_long_past_its_deadline_is_not_loaded(r):
    term = await lead(r, 6, "a")
    lm = LeaseManager(lambda: target(), ttl=6.0)
    mirror = LeaseMirror(r, lm, lambda: term)
    lease = await lm.acquire(ask("c1"))
    lm.held[lease.lease_id].deadline = time.monotonic() - 60  # every supervisor was down
    await mirror.sync()
    new = LeaseManager(lambda: target(), ttl=6.0)
    assert await LeaseMirror(r, new, lambda: None, grace_s=8.0).load() == 0
    assert new.held == {}


def _pool(book: SlotBook) -> PoolRouting:
    """One engine of one slot: the second conversation's grant evicts the first's prompt."""

    def engines() -> list[EngineTarget]:
        return [EngineTarget("gpu0", 0, 1, target("http://gpu0.test:1", ONE))]

    return PoolRouting(engines=engines, book=book)


async def test_pool_mode_placement_and_slot_book_round_trip(r):
    term = await lead(r, 7, "a")
    lm = LeaseManager(lambda: None, ttl=6.0, claim_s=6.0, pool=_pool(SlotBook()))
    mirror = LeaseMirror(r, lm, lambda: term)
    prints = fingerprints([{"role": "user", "content": "hello"}])
    first = await lm.acquire(ask("c1", prompt_fingerprints=prints))
    lm.release(first.lease_id)
    second = await lm.acquire(ask("c2"))  # another conversation: the held lease has a slot
    await mirror.sync()
    book_text = (await r.get(BOOK_KEY)).decode()
    assert "c1" in book_text and SECRET_KEY not in book_text
    assert json.loads(book_text)["version"] == 1

    new_book: list[SlotBook] = []
    new = LeaseManager(lambda: None, ttl=6.0, pool=_pool(SlotBook()))
    loaded = LeaseMirror(r, new, lambda: None, on_book=new_book.append)
    assert await loaded.load() == 1
    held, was = new.held[second.lease_id], lm.held[second.lease_id]
    assert (held.slot, held.fingerprints, held.queue) == (was.slot, was.fingerprints, was.queue)
    assert held.lease.placement == second.placement and held.lease.placement is not None
    assert held.slot == ("gpu0", 0)
    assert was.occupant is not None and held.occupant is not None
    assert held.occupant.conversation == "c1"
    assert held.occupant.fingerprints == was.occupant.fingerprints == tuple(prints)
    assert abs(held.occupant.last_used - was.occupant.last_used) < 0.5
    [book] = new_book
    engine, slot = first.placement.engine, first.placement.id_slot
    assert book.last_engine("c1") == lm.pool.book.last_engine("c1") == engine
    entry = book.entry(engine, slot)
    assert entry is not None and entry.conversation == "c2"  # the slot's last grant
    # without on_book the pool's book is replaced
    plain = LeaseManager(lambda: None, ttl=6.0, pool=_pool(SlotBook()))
    await LeaseMirror(r, plain, lambda: None).load()
    assert plain.pool is not None and plain.pool.book.last_engine("c1") == engine


async def test_the_pool_counters_go_on_after_a_takeover(r):
    """The per-engine counters (``/api/engine``'s grants, moves, restores, saves) are
    mirrored with the slot book: a new leader goes on counting where the old one stopped."""
    from loki_supervisor.engine_pool import EnginePool, parse_engine_urls

    async def quiet(*_: object) -> None:
        return None

    old = EnginePool(parse_engine_urls("gpu0=http://gpu0.test:1,gpu1=http://gpu1.test:1"), quiet)
    new = EnginePool(parse_engine_urls("gpu0=http://gpu0.test:1,gpu1=http://gpu1.test:1"), quiet)
    try:
        term = await lead(r, 8, "a")
        lm = LeaseManager(lambda: None, ttl=6.0, pool=_pool(SlotBook()))
        mirror = LeaseMirror(r, lm, lambda: term, counters=old.counter_values)
        gpu0 = old.get("gpu0")
        assert gpu0 is not None
        gpu0.counters.grants, gpu0.counters.moves_in, gpu0.counters.restores = 5, 2, 1
        await mirror.sync()
        gpu0.counters.saves = 3  # a count alone changes what is written
        await mirror.sync()
        taken = LeaseManager(lambda: None, ttl=6.0, pool=_pool(SlotBook()))
        await LeaseMirror(r, taken, lambda: None, on_counters=new.set_counters).load()
        assert new.counter_values() == {
            "gpu0": {"grants": 5, "moves_in": 2, "restores": 1, "saves": 3},
            "gpu1": {"grants": 0, "moves_in": 0, "restores": 0, "saves": 0},
        }
        # what it cannot use is left alone: an unknown engine, name, or a value not a count
        new.set_counters({"gpu9": {"grants": 1}, "gpu1": {"grants": "7", "dance": 2}})
        assert new.counter_values()["gpu1"]["grants"] == 0
    finally:
        await old.close()
        await new.close()
