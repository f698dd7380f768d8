"""The engine pool with two real llama-servers (the bundled model, two slots each, small
window) followed by the supervisor process (``LOKI_ENGINE_URLS``): a conversation's turns stay
on its engine and slot and its second turn finds its prompt cached (``timings.cache_n``), a
second conversation goes to the other engine, a side job goes apart."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from loki_shared import servers, subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import Lease, LeaseRequest, ReleaseReply, ReleaseRequest
from loki_supervisor.presets import ACTIVE_KEY, PRESETS_KEY
from tests.engine.conftest import request, wait_info

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}


@pytest.fixture
def two_engines() -> Iterator[list[servers.RunningServer]]:
    """Two llama-servers with the bundled model, ``-np 2``, 2048 tokens, one thread each."""
    started: list[servers.RunningServer] = []
    try:
        for _ in range(2):
            started.append(servers.start_llama(ctx=2048, parallel=2, threads=1))
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def pool_env(service_env: dict[str, str], redis_url: str) -> dict[str, str]:
    with redis.Redis.from_url(redis_url) as r:
        r.delete(PRESETS_KEY, ACTIVE_KEY)
    env = dict(service_env)
    env.update(LOKI_CTX="2048", LOKI_LOG_LEVEL="INFO", LOKI_LEASE_TTL="60")
    env["LOKI_LEASE_CLAIM_S"] = "60"
    return env


async def _lease(nc, kind: str, conversation: str, messages: list[dict[str, Any]]) -> Lease:
    req = LeaseRequest(
        kind=kind,  # type: ignore[arg-type]
        conversation=conversation,
        wait_s=60,
        prompt_fingerprints=fingerprints(messages),
    )
    lease = await request(nc, subjects.ENGINE_LEASE, req, Lease, timeout=70)
    assert lease.error is None, lease.error
    assert lease.placement is not None and lease.id_slot is not None
    return lease


async def _complete(lease: Lease, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "cache_prompt": True,
        "id_slot": lease.id_slot,
    }
    async with httpx.AsyncClient(timeout=180) as client:
        r = await client.post(f"{lease.base_url}/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


async def _release(nc, lease: Lease) -> None:
    reply = await request(
        nc, subjects.ENGINE_RELEASE, ReleaseRequest(lease_id=lease.lease_id), ReleaseReply
    )
    assert reply.ok, reply.error


async def test_pool_of_two_real_engines_keeps_each_conversation_on_its_cache(
    two_engines, pool_env, nc, supervisor_factory
):
    servers.find_llama_server()
    one, two = two_engines
    env = {**pool_env, "LOKI_ENGINE_URLS": f"one={one.url},two={two.url}"}
    sup = supervisor_factory(env)
    info = await wait_info(
        nc, lambda i: [e.state for e in i.engines] == ["ready", "ready"], 120, sup
    )
    assert [(e.id, e.total_slots) for e in info.engines] == [("one", 2), ("two", 2)]

    a1 = [SYSTEM, {"role": "user", "content": "Name a colour of the sky at noon."}]
    b1 = [SYSTEM, {"role": "user", "content": "Name a fruit that is yellow."}]
    # A's first turn holds its lease while B asks: B goes to the other engine
    lease_a1 = await _lease(nc, "main", "A", a1)
    lease_b1 = await _lease(nc, "main", "B", b1)
    assert lease_a1.placement.engine == "one" and lease_a1.base_url == one.url
    assert lease_b1.placement.engine == "two" and lease_b1.base_url == two.url
    reply_a1, _ = await asyncio.gather(_complete(lease_a1, a1), _complete(lease_b1, b1))
    await _release(nc, lease_a1)
    await _release(nc, lease_b1)

    answer = reply_a1["choices"][0]["message"]["content"] or ""
    a2 = [
        *a1,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And at dusk?"},
    ]
    lease_a2 = await _lease(nc, "main", "A", a2)
    assert (lease_a2.placement.engine, lease_a2.id_slot) == ("one", lease_a1.id_slot)
    assert lease_a2.placement.reason == "affine" and lease_a2.placement.prefix >= 2
    reply_a2 = await _complete(lease_a2, a2)
    await _release(nc, lease_a2)
    timings = reply_a2["timings"]
    assert timings["cache_n"] > 0, timings  # the slot still held A's prompt

    # a side job of A goes to the engine A's prompt is not on
    check = [{"role": "user", "content": "Is 'blue' a colour? Answer yes or no."}]
    side = await _lease(nc, "verify", "A", check)
    assert (side.placement.engine, side.placement.reason) == ("two", "apart")
    await _complete(side, check)
    await _release(nc, side)

    info = await wait_info(nc, lambda i: sum(e.grants for e in i.engines) == 4, 10, sup)
    rows = {e.id: e for e in info.engines}
    assert (rows["one"].grants, rows["two"].grants) == (2, 2)
    assert rows["one"].slots[lease_a1.id_slot].conversation == "A"


async def test_pool_failover_restores_the_saved_slot_on_the_other_engine(
    pool_env, nc, supervisor_factory, tmp_path
):
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    extra = ["--slot-save-path", str(slot_dir)]
    one = servers.start_llama(ctx=2048, parallel=2, threads=1, extra=extra)
    try:
        two = servers.start_llama(ctx=2048, parallel=2, threads=1, extra=extra)
    except BaseException:
        one.stop()
        raise
    try:
        env = {
            **pool_env,
            "LOKI_ENGINE_URLS": f"one={one.url},two={two.url}",
            "LOKI_ENGINE_SLOT_DIR": str(slot_dir),
        }
        sup = supervisor_factory(env)
        await wait_info(nc, lambda i: [e.state for e in i.engines] == ["ready", "ready"], 120, sup)
        a1 = [SYSTEM, {"role": "user", "content": "Name a colour of the sky at noon."}]
        lease_a1 = await _lease(nc, "main", "A", a1)
        assert lease_a1.placement.engine == "one"
        reply = await _complete(lease_a1, a1)
        await _release(nc, lease_a1)
        # idle for a while after the turn: the slot is saved (failover insurance)
        info = await wait_info(nc, lambda i: i.engines[0].saves >= 1, 30, sup)
        assert info.engines[0].slots[lease_a1.id_slot].saved

        one.stop()  # A's engine dies
        await wait_info(nc, lambda i: [e.state for e in i.engines] == ["failed", "ready"], 30, sup)
        answer = reply["choices"][0]["message"]["content"] or ""
        a2 = [*a1, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
        lease_a2 = await _lease(nc, "main", "A", a2)
        placement = lease_a2.placement
        assert (placement.engine, placement.reason, placement.moved_from) == (
            "two",
            "failover",
            "one",
        )
        assert placement.transfer == "restored" and (placement.restored_tokens or 0) > 0
        reply2 = await _complete(lease_a2, a2)
        await _release(nc, lease_a2)
        assert reply2["timings"]["cache_n"] > 0, reply2["timings"]  # restored, not recomputed
        info = await wait_info(nc, lambda i: i.engines[1].restores == 1, 10, sup)
        assert info.engines[1].moves_in == 1
    finally:
        one.stop()
        two.stop()
