"""The local engine in the pool (issue 44, ``LOKI_ENGINE_URLS`` entry ``local``): the entry
parsed (once at most, refused with replicated supervisors and with ``LOKI_ENGINE_URL``), and
the supervisor process launching its own llama-server (the bundled model, two slots) beside a
real followed one: both listed and ready, conversations spread over both, a conversation's
next lease back on its slot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from loki_shared import servers, subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import (
    EngineState,
    Lease,
    LeaseRequest,
    Preset,
    PresetsReply,
    PresetsRequest,
    ReleaseReply,
    ReleaseRequest,
)
from loki_supervisor.engine_pool import EngineSpec, parse_engine_urls
from loki_supervisor.pool_mode import PoolMode
from loki_supervisor.presets import ACTIVE_KEY, PRESETS_KEY
from loki_supervisor.settings import Settings
from tests.engine.conftest import port_of, process_alive, request, wait_info

# ---------------------------------------------------------------------- LOKI_ENGINE_URLS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("local", [EngineSpec("local", "default", "", local=True)]),
        (" LOCAL ", [EngineSpec("local", "default", "", local=True)]),
        ("here=local", [EngineSpec("here", "default", "", local=True)]),
        (
            "here@fast=local, peer@fast=http://10.0.0.2:8080",
            [
                EngineSpec("here", "fast", "", local=True),
                EngineSpec("peer", "fast", "http://10.0.0.2:8080"),
            ],
        ),
        (
            "http://10.0.0.2:8080,local",
            [
                EngineSpec("10.0.0.2:8080", "default", "http://10.0.0.2:8080"),
                EngineSpec("local", "default", "", local=True),
            ],
        ),
    ],
)
def test_local_entry_parsed(text, expected):
    assert parse_engine_urls(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("local,local", "one local engine at most"),
        ("a=local, b@g=local", "one local engine at most"),
        ("local=http://h:1,local", "named twice"),
        ("bad name=local", "must be 1-64"),
    ],
)
def test_local_entry_refused(text, says):
    with pytest.raises(ValueError, match=says):
        parse_engine_urls(text)


async def _publish(_: EngineState) -> None:
    return None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"engine_urls": "local,peer=http://10.0.0.2:8080", "supervisor_replicated": True},
            "LOKI_SUPERVISOR_REPLICATED",
        ),
        (
            {"engine_urls": "here=local", "engine_url": "http://10.0.0.3:8080"},
            "LOKI_ENGINE_URL",
        ),
    ],
)
def test_local_entry_refused_with_replicas_or_a_followed_engine(fields, says):
    settings = Settings(**fields)
    with pytest.raises(ValueError, match=says):
        PoolMode(settings, _publish, lambda: Preset(id="env"))


def test_replicated_pool_without_local_entry_still_accepted():
    settings = Settings(engine_urls="peer=http://10.0.0.2:8080", supervisor_replicated=True)
    mode = PoolMode(settings, _publish, lambda: Preset(id="env"))
    assert mode.local is None and [e.id for e in mode.pool.followed] == ["peer"]


# ---------------------------------------------------------------------- the supervisor process


@pytest.fixture
def peer() -> Iterator[servers.RunningServer]:
    """A llama-server with the bundled model, ``-np 2``, 2048 tokens, one thread: followed."""
    server = servers.start_llama(ctx=2048, parallel=2, threads=1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def local_env(service_env: dict[str, str], redis_url: str) -> dict[str, str]:
    servers.find_llama_server()
    servers.find_bundled_model()
    with redis.Redis.from_url(redis_url) as r:
        r.delete(PRESETS_KEY, ACTIVE_KEY)
    env = dict(service_env)
    env.update(
        LOKI_CTX="1024",
        LOKI_PARALLEL="2",
        LOKI_ENGINE_THREADS="1",
        LOKI_LOG_LEVEL="INFO",
        LOKI_LEASE_TTL="60",
        LOKI_LEASE_CLAIM_S="60",
    )
    return env


SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}


async def _lease(nc, conversation: str, messages: list[dict[str, Any]]) -> Lease:
    req = LeaseRequest(
        kind="main",
        conversation=conversation,
        wait_s=60,
        prompt_fingerprints=fingerprints(messages),
    )
    lease = await request(nc, subjects.ENGINE_LEASE, req, Lease, timeout=70)
    assert lease.error is None, lease.error
    assert lease.placement is not None and lease.id_slot is not None
    return lease


async def _release(nc, lease: Lease) -> None:
    reply = await request(
        nc, subjects.ENGINE_RELEASE, ReleaseRequest(lease_id=lease.lease_id), ReleaseReply
    )
    assert reply.ok, reply.error


async def _switch(nc, preset_id: str) -> None:
    reply = await request(
        nc,
        subjects.ENGINE_PRESETS,
        PresetsRequest(action="switch", preset_id=preset_id),
        PresetsReply,
    )
    assert reply.error is None, reply.error


async def _complete(lease: Lease, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One short completion on the lease's engine and slot (as the chat sends it)."""
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(
            f"{lease.base_url}/v1/chat/completions",
            json={
                "model": lease.model,
                "messages": messages,
                "max_tokens": 4,
                "temperature": 0,
                "id_slot": lease.id_slot,
                "cache_prompt": True,
            },
        )
    r.raise_for_status()
    return r.json()


