"""The supervisors' leader election (replicated supervisors, issue 44) against a real Redis,
as the supervisor's own ACL user: one leader among three, the epoch as fencing token, a
killed leader replaced, a leader cut off from Redis stepping down before its key can expire,
a refused renewal stepping down at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import redis.asyncio as aioredis

from loki_shared import subjects
from loki_shared.credentials import without_userinfo
from loki_shared.errors import Conflict, LokiError
from loki_shared.lease import lease, requester
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.engine import (
    BenchJob,
    BenchReply,
    BenchRequest,
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    PresetsReply,
    PresetsRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.permissions import inbox_prefix
from loki_supervisor.forward import Replicas
from loki_supervisor.leadership import EPOCH_KEY, LEADER_KEY, SAFETY, Leadership, Term
from loki_supervisor.lease_book import LeaseManager, Target
from loki_supervisor.lease_mirror import LEASES_KEY, LeaseMirror
from loki_supervisor.routing import EngineView
from tests.conftest import AUTH, login_env, start_redis
from tests.engine.conftest import SupervisorProc, wait_info

TTL = 1.0


def client(url: str) -> aioredis.Redis:
    user = login_env("engine-supervisor")
    return aioredis.Redis.from_url(
        url,
        username=user["LOKI_REDIS_USER"],
        password=user["LOKI_REDIS_PASSWORD"],
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )


class Node:
    """One instance: its election and what its callbacks saw."""

    def __init__(self, url: str, name: str) -> None:
        self.redis = client(url)
        self.gains: list[int] = []
        self.losses = 0
        self.granting_in_gain: list[bool] = []
        self.lead = Leadership(self.redis, name, TTL, on_gain=self._gain, on_loss=self._loss)

    async def _gain(self, epoch: int) -> None:
        self.granting_in_gain.append(self.lead.granting)
        self.gains.append(epoch)

    async def _loss(self) -> None:
        self.losses += 1

    def kill(self) -> None:
        """As a SIGKILL: the loop stops, nothing is said to Redis."""
        assert self.lead._task is not None
        self.lead._task.cancel()


@pytest.fixture
async def nodes(redis_db: str) -> AsyncIterator[Callable[[str], Node]]:
    made: list[Node] = []

    def make(name: str) -> Node:
        node = Node(redis_db, name)
        made.append(node)
        return node

    yield make
    for node in made:
        if node.lead._task is not None and not node.lead._task.done():
            await node.lead.close()
        await node.redis.aclose()


async def until(predicate: Callable[[], bool], timeout: float, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(every)


async def watch(group: list[Node], seconds: float) -> set[str]:
    """Sample who leads for ``seconds``; never two at once. Returns the leaders seen."""
    seen: set[str] = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        leading = [n.lead.instance for n in group if n.lead.is_leader]
        assert len(leading) <= 1, leading
        seen.update(leading)
        await asyncio.sleep(0.01)
    return seen


async def test_one_leader_among_three_and_all_know_it(nodes):
    group = [nodes(name) for name in ("a", "b", "c")]
    for node in group:
        node.lead.start()
    await until(lambda: any(n.lead.granting for n in group), 3 * TTL)
    assert len(await watch(group, 3 * TTL)) == 1  # several renewals: the same one leads
    [leader] = [n for n in group if n.lead.granting]
    term = leader.lead.term
    assert term is not None and leader.gains == [term.epoch]
    assert leader.granting_in_gain == [False]  # it grants only once on_gain is done
    raw = await leader.redis.get(LEADER_KEY)
    assert Term.parse(raw) == term and int(await leader.redis.get(EPOCH_KEY)) == term.epoch
    for node in group:
        await node.lead.refresh()
        assert node.lead.leader == term and node.lead.epoch_seen == term.epoch
        assert (node.lead.other_leader() is None) == (node is leader)
    assert all(n.gains == [] and n.losses == 0 for n in group if n is not leader)


async def test_a_killed_leader_is_replaced_with_a_higher_epoch(nodes):
    group = [nodes(name) for name in ("a", "b", "c")]
    for node in group:
        node.lead.start()
    await until(lambda: any(n.lead.granting for n in group), 3 * TTL)
    [old] = [n for n in group if n.lead.granting]
    old_term = old.lead.term
    assert old_term is not None
    old.kill()
    rest = [n for n in group if n is not old]
    # nobody else leads while the old leader's key lives; the old one stops leading first
    seen: set[str] = set()
    deadline = time.monotonic() + 4 * TTL
    while not any(n.lead.granting for n in rest):
        assert time.monotonic() < deadline, "no takeover"
        leading = [n for n in group if n.lead.is_leader]
        assert len(leading) <= 1
        seen.update(n.lead.instance for n in leading)
        await asyncio.sleep(0.01)
    [new] = [n for n in rest if n.lead.granting]
    assert not old.lead.is_leader
    assert new.lead.term is not None and new.lead.term.epoch > old_term.epoch
    assert new.gains == [new.lead.term.epoch]
    assert seen <= {old_term.instance, new.lead.instance}


async def test_a_closed_leader_hands_over_without_waiting_for_its_key(nodes):
    a, b = nodes("a"), nodes("b")
    a.lead.start()
    await until(lambda: a.lead.granting, 3 * TTL)
    b.lead.start()
    await watch([a, b], TTL)
    assert not b.lead.is_leader
    term = a.lead.term
    assert term is not None
    await a.lead.close()
    # deleted, not left to expire: the key is gone, or b already took it (b tries every
    # third of the TTL); never a's own any more
    raw = await a.redis.get(LEADER_KEY)
    assert raw is None or Term.parse(raw).instance == "b", raw
    assert a.losses == 1 and not a.lead.is_leader
    await until(lambda: b.lead.granting, 3 * TTL)


async def test_a_refused_renewal_steps_down_at_once(nodes):
    a = nodes("a")
    a.lead.start()
    await until(lambda: a.lead.granting, 3 * TTL)
    term = a.lead.term
    assert term is not None
    other = Term(term.epoch + 1, "intruder")
    await a.redis.set(LEADER_KEY, other.value, px=60_000)  # as if a's key had expired
    await until(lambda: a.losses == 1, 2 * TTL)
    assert not a.lead.granting and not a.lead.is_leader
    assert a.lead.leader == other and a.lead.other_leader() == other
    await watch([a], TTL)  # the intruder's key lives: a does not take it back


async def test_a_leader_cut_off_from_redis_steps_down_before_its_key_expires(tmp_path: Path):
    server = start_redis(tmp_path / "redis")
    node = Node(server.url, "a")
    try:
        node.lead.start()
        await until(lambda: node.lead.granting, 3 * TTL)
        cut = time.monotonic()
        server.process.kill()  # Redis gone: no renewal can succeed any more
        # the key, renewed at the latest just before the cut, lives until cut + TTL in Redis:
        # the leader must have stopped leading before that instant
        await asyncio.sleep(max(0.0, cut + TTL - time.monotonic()))
        assert not node.lead.is_leader and not node.lead.granting
        await until(lambda: node.losses == 1, 2 * TTL)
        assert SAFETY < 1
    finally:
        if node.lead._task is not None:
            node.lead._task.cancel()
        server.stop()
        await node.redis.aclose()


# ---------------------------------------------------------------------- two supervisor processes


@pytest.fixture
def fake_engine():
    from tests.fakes.fake_engine import FakeEngine

    with FakeEngine() as engine:
        yield engine


def _process_of(procs: dict[str, SupervisorProc], instance: str) -> str:
    """The name of the process whose log says that ``instance`` (its id) leads."""
    for name, proc in procs.items():
        if f"this supervisor ({instance}) leads" in proc.log():
            return name
    pytest.fail(f"no process logged that {instance} leads")


@pytest.mark.parametrize("follow", ["LOKI_ENGINE_URL", "LOKI_ENGINE_URLS"])
async def test_two_supervisors_a_held_lease_and_a_waiter_survive_the_leader_kill(
    follow, service_env, redis_db, nc, supervisor_factory, fake_engine
):
    env = {
        **service_env,
        **login_env("engine-supervisor"),  # its own NATS and Redis users: the ACL allows it
        follow: fake_engine.url,
        "LOKI_SUPERVISOR_REPLICATED": "true",
        "LOKI_SUPERVISOR_LEADER_TTL_S": str(TTL),
        "LOKI_LEASE_TTL": "3",
        "LOKI_LOG_LEVEL": "INFO",
    }
    procs = {name: supervisor_factory(env, name) for name in ("a", "b")}
    info = await wait_info(nc, lambda i: i.state == "ready" and i.leader, 60, procs["a"])
    assert info.boot.startswith("epoch-") and info.instance

    async with lease(nc, LeaseRequest(kind="main", conversation="c1", wait_s=20)) as held:
        await until(lambda: held.renewals >= 1, 5)
        # a second request waits for the one slot while the leader is killed
        waiter = asyncio.create_task(
            lease(nc, LeaseRequest(kind="main", conversation="c2", wait_s=30)).__aenter__()
        )
        await asyncio.sleep(0.5)
        assert not waiter.done()
        now = await wait_info(nc, lambda i: i.leader is not None, 10)
        instance = now.leader
        assert instance is not None
        name = _process_of(procs, instance)
        procs[name].proc.kill()
        procs[name].proc.wait()
        survivor = procs["b" if name == "a" else "a"]
        after = await wait_info(nc, lambda i: i.leader not in (None, instance), 30, survivor)
        assert after.boot != now.boot  # the waiters see a new leader
        renewed = held.renewals
        await until(lambda: held.renewals >= renewed + 2, 10)  # renewed by the new leader
        assert not held.lost and not waiter.done()
    assert held.released  # the survivor knew the lease
    try:
        second = await asyncio.wait_for(waiter, 30)  # granted once the slot is free
    except TimeoutError:
        logs = "\n".join(f"--- {n}\n{p.log()[-4000:]}" for n, p in procs.items())
        last = await wait_info(nc, lambda i: True, 5)
        pytest.fail(f"the waiting lease request was not granted\n{last!r}\n{logs}")
    try:
        assert second.lease.base_url == fake_engine.url.rstrip("/")
    finally:
        await second.__aexit__(None, None, None)
    assert second.released
    assert "took over 1 held lease" in survivor.log()


# ---------------------------------------------------------------------- forwarding (in process)


def test_engine_node_subjects() -> None:
    assert subjects.engine_node("ab12", "lease") == "loki.engine.node.ab12.lease"
    assert subjects.engine_node("ab12", "info") == "loki.engine.node.ab12.info"
    assert subjects.engine_node("ab12", "bench") == "loki.engine.node.ab12.bench"
    for instance, op in (("a.b", "lease"), ("", "renew"), ("a", "state"), ("a*", "info")):
        with pytest.raises(ValueError):
            subjects.engine_node(instance, op)


class Replica:
    """One supervisor's replica parts on real NATS (as the ``engine-supervisor`` user) and
    Redis, its node subjects served with plain nats-py subscriptions."""

    def __init__(self, name: str, redis_url: str, nc: Any) -> None:
        self.node = Node(redis_url, name)
        self.nc = nc
        view = EngineView(external=False, total_slots=1, slot_n_ctx=(2048,), ctx=2048)
        self.leases = LeaseManager(
            lambda: Target(base_url=f"http://{name}.test:1", model="m", api_key=None, view=view)
        )
        self.mirror = LeaseMirror(self.node.redis, self.leases, lambda: self.node.lead.term)

        async def release(req: ReleaseRequest) -> ReleaseReply:
            self.leases.release(req.lease_id)
            return ReleaseReply(ok=True)

        self.replicas = Replicas(
            self.leases,
            self.node.lead,
            self.mirror,
            self.leases.acquire,
            lambda req: self.leases.renew(req.lease_id),
            release,
            info=lambda: EngineInfo(state="ready", in_flight=self.leases.in_flight),
            presets=self.presets,
            on_lead=self.lead,
        )
        # a bench request served only by the leader (issue 44: a measurement leases from
        # the leader's book): its job names who ran it
        self.bench_queue, self.bench_node = self.replicas.leader_op("bench", self.bench, BenchReply)
        self.led = 0
        self.replicas.connect(requester(nc))
        self.subs: list[Any] = []

    async def presets(self, req: PresetsRequest) -> PresetsReply:
        return PresetsReply(active=self.node.lead.instance)  # who served it

    async def bench(self, req: BenchRequest) -> BenchReply:
        return BenchReply(job=BenchJob(job_id=self.node.lead.instance))

    async def lead(self) -> None:
        self.led += 1

    async def serve_node(self) -> None:
        handlers = {
            "lease": (self.replicas.node_lease, LeaseRequest),
            "renew": (self.replicas.node_renew, RenewRequest),
            "release": (self.replicas.node_release, ReleaseRequest),
            "info": (self.replicas.node_info, EngineInfoRequest),
            "presets": (self.replicas.node_presets, PresetsRequest),
            "bench": (self.bench_node, BenchRequest),
        }
        for op, (handler, model) in handlers.items():

            async def cb(msg: Any, handler: Any = handler, model: Any = model) -> None:
                try:
                    reply = await handler(model.model_validate_json(msg.data))
                except LokiError as exc:
                    reply = Lease(error=ErrorInfo(type=exc.type, message=str(exc)))
                await msg.respond(reply.model_dump_json().encode())

            name = self.node.lead.instance
            self.subs.append(await self.nc.subscribe(subjects.engine_node(name, op), cb=cb))

    async def close(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()
        await self.replicas.close()
        await self.leases.close()
        await self.node.redis.aclose()


async def supervisor_nats(nats_url: str) -> Any:
    """A NATS connection as the supervisor's own user (its ACL: the node subjects)."""
    return await nats.connect(
        without_userinfo(nats_url),
        user="engine-supervisor",
        password=AUTH.creds.nats["engine-supervisor"],
        inbox_prefix=inbox_prefix("engine-supervisor"),
    )


