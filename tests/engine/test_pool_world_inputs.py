"""The engine pool (issue 44) under inputs and situations a person running it meets:
``LOKI_ENGINE_URLS`` as people write it, engines of one group serving different models, ...
Each test failed before the fix it guards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from loki_shared.messages.engine import EngineState, LeaseRequest, Preset
from loki_supervisor.engine_pool import EngineSpec, parse_engine_urls
from loki_supervisor.lease_book import LeaseManager
from loki_supervisor.pool_mode import PoolMode
from loki_supervisor.settings import Settings
from tests.fakes.fake_engine import FakeEngine

# ---------------------------------------------------------------------- LOKI_ENGINE_URLS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # an OpenAI base URL pasted as the engine's: /health, /props, /slots live at the root
        ("gpu0=http://10.0.0.2:8080/v1", [EngineSpec("gpu0", "default", "http://10.0.0.2:8080")]),
        (
            "http://10.0.0.2:8080/v1/",
            [EngineSpec("10.0.0.2:8080", "default", "http://10.0.0.2:8080")],
        ),
        (" a = http://h:1/V1 , ", [EngineSpec("a", "default", "http://h:1")]),
        ("http://[::1]:8080/v1", [EngineSpec("[::1]:8080", "default", "http://[::1]:8080")]),
        # a proxy path is kept (only the /v1 suffix goes)
        ("a=http://h:1/llama/v1", [EngineSpec("a", "default", "http://h:1/llama")]),
        ("HTTP://Box.LAN:8080", [EngineSpec("box.lan:8080", "default", "HTTP://Box.LAN:8080")]),
        # a YAML block, an env file's quotes, semicolons, spaces around = and @
        (
            "gpu0 @ fast = http://a:1\n  gpu1=http://b:2\n",
            [EngineSpec("gpu0", "fast", "http://a:1"), EngineSpec("gpu1", "default", "http://b:2")],
        ),
        (
            '"http://a:1,http://b:2"',
            [
                EngineSpec("a:1", "default", "http://a:1"),
                EngineSpec("b:2", "default", "http://b:2"),
            ],
        ),
        (
            "'a=http://a:1'; 'b=http://b:2';",
            [EngineSpec("a", "default", "http://a:1"), EngineSpec("b", "default", "http://b:2")],
        ),
        (
            "http://a:1 http://b:2",
            [
                EngineSpec("a:1", "default", "http://a:1"),
                EngineSpec("b:2", "default", "http://b:2"),
            ],
        ),
    ],
)
def test_engine_urls_as_people_write_them(text, expected):
    assert parse_engine_urls(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "a=http://h:8080,b=http://h:8080",
        "a=http://h:8080,b=http://h:8080/",
        "a=http://h:8080,b=http://H:8080/v1",
        "a=http://h,b=http://h:80",
        "a=https://h,b=https://h:443/",
        "http://h:8080,b=http://h:8080/v1",
    ],
)
def test_one_server_under_two_names_refused(text):
    """Two entries of one llama-server would double its slots: two leases on "different
    engines" would share a slot (and evict each other's prompts)."""
    with pytest.raises(ValueError, match="same llama-server"):
        parse_engine_urls(text)


def test_same_host_other_port_or_path_is_another_server():
    specs = parse_engine_urls("a=http://h:8080,b=http://h:8081,c=http://h:8080/other")
    assert [s.id for s in specs] == ["a", "b", "c"]


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def _nothing(event: EngineState) -> None:
    return None


async def test_engine_url_with_v1_suffix_becomes_ready_and_grants_its_root():
    """Before: ``http://h:p/v1`` was probed at ``/v1/props`` (404 on llama-server), so the
    engine never became ready (or its leases named ``/v1/v1/...``)."""
    with FakeEngine(total_slots=1) as fake:
        settings = Settings(engine_urls=f"one={fake.url}/v1/")
        mode = PoolMode(settings, _nothing, lambda: Preset(id="env", ctx=4096))
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            await mode.pool.follow()
            await _until(lambda: len(mode.pool.ready()) == 1)
            lease = await lm.acquire(LeaseRequest(kind="main", conversation="A", wait_s=1))
            assert lease.base_url == fake.url
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{lease.base_url}/props")).status_code == 200
            lm.release(lease.lease_id)
        finally:
            await mode.close()


