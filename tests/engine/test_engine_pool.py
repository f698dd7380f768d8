"""The engine pool (issue 44, ``LOKI_ENGINE_URLS``): the entries parsed, the engines followed
(FakeEngines), the lease manager's pool mode (per engine-slot queues, cache-affine placement,
FIFO per slot, prewarm pre-emption, failover), and the supervisor process following two
FakeEngines over real NATS/Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    EngineState,
    Lease,
    LeaseRequest,
    Preset,
    ReleaseReply,
    ReleaseRequest,
)
from loki_supervisor.engine_pool import EnginePool, EngineSpec, parse_engine_urls
from loki_supervisor.errors import Busy, Unavailable
from loki_supervisor.lease_book import EngineTarget, LeaseManager, PoolRouting, Target
from loki_supervisor.pool_mode import PoolMode
from loki_supervisor.presets import ACTIVE_KEY, PRESETS_KEY
from loki_supervisor.routing import EngineView
from loki_supervisor.settings import Settings
from loki_supervisor.slot_book import SlotBook
from tests.engine.conftest import request, wait_info
from tests.fakes.fake_engine import FakeEngine

# ---------------------------------------------------------------------- LOKI_ENGINE_URLS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        (" , ", []),
        (
            "http://10.0.0.2:8080",
            [EngineSpec("10.0.0.2:8080", "default", "http://10.0.0.2:8080")],
        ),
        (
            "gpu0=http://10.0.0.2:8080/, gpu1@fast=https://box.lan",
            [
                EngineSpec("gpu0", "default", "http://10.0.0.2:8080"),
                EngineSpec("gpu1", "fast", "https://box.lan"),
            ],
        ),
        ("http://box.lan", [EngineSpec("box.lan:80", "default", "http://box.lan")]),
        ("http://[::1]:9000", [EngineSpec("[::1]:9000", "default", "http://[::1]:9000")]),
        (
            "a=http://h:1,http://h:2,",
            [EngineSpec("a", "default", "http://h:1"), EngineSpec("h:2", "default", "http://h:2")],
        ),
    ],
)
def test_engine_urls_parsed(text, expected):
    assert parse_engine_urls(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10.0.0.2:8080", "not an http(s) URL"),
        ("gpu0=ftp://h:1", "not an http(s) URL"),
        ("gpu0=", "not an http(s) URL"),
        ("bad name=http://h:1", "the name 'bad name'"),
        ("a/b=http://h:1", "the name 'a/b'"),
        ("a@=http://h:1", "the group ''"),
        ("a=http://h:1,a=http://h:2", "named twice"),
        ("http://h:1,http://h:1", "named twice"),
        ("a=http://h:99999", "bad port"),
    ],
)
def test_engine_urls_malformed_refused(text, says):
    with pytest.raises(ValueError, match="LOKI_ENGINE_URLS") as err:
        parse_engine_urls(text)
    assert says in str(err.value)


# ---------------------------------------------------------------------- lease manager, pool mode


def _target(url: str) -> Target:
    view = EngineView(external=False, total_slots=2, slot_n_ctx=(2048, 2048), ctx=2048)
    return Target(base_url=url, model="m", api_key=None, view=view, n_ctx=2048)


class Pool:
    """A pool of engines for the lease manager (no I/O): ``up`` says which are ready."""

    def __init__(self, *names: str, slots: int = 2, policy="affine", queue_max: int = 1):
        self.names = names
        self.slots = slots
        self.up = set(names)
        self.active = True
        self.book = SlotBook()
        self.routing = PoolRouting(
            engines=self.engines, book=self.book, policy=policy, queue_max=queue_max
        )

    def engines(self) -> list[EngineTarget] | None:
        if not self.active:
            return None
        return [
            EngineTarget(n, i, self.slots, _target(f"http://{n}.test:1"))
            for i, n in enumerate(self.names)
            if n in self.up
        ]


EXTERNAL = Target(
    base_url="https://api.test",
    model="x",
    api_key="k",
    view=EngineView(external=True, total_slots=0, slot_n_ctx=(), ctx=2048),
)


def manager(pool: Pool) -> LeaseManager:
    return LeaseManager(lambda: EXTERNAL, ttl=30.0, claim_s=30.0, pool=pool.routing)


def fps(*messages: str) -> list[str]:
    return fingerprints([{"role": "user", "content": m} for m in messages])


def ask(kind="main", conversation="A", prints=(), wait=5.0, **kw) -> LeaseRequest:
    return LeaseRequest(
        kind=kind,
        conversation=conversation,
        wait_s=wait,
        prompt_fingerprints=list(prints),
        **kw,
    )


async def test_pool_grant_names_engine_slot_and_queue():
    pool = Pool("a", "b")
    lm = manager(pool)
    lease = await lm.acquire(ask(prints=fps("sys", "hi")))
    assert lease.placement is not None
    assert (lease.placement.engine, lease.id_slot, lease.placement.reason) == ("a", 0, "new")
    assert lease.base_url == "http://a.test:1" and not lease.external and lease.shares_main_slot
    held = lm.held[lease.lease_id]
    assert held.queue == "a/slot0" and held.slot == ("a", 0)
    assert pool.book.entry("a", 0).conversation == "A"


async def test_pool_conversation_stays_on_its_slot_other_goes_to_least_loaded():
    pool = Pool("a", "b")
    lm = manager(pool)
    first = await lm.acquire(ask(prints=fps("s", "u1")))
    # B asks while A's turn runs: the least loaded engine is b
    b = await lm.acquire(ask(conversation="B", prints=fps("s2", "v1")))
    assert (b.placement.engine, b.placement.reason) == ("b", "new")
    lm.release(first.lease_id)
    lm.release(b.lease_id)
    second = await lm.acquire(ask(prints=fps("s", "u1", "r1")))
    assert (second.placement.engine, second.id_slot) == ("a", first.id_slot)
    assert (second.placement.reason, second.placement.prefix) == ("affine", 2)
    assert second.placement.moved_from is None


async def test_pool_side_job_goes_apart():
    pool = Pool("a", "b")
    lm = manager(pool)
    main = await lm.acquire(ask(prints=fps("s", "u1")))
    lm.release(main.lease_id)
    verify = await lm.acquire(ask(kind="verify", prints=fps("check")))
    assert (verify.placement.engine, verify.placement.reason) == ("b", "apart")
    assert not verify.shares_main_slot  # an empty slot: nobody's prompt evicted


async def test_pool_fifo_per_slot_then_overloaded_moves():
    pool = Pool("a", "b", queue_max=1)
    lm = manager(pool)
    p = fps("s", "u1")
    held = await lm.acquire(ask(prints=p))
    lm.release(held.lease_id)
    busy = await lm.acquire(ask(prints=p))  # A's slot busy now
    order: list[str] = []

    async def take(name: str) -> Lease:
        lease = await lm.acquire(ask(prints=p))
        order.append(name)
        return lease

    waiting = asyncio.create_task(take("first"))
    await asyncio.sleep(0.02)
    assert not waiting.done() and lm.slot_load()[("a", 0)] == (1, 1)
    moved = await asyncio.wait_for(take("second"), 1)  # beyond the bound: moved
    assert (moved.placement.engine, moved.placement.reason) == ("b", "overloaded")
    assert moved.placement.moved_from == "a"
    assert not waiting.done()
    lm.release(busy.lease_id)
    got = await asyncio.wait_for(waiting, 1)
    assert (got.placement.engine, got.id_slot, got.placement.reason) == ("a", 0, "affine")
    assert order == ["second", "first"]


async def test_pool_waiter_never_overtaken_on_its_slot():
    pool = Pool("a", slots=1, queue_max=5)
    lm = manager(pool)
    p = fps("s", "u1")
    holder = await lm.acquire(ask(prints=p))
    order: list[int] = []

    async def take(i: int) -> Lease:
        lease = await lm.acquire(ask(prints=p))
        order.append(i)
        lm.release(lease.lease_id)
        return lease

    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(take(i)))
        await asyncio.sleep(0.01)
    lm.release(holder.lease_id)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == [0, 1, 2]


async def test_pool_prewarm_preempted_by_the_turn():
    pool = Pool("a", slots=1)
    lm = manager(pool)
    p = fps("s", "u1")
    warm = await lm.acquire(ask(kind="prewarm", prints=p))
    turn = await asyncio.wait_for(lm.acquire(ask(prints=p)), 1)
    assert turn.id_slot == 0 and lm.preempted == [warm.lease_id]
    assert warm.lease_id not in lm.held
    # a prewarm never pre-empts: it waits
    with pytest.raises(Busy):
        await lm.acquire(ask(kind="prewarm", prints=p, wait=0.05))


async def test_pool_engine_gone_waiters_move_and_conversation_fails_over():
    pool = Pool("a", "b", slots=1)
    lm = manager(pool)
    p = fps("s", "u1")
    first = await lm.acquire(ask(prints=p))
    other = await lm.acquire(ask(conversation="B", prints=fps("t")))
    assert (first.placement.engine, other.placement.engine) == ("a", "b")
    lm.release(first.lease_id)
    blocker = await lm.acquire(ask(conversation="C", prints=fps("c")))
    assert blocker.placement.engine == "a"  # a's only slot: taken by C
    pending = asyncio.create_task(lm.acquire(ask(kind="verify", conversation="D")))
    await asyncio.sleep(0.02)
    assert not pending.done()
    # b dies: its slot's contents are gone; B's next turn fails over to a
    pool.up.discard("b")
    pool.book.forget_engine("b")
    lm.release(other.lease_id)  # the dead engine's lease ends
    lm.release(blocker.lease_id)
    got = await asyncio.wait_for(pending, 1)
    assert got.placement.engine == "a"
    lm.release(got.lease_id)
    again = await lm.acquire(ask(conversation="B", prints=fps("t", "r")))
    assert (again.placement.engine, again.placement.reason) == ("a", "failover")
    assert again.placement.moved_from == "b"


async def test_pool_without_ready_engine_is_unavailable():
    pool = Pool("a", "b")
    pool.up.clear()
    lm = manager(pool)
    with pytest.raises(Unavailable):
        await lm.acquire(ask(wait=0.05))


async def test_pool_inactive_works_as_one_target():
    pool = Pool("a")
    pool.active = False  # an external preset replaced the pool
    lm = manager(pool)
    lease = await lm.acquire(ask())
    assert lease.base_url == "https://api.test" and lease.placement is None
    assert lm.held[lease.lease_id].queue == "ext" and lm.held[lease.lease_id].slot is None


async def test_pool_round_robin_policy_turns():
    pool = Pool("a", "b", policy="round_robin")
    lm = manager(pool)
    got = []
    for conv in ("A", "B", "C"):
        lease = await lm.acquire(ask(conversation=conv, prints=fps(conv)))
        got.append((lease.placement.engine, lease.placement.reason))
        lm.release(lease.lease_id)
    assert got == [("a", "round_robin"), ("b", "round_robin"), ("a", "round_robin")]


# ---------------------------------------------------------------------- the followed engines


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_engine_pool_follows_each_engine_and_names_it_in_states():
    events: list[tuple[str, EngineState]] = []

    async def on_state(engine_id: str, event: EngineState) -> None:
        events.append((engine_id, event))

    with FakeEngine(total_slots=2, n_ctx=1024) as one, FakeEngine(total_slots=3) as two:
        specs = parse_engine_urls(f"one@fast={one.url},two={two.url}")
        pool = EnginePool(specs, on_state)
        try:
            await pool.follow()
            await _until(lambda: len(pool.ready()) == 2)
            assert [e.id for e in pool.ready()] == ["one", "two"]
            assert [e.id for e in pool.ready("fast")] == ["one"]
            first = pool.get("one")
            assert first is not None
            assert (first.total_slots, first.slot_n_ctx, first.n_ctx) == (2, [1024, 1024], 1024)
            assert first.model == "fake-model" and pool.state == "ready"
            ready = {(e, ev.engine) for e, ev in events if ev.state == "ready"}
            assert ready == {("one", "one"), ("two", "two")}
            book = SlotBook()
            book.granted("one", 1, kind="main", conversation="A", fingerprints=["f"], now=1.0)
            rows = pool.summaries(book, {("one", 1): (1, 2)})
            assert [(r.id, r.group, r.total_slots, r.in_flight, r.waiting) for r in rows] == [
                ("one", "fast", 2, 1, 2),
                ("two", "default", 3, 0, 0),
            ]
            slot = rows[0].slots[1]
            assert (slot.busy, slot.waiting, slot.conversation, slot.prefix) == (True, 2, "A", 1)
            two.stop()  # engine two dies
            await _until(lambda: [e.id for e in pool.ready()] == ["one"])
            down = [ev for e, ev in events if e == "two" and ev.state == "failed"]
            assert down and down[-1].engine == "two" and "/health" in down[-1].detail
            assert pool.state == "ready" and "1 of 2 engines ready" in pool.detail
        finally:
            await pool.close()


async def test_pool_mode_targets_follow_the_group_and_the_smallest_window():
    published: list[EngineState] = []

    async def publish(event: EngineState) -> None:
        published.append(event)

    active = {"preset": Preset(id="env", ctx=8192)}
    with FakeEngine(total_slots=2, n_ctx=4096) as a, FakeEngine(total_slots=1, n_ctx=1024) as b:
        settings = Settings(engine_urls=f"a={a.url},b@small={b.url}", affinity_queue_max=3)
        mode = PoolMode(settings, publish, lambda: active["preset"])
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            assert mode.targets() is None  # not followed yet
            await mode.pool.follow()
            await _until(lambda: len(mode.pool.ready()) == 2)
            assert {e.engine for e in published if e.state == "ready"} == {"a", "b"}
            got = [
                (t.engine, t.order, t.slots, t.target.n_ctx, t.target.base_url)
                for t in mode.targets()
            ]
            assert got == [("a", 0, 2, 1024, a.url), ("b", 1, 1, 1024, b.url)]
            assert lm.pool is not None and lm.pool.queue_max == 3 and lm.pool.policy == "affine"

            active["preset"] = Preset(id="p", ctx=512, features={"ENGINE_GROUP": "small"})
            assert [(t.engine, t.target.n_ctx) for t in mode.targets()] == [("b", 512)]
            lease = await lm.acquire(LeaseRequest(kind="main", conversation="A", wait_s=1))
            assert (lease.placement.engine, lease.base_url, lease.n_ctx) == ("b", b.url, 512)
            info = EngineInfo()
            mode.fill_info(info)
            assert (info.state, info.base_url, info.total_slots, info.n_ctx) == (
                "ready",
                b.url,
                1,
                512,
            )
            assert info.routing == "affine" and [e.id for e in info.engines] == ["a", "b"]
            assert info.in_flight == 1 and info.engines[1].slots[0].busy
            lm.release(lease.lease_id)

            active["preset"] = Preset(id="x", external=True, base_url="https://api.test")
            assert mode.targets() is None  # an external preset: the manager uses its target
        finally:
            await mode.close()


# ---------------------------------------------------------------------- the supervisor process


@pytest.fixture
def pool_env(service_env: dict[str, str], redis_url: str) -> dict[str, str]:
    with redis.Redis.from_url(redis_url) as r:
        r.delete(PRESETS_KEY, ACTIVE_KEY)
    env = dict(service_env)
    env.update(LOKI_CTX="2048", LOKI_LOG_LEVEL="INFO", LOKI_LEASE_TTL="30")
    env["LOKI_LEASE_CLAIM_S"] = "30"
    return env


async def _lease(nc, req: LeaseRequest) -> Lease:
    lease = await request(nc, subjects.ENGINE_LEASE, req, Lease, timeout=req.wait_s + 5)
    assert lease.error is None, lease.error
    return lease


async def _release(nc, lease: Lease, **kw) -> ReleaseReply:
    reply = await request(
        nc, subjects.ENGINE_RELEASE, ReleaseRequest(lease_id=lease.lease_id, **kw), ReleaseReply
    )
    assert reply.ok, reply.error
    return reply


async def test_supervisor_follows_the_pool_and_routes_by_cache(
    pool_env, nc, supervisor_factory, tmp_path: Path
):
    with FakeEngine(total_slots=2, n_ctx=4096) as a, FakeEngine(total_slots=2, n_ctx=2048) as b:
        env = {**pool_env, "LOKI_ENGINE_URLS": f"a={a.url},b@other={b.url}"}
        sup = supervisor_factory(env)
        info = await wait_info(
            nc, lambda i: sum(e.state == "ready" for e in i.engines) == 2, 60, sup
        )
        assert info.state == "ready" and info.routing == "affine"
        assert [(e.id, e.group, e.source, e.total_slots) for e in info.engines] == [
            ("a", "default", "followed", 2),
            ("b", "other", "followed", 2),
        ]
        assert info.n_ctx == 2048 and info.total_slots == 4 and info.base_url == a.url
        assert not sup.engine_pids()  # nothing launched

        p1 = fps("sys", "hello")
        t1 = await _lease(nc, LeaseRequest(kind="main", conversation="A", prompt_fingerprints=p1))
        assert t1.placement is not None and t1.placement.engine == "a" and t1.base_url == a.url
        assert t1.id_slot is not None and t1.n_ctx == 2048
        other = await _lease(
            nc, LeaseRequest(kind="main", conversation="B", prompt_fingerprints=fps("x"))
        )
        assert (other.placement.engine, other.base_url) == ("b", b.url)
        await _release(nc, t1)
        await _release(nc, other)
        t2 = await _lease(
            nc,
            LeaseRequest(
                kind="main", conversation="A", prompt_fingerprints=fps("sys", "hello", "r")
            ),
        )
        assert (t2.placement.engine, t2.id_slot, t2.placement.reason) == ("a", t1.id_slot, "affine")
        assert t2.placement.prefix == 2 and t2.placement.transfer is None
        side = await _lease(nc, LeaseRequest(kind="verify", conversation="A"))
        assert (side.placement.engine, side.placement.reason) == ("b", "apart")
        reply = await _release(nc, side, job_done=True)
        assert not reply.slot_erased and reply.erase_skipped
        await _release(nc, t2)

        info = await request(nc, subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
        rows = {e.id: e for e in info.engines}
        assert rows["a"].grants == 2 and rows["b"].grants == 2
        slot = rows["a"].slots[t1.id_slot]
        assert (slot.conversation, slot.prefix, slot.busy) == ("A", 3, False)

        # engine b dies: B's next turn fails over to a, the pool stays ready
        b.stop()
        info = await wait_info(
            nc, lambda i: [e.state for e in i.engines] == ["ready", "failed"], 30, sup
        )
        assert info.state == "ready"
        moved = await _lease(
            nc, LeaseRequest(kind="main", conversation="B", prompt_fingerprints=fps("x", "y"))
        )
        assert (moved.placement.engine, moved.placement.reason) == ("a", "failover")
        assert moved.placement.moved_from == "b" and moved.placement.transfer == "recomputed"
        await _release(nc, moved)
        assert "ready" in sup.log()