async def test_a_non_leader_forwards_lease_renew_release_and_info_to_the_leader(redis_db, nats_url):
    nca, ncb = await supervisor_nats(nats_url), await supervisor_nats(nats_url)
    a, b = Replica("a", redis_db, nca), Replica("b", redis_db, ncb)
    try:
        await a.serve_node()
        await b.serve_node()
        a.replicas.start()
        await until(lambda: a.node.lead.granting, 3 * TTL)
        b.replicas.start()
        await until(lambda: b.node.lead.leader is not None, 3 * TTL)
        term = a.node.lead.term
        assert term is not None and b.node.lead.other_leader() == term

        with pytest.raises(Conflict):  # a non-leader refuses what is forwarded to it
            await b.replicas.node_lease(LeaseRequest(kind="main", wait_s=1))
        lease = await b.replicas.lease(LeaseRequest(kind="main", conversation="c1", wait_s=5))
        assert lease.base_url == "http://a.test:1" and list(a.leases.held) == [lease.lease_id]
        assert b.leases.held == {} and b.leases.waiting == 0  # b queued nothing itself
        assert (await b.replicas.renew(RenewRequest(lease_id=lease.lease_id))).error is None
        assert a.leases.held[lease.lease_id].claimed
        mirrored = await a.node.redis.hkeys(LEASES_KEY)
        assert mirrored == [lease.lease_id.encode()]  # synced before the answer
        info = await b.replicas.fresh_info()
        assert (info.instance, info.leader, info.in_flight) == ("b", "a", 1)  # a's view
        assert info.boot == f"epoch-{term.epoch}"
        assert (await b.replicas.release(ReleaseRequest(lease_id=lease.lease_id))).ok
        assert a.leases.held == {} and await a.node.redis.hlen(LEASES_KEY) == 0
        assert b.replicas.forwarded == 3
        assert (await b.replicas.presets(PresetsRequest(action="list"))).active == "a"
        benched = await b.bench_queue(BenchRequest(action="latest"))
        assert benched.job is not None and benched.job.job_id == "a"  # the leader's job
        with pytest.raises(Conflict):  # and never b's own
            await b.bench_node(BenchRequest(action="latest"))
        assert (a.led, b.led) == (1, 0)  # on_lead ran once, in the leader
        # a renewal of a lease nobody holds is a real loss: not_found, relayed as is
        gone = await b.replicas.renew(RenewRequest(lease_id=lease.lease_id))
        assert gone.error is not None and gone.error.type == "not_found"

        # a held lease survives a leaving leader: b takes over and keeps it
        kept = await b.replicas.lease(LeaseRequest(kind="main", conversation="c2", wait_s=5))
        await a.replicas.close()  # a planned stop: a resigns
        await until(lambda: b.node.lead.granting, 3 * TTL)
        assert list(b.leases.held) == [kept.lease_id]
        assert (await b.replicas.renew(RenewRequest(lease_id=kept.lease_id))).error is None
        info = await b.replicas.fresh_info()
        assert info.leader == "b" and info.boot != f"epoch-{term.epoch}"
        assert (await b.replicas.presets(PresetsRequest(action="list"))).active == "b"
        benched = await b.bench_queue(BenchRequest(action="latest"))
        assert benched.job is not None and benched.job.job_id == "b"  # b leads: its own
        assert b.led == 1
    finally:
        await a.close()
        await b.close()
        await nca.close()
        await ncb.close()