# ---------------------------------------------------------------------- models in one group


async def test_engine_of_another_model_in_the_group_gets_no_conversation():
    """Before: engines of one group serving different models were all routed to: a busy
    affine slot moved the conversation to the other model ("overloaded"), and a new
    conversation landed on whichever was least loaded."""
    with (
        FakeEngine(total_slots=1) as a,
        FakeEngine(total_slots=2) as b,
        FakeEngine(total_slots=1) as c,
    ):
        b.model_id, b.model_path = "other-model", "/models/other.gguf"
        a.model_path, c.model_path = "/models/fake.gguf", "/srv/llm/fake.gguf"
        settings = Settings(engine_urls=f"a={a.url},b={b.url},c={c.url}", affinity_queue_max=0)
        mode = PoolMode(settings, _nothing, lambda: Preset(id="env", ctx=4096))
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            await mode.pool.follow()
            await _until(lambda: len(mode.pool.ready()) == 3)
            assert [t.engine for t in mode.targets()] == ["a", "c"]  # c: same file elsewhere
            leases = [
                await lm.acquire(LeaseRequest(kind="main", conversation=f"C{i}", wait_s=1))
                for i in range(2)
            ]
            assert {lease.placement.engine for lease in leases} == {"a", "c"}
            assert all(lease.model == "fake-model" for lease in leases)
            info = mode_info(mode)
            assert info.total_slots == 2 and "not used" in info.detail and "b (" in info.detail
            for lease in leases:
                lm.release(lease.lease_id)

            a.stop()  # the group's first engine gone: c still serves the same model
            await _until(lambda: [e.id for e in mode.pool.ready()] == ["b", "c"])
            assert [t.engine for t in mode.targets()] == ["c"]
            c.stop()  # no engine of that model left: the next model serves (said: failover)
            await _until(lambda: [e.id for e in mode.pool.ready()] == ["b"])
            assert [t.engine for t in mode.targets()] == ["b"]
        finally:
            await mode.close()


@pytest.mark.parametrize(
    ("model_path", "model", "identity"),
    [
        ("/models/smol.gguf", "smol", "smol.gguf"),
        ("", "/srv/models/smol.gguf", "smol.gguf"),  # an older server: no model_path
        ("C:\\models\\smol.gguf", "x", "smol.gguf"),
        ("", "my-alias", "my-alias"),
    ],
)
def test_model_identity(model_path, model, identity):
    from types import SimpleNamespace

    from loki_supervisor.pool_mode import model_identity

    assert model_identity(SimpleNamespace(model_path=model_path, model=model)) == identity


def mode_info(mode: PoolMode):
    from loki_shared.messages.engine import EngineInfo

    info = EngineInfo()
    mode.fill_info(info)
    return info


# ---------------------------------------------------------------------- what /props says


async def test_engine_whose_props_lack_total_slots_serves_one_slot():
    """Before: an engine answering ``/health`` whose ``/props`` has no ``total_slots`` (and
    ``/slots`` off) was "ready" yet never granted anything: the pool said unavailable."""
    with FakeEngine(total_slots=2) as fake:
        fake.props_omit = {"total_slots"}
        fake.slots_enabled = False
        mode = PoolMode(
            Settings(engine_urls=f"old={fake.url}"), _nothing, lambda: Preset(id="env", ctx=2048)
        )
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            await mode.pool.follow()
            await _until(lambda: mode.pool.engines[0].ready)
            assert [(t.engine, t.slots) for t in mode.targets()] == [("old", 1)]
            lease = await lm.acquire(LeaseRequest(kind="main", conversation="A", wait_s=1))
            assert (lease.placement.engine, lease.placement.id_slot) == ("old", 0)
            assert lease.n_ctx == 2048
            lm.release(lease.lease_id)
        finally:
            await mode.close()


# ---------------------------------------------------------------------- ENGINE_GROUP