async def test_supervisor_launches_its_local_engine_beside_a_followed_one(
    local_env, peer, nc, supervisor_factory
):
    env = {**local_env, "LOKI_ENGINE_URLS": f"here=local,peer={peer.url}"}
    sup = supervisor_factory(env)
    info = await wait_info(
        nc, lambda i: len(i.engines) == 2 and all(e.state == "ready" for e in i.engines), 180, sup
    )
    rows = {e.id: e for e in info.engines}
    assert [(e.id, e.source) for e in info.engines] == [("here", "local"), ("peer", "followed")]
    assert rows["here"].total_slots == 2 and rows["peer"].total_slots == 2
    assert rows["peer"].base_url == peer.url
    local_url = rows["here"].base_url
    assert local_url.startswith("http://127.0.0.1:") and local_url != peer.url
    assert info.state == "ready" and info.total_slots == 4
    assert info.argv and "-np" in info.argv  # the launch plan of the active preset
    children = sup.engine_pids()
    assert len(children) == 1  # the local engine is the supervisor's child; the peer is not
    assert port_of(local_url) != peer.port

    first_a = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    first_b = [SYSTEM, {"role": "user", "content": "Name a fruit."}]
    a1 = await _lease(nc, "A", first_a)
    b1 = await _lease(nc, "B", first_b)
    assert {a1.placement.engine, b1.placement.engine} == {"here", "peer"}
    assert {a1.base_url, b1.base_url} == {local_url, peer.url}
    assert a1.placement.reason == b1.placement.reason == "new"
    done_a = await _complete(a1, first_a)
    await _complete(b1, first_b)
    await _release(nc, a1)
    await _release(nc, b1)

    answer = done_a["choices"][0]["message"]["content"]
    second_a = [
        *first_a,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Why?"},
    ]
    a2 = await _lease(nc, "A", second_a)
    assert (a2.placement.engine, a2.id_slot, a2.base_url) == (
        a1.placement.engine,
        a1.id_slot,
        a1.base_url,
    )
    assert a2.placement.reason == "affine" and a2.placement.prefix >= 2
    done = await _complete(a2, second_a)
    assert done["timings"]["cache_n"] > 0  # its prompt was still in the slot
    await _release(nc, a2)

    info = await wait_info(nc, lambda i: sum(e.grants for e in i.engines) == 3, 10, sup)
    rows = {e.id: e for e in info.engines}
    assert rows[a1.placement.engine].grants == 2 and rows[b1.placement.engine].grants == 1
    slot = rows[a1.placement.engine].slots[a1.id_slot]
    assert slot.conversation == "A"

    # an external preset: the local engine stops (as the single engine does), the pool waits
    ext = {"id": "ext", "name": "ext", "external": True, "base_url": f"{peer.url}/v1"}
    ext["api_model"] = "m"
    await request(
        nc, subjects.ENGINE_PRESETS, PresetsRequest(action="save", preset=ext), PresetsReply
    )
    await _switch(nc, "ext")
    info = await wait_info(nc, lambda i: i.external and i.preset_id == "ext", 60, sup)
    rows = {e.id: e for e in info.engines}
    assert (rows["here"].state, rows["here"].base_url, rows["here"].slots) == ("stopped", "", [])
    await wait_info(nc, lambda i: not sup.engine_pids(), 30, sup)
    assert not any(process_alive(pid) for pid in children)
    ext_lease = await request(
        nc, subjects.ENGINE_LEASE, LeaseRequest(kind="main", conversation="A"), Lease
    )
    assert ext_lease.placement is None and ext_lease.base_url == peer.url  # the external API
    await _release(nc, ext_lease)

    # back to the local preset: launched again, beside the peer followed again
    await _switch(nc, "env")
    info = await wait_info(
        nc, lambda i: not i.external and all(e.state == "ready" for e in i.engines), 180, sup
    )
    children = sup.engine_pids()
    assert len(children) == 1 and info.engines[0].source == "local"
    back = await _lease(nc, "A", second_a)
    assert back.placement.engine in ("here", "peer")
    await _release(nc, back)

    # stopping the supervisor stops its engine, never the followed one
    assert sup.stop() == 0
    assert not any(process_alive(pid) for pid in children)
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{peer.url}/health")).status_code == 200


def test_supervisor_process_refuses_a_local_entry_when_replicated(local_env, supervisor_factory):
    env = {
        **local_env,
        "LOKI_ENGINE_URLS": "local,peer=http://127.0.0.1:9",
        "LOKI_SUPERVISOR_REPLICATED": "true",
    }
    sup = supervisor_factory(env)
    assert sup.proc.wait(60) != 0
    assert "LOKI_SUPERVISOR_REPLICATED=true" in sup.log()  # said before anything started