async def test_a_lease_request_handed_to_the_leader_is_answered_even_if_the_forwarder_dies(
    redis_db, nats_url
):
    nca, ncb = await supervisor_nats(nats_url), await supervisor_nats(nats_url)
    asker = await nats.connect(nats_url)  # the chat's side: its own inbox
    a, b = Replica("a", redis_db, nca), Replica("b", redis_db, ncb)

    def publisher(nc: Any) -> Any:
        async def publish(subject: str, payload: bytes, reply: str) -> None:
            await nc.publish(subject, payload, reply=reply)

        return publish

    a.replicas.connect(requester(nca), publisher(nca))
    b.replicas.connect(requester(ncb), publisher(ncb))
    try:
        await a.serve_node()
        a.replicas.start()
        await until(lambda: a.node.lead.granting, 3 * TTL)
        b.replicas.start()
        await until(lambda: b.node.lead.other_leader() is not None, 3 * TTL)
        inbox = asker.new_inbox()
        answers = await asker.subscribe(inbox)
        # handed to b by an instance that took b for the leader: b hands it on to a
        stale = LeaseRequest(kind="verify", wait_s=5).model_dump_json().encode()
        await b.replicas.lease_message(stale, inbox, handed=True)
        first = Lease.model_validate_json((await answers.next_msg(timeout=5)).data)
        assert first.error is None and list(a.leases.held) == [first.lease_id]
        a.leases.release(first.lease_id)

        busy = await a.leases.acquire(LeaseRequest(kind="main", conversation="c0", wait_s=1))
        body = LeaseRequest(kind="main", conversation="c1", wait_s=10).model_dump_json()
        await b.replicas.lease_message(body.encode(), inbox)  # handed over: b is done
        assert b.replicas.forwarded == 2
        await b.close()  # the forwarder dies while the request waits at the leader
        await ncb.close()
        await until(lambda: a.leases.waiting == 1, 5)
        a.leases.release(busy.lease_id)
        msg = await answers.next_msg(timeout=5)  # straight from the leader
        granted = Lease.model_validate_json(msg.data)
        assert granted.error is None and list(a.leases.held) == [granted.lease_id]

        # the queue group's subject served as the service does (raw message, no relay): at
        # the leader a request is answered there, a malformed one invalid_request
        async def on_lease(msg: Any) -> None:
            await a.replicas.lease_message(msg.data, msg.reply)

        await nca.subscribe(subjects.ENGINE_LEASE, queue=subjects.QUEUE_ENGINE, cb=on_lease)
        await nca.flush()
        bad = Lease.model_validate_json((await asker.request(subjects.ENGINE_LEASE, b"{}", 5)).data)
        assert bad.error is not None and bad.error.type == "invalid_request"
        a.leases.release(granted.lease_id)
        ask = LeaseRequest(kind="verify", wait_s=5).model_dump_json().encode()
        direct = Lease.model_validate_json(
            (await asker.request(subjects.ENGINE_LEASE, ask, 5)).data
        )
        assert direct.error is None and list(a.leases.held) == [direct.lease_id]
        assert a.replicas.forwarded == 0
    finally:
        await a.close()
        await nca.close()
        await asker.close()
        if not ncb.is_closed:
            await b.close()
            await ncb.close()