async def test_preset_group_naming_no_engine_is_said_not_ready():
    """Before: a preset whose ``ENGINE_GROUP`` names no engine (a typo) left
    ``loki.engine.info`` saying ``ready`` ("1 of 1 engines ready") while every lease waited
    and ended "engine not ready"."""
    active = {"preset": Preset(id="p", ctx=2048, features={"ENGINE_GROUP": "Fast"})}
    with FakeEngine(total_slots=1) as fake:
        mode = PoolMode(
            Settings(engine_urls=f"one@fast={fake.url}"), _nothing, lambda: active["preset"]
        )
        try:
            await mode.pool.follow()
            await _until(lambda: mode.pool.engines[0].ready)
            info = mode_info(mode)
            assert info.state == "failed"
            assert "ENGINE_GROUP 'Fast' names no engine" in info.detail and "fast" in info.detail
            active["preset"] = Preset(id="p", ctx=2048, features={"ENGINE_GROUP": "fast"})
            assert mode_info(mode).state == "ready"
        finally:
            await mode.close()


# ---------------------------------------------------------------------- unseen restarts


async def test_engine_restarted_between_probes_is_seen_at_the_next_affine_grant():
    """Before: an engine restarted faster than the ``/health`` probe kept its slot book:
    the router sent conversations to "their" empty slots (prefix said > 0, no restore from
    their files) and evict-saved empty slots. llama-server's ``/slots`` lists ``id_task`` for
    a slot once it ran a task; a restarted server's slots have none."""
    from loki_shared.fingerprint import fingerprints

    def ask(conversation: str, *texts: str) -> LeaseRequest:
        msgs = [{"role": "system", "content": "sys"}] + [
            {"role": "user", "content": t} for t in texts
        ]
        return LeaseRequest(
            kind="main", conversation=conversation, wait_s=1, prompt_fingerprints=fingerprints(msgs)
        )

    with FakeEngine(total_slots=2) as fake:
        fake.slot_tasks = {0: 1, 1: 2}
        mode = PoolMode(
            Settings(engine_urls=f"one={fake.url}"), _nothing, lambda: Preset(id="env", ctx=2048)
        )
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)

        async def turn(req: LeaseRequest):
            lease = await mode.before_reply(lm, await lm.acquire(req))
            lm.release(lease.lease_id)
            return lease.placement

        try:
            await mode.pool.follow()
            await _until(lambda: mode.pool.engines[0].ready)
            a = await turn(ask("A", "a1"))
            b = await turn(ask("B", "b1"))
            assert a.id_slot != b.id_slot
            again = await turn(ask("A", "a1", "a2"))  # the engine shows its tasks: kept
            assert (again.id_slot, again.reason, again.prefix) == (a.id_slot, "affine", 2)
            assert mode.book.entry("one", b.id_slot) is not None

            fake.slot_tasks = {}  # restarted between two probes: no slot ran a task
            third = await turn(ask("A", "a1", "a2", "a3"))
            assert third.id_slot == a.id_slot and third.prefix == 0
            assert mode.book.entry("one", b.id_slot) is None  # B's prompt is gone too
            kept = mode.book.entry("one", a.id_slot)
            assert kept is not None and kept.conversation == "A"  # this grant's prompt

            fake.slot_tasks = {a.id_slot: 1}
            fourth = await turn(ask("A", "a1", "a2", "a3", "a4"))
            assert (fourth.id_slot, fourth.prefix) == (a.id_slot, 4)
            b2 = await turn(ask("B", "b1"))  # B starts again on the other slot
            fake.slot_tasks = {a.id_slot: 3, b2.id_slot: 4}
            assert (await turn(ask("A", "a1", "a2", "a3", "a4", "a5"))).prefix == 5
            assert mode.book.entry("one", b2.id_slot) is not None

            # restarted again, and B's slot already ran a task since: the task ids fell
            fake.slot_tasks = {b2.id_slot: 1}
            sixth = await turn(ask("A", "a1", "a2", "a3", "a4", "a5", "a6"))
            assert sixth.prefix == 0 and mode.book.entry("one", b2.id_slot) is None
        finally:
            await mode.close()