async def test_a_leader_that_stepped_down_on_its_own_key_takes_the_same_term_back(nodes):
    a, b = nodes("a"), nodes("b")
    a.lead.start()
    await until(lambda: a.lead.granting, 3 * TTL)
    b.lead.start()
    term = a.lead.term
    assert term is not None
    await a.lead._step_down("a renewal failed")  # as after a Redis timeout; the key stays
    assert a.losses == 1 and not a.lead.is_leader
    await until(lambda: a.lead.granting, 3 * TTL)
    assert a.gains == [term.epoch, term.epoch] and a.lead.term == term  # the same term
    assert Term.parse(await a.redis.get(LEADER_KEY)) == term
    assert not b.lead.is_leader and b.gains == []


async def test_only_the_leading_supervisor_publishes_the_engines_states(
    redis_db: str, tmp_path: Path
) -> None:
    """Every replicated supervisor follows the same engines: a state change is published
    once, by the leader, not once per instance."""
    from loki_shared.messages.engine import EngineState
    from loki_shared.sealing import Sealer
    from loki_supervisor.service import Supervisor
    from loki_supervisor.settings import Settings

    published: list[EngineState] = []

    async def publish(event: EngineState) -> None:
        published.append(event)

    redis = client(redis_db)
    settings = Settings(
        home=tmp_path,
        engine_urls="e0=http://127.0.0.1:1",
        supervisor_replicated=True,
        supervisor_leader_ttl_s=TTL,
    )
    sup = Supervisor(settings, redis=redis, sealer=Sealer(b"k" * 32), publish_state=publish)
    assert sup.pool is not None and sup.replicas is not None
    runner = sup.pool.pool.engines[0].runner  # the followed engine's (it relays its events)
    try:
        await runner.on_state(EngineState(state="starting", ts=1.0))  # not leading (yet)
        assert published == []
        sup.replicas.start()
        await until(lambda: sup.replicas is not None and sup.replicas.leadership.granting, 3)
        await runner.on_state(EngineState(state="ready", ts=2.0))
        assert [(e.state, e.engine) for e in published] == [("ready", "e0")]
    finally:
        await sup.replicas.close()
        await sup.pool.pool.close()
        await redis.aclose()