async def test_engine_without_task_ids_in_slots_is_never_taken_for_restarted():
    """An engine whose ``/slots`` never lists ``id_task`` (an older server, or ``/slots``
    off) keeps its book: nothing is known, nothing forgotten."""
    from loki_shared.fingerprint import fingerprints

    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "x"}]
    with FakeEngine(total_slots=1) as fake:
        mode = PoolMode(
            Settings(engine_urls=f"one={fake.url}"), _nothing, lambda: Preset(id="env", ctx=2048)
        )
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            await mode.pool.follow()
            await _until(lambda: mode.pool.engines[0].ready)
            for n in (2, 3):
                req = LeaseRequest(
                    kind="main",
                    conversation="A",
                    wait_s=1,
                    prompt_fingerprints=fingerprints(msgs * (n - 1))[:n],
                )
                lease = await mode.before_reply(lm, await lm.acquire(req))
                lm.release(lease.lease_id)
            assert lease.placement.prefix == 2 and lease.placement.reason == "affine"
        finally:
            await mode.close()


async def test_real_llama_server_restart_shows_in_its_slots():
    """The contract :meth:`PoolMode._restarted` reads, on a real llama-server: after a task
    its ``/slots`` lists ``id_task``; the same server restarted on the same port lists none."""
    from loki_shared import servers

    port = servers.free_port()
    argv = servers.llama_command(port, ctx=1024, parallel=2, threads=1)
    url = f"http://127.0.0.1:{port}"

    def start() -> servers.ManagedProcess:
        proc = servers.ManagedProcess("llama-server", argv).start()
        proc.wait_http_ok(f"{url}/health", timeout=120)
        return proc

    proc = start()
    mode = PoolMode(Settings(engine_urls=f"one={url}"), _nothing, lambda: Preset(id="env"))
    try:
        await mode.pool.follow()
        await _until(lambda: mode.pool.engines[0].ready, 60)
        engine = mode.pool.engines[0]
        assert not await mode._restarted(engine, 0)  # nothing known yet
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(
                f"{url}/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                    "id_slot": 0,
                },
            )
            assert r.status_code == 200
        assert not await mode._restarted(engine, 0)  # task ids seen
        assert not await mode._restarted(engine, 0)  # nothing changed
        proc.stop()
        proc = start()
        assert await mode._restarted(engine, 0)
    finally:
        await mode.close()
        proc.stop()


async def test_external_preset_and_back_keeps_what_the_engines_hold():
    """Before: switching to an external preset stopped following the pool, which forgot the
    slot book; switching back, every conversation was routed as new although the engines
    (untouched) still held their prompts."""
    from loki_shared.fingerprint import fingerprints

    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "x"}]
    with FakeEngine(total_slots=2) as fake:
        fake.slot_tasks = {0: 1}
        mode = PoolMode(
            Settings(engine_urls=f"one={fake.url}"), _nothing, lambda: Preset(id="env", ctx=2048)
        )
        lm = LeaseManager(lambda: None, ttl=30.0, claim_s=30.0, pool=mode.routing())
        mode.attach(lm)
        try:
            await mode.pool.follow()
            await _until(lambda: mode.pool.engines[0].ready)
            req = LeaseRequest(
                kind="main", conversation="A", wait_s=1, prompt_fingerprints=fingerprints(msgs)
            )
            first = await mode.before_reply(lm, await lm.acquire(req))
            lm.release(first.lease_id)
            await mode.pool.stop()  # an external preset replaces the pool
            await mode.pool.follow()  # and the pool is back
            await _until(lambda: mode.pool.engines[0].ready)
            req = LeaseRequest(
                kind="main",
                conversation="A",
                wait_s=1,
                prompt_fingerprints=fingerprints([*msgs, {"role": "user", "content": "y"}]),
            )
            again = await mode.before_reply(lm, await lm.acquire(req))
            assert again.placement.reason == "affine" and again.placement.prefix == 2
            assert again.placement.id_slot == first.placement.id_slot
            lm.release(again.lease_id)
        finally:
            await mode.close()
