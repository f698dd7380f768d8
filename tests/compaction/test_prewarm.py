"""PREWARM (``LOKI_PREWARM``) in the chat service, on the scripted fake engine and a fake
supervisor: after a compaction at turn end the next request's prefix is sent under a
``prewarm`` lease (perf record kind ``prewarm``); the conversation's next turn pre-empts it
(request cancelled, lease released, the turn not delayed); a lease the supervisor revokes
cancels it too; never on an external preset; off: nothing is sent."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from loki_chat.engine import EngineClient
from loki_chat.prewarm import PrewarmJob, run_prewarm
from loki_shared import subjects
from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease
from loki_shared.messages.perf import PerfRecord
from tests.chat.helpers import chat_settings
from tests.fakes.fake_engine import default_usage, text_reply

from .conftest import summary_requests
from .test_compaction_tail_reuse import SUMMARY, five_points, point, reply


async def until(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def lease_ids(supervisor) -> list[str]:
    """The fake supervisor's lease ids, in the order they were asked."""
    return [f"{supervisor.lease_prefix}{i + 1}" for i in range(len(supervisor.requests))]


def prewarm_leases(supervisor) -> list:
    return [r for r in supervisor.requests if r.kind == "prewarm"]


@pytest.mark.parametrize("tail_reuse", [False, True])
async def test_prewarm_sends_the_next_requests_prefix_after_a_compaction(
    chat_runner, supervisor, client, fake_engine, nc, tail_reuse
):
    records: list[PerfRecord] = []

    async def on(msg) -> None:
        records.append(PerfRecord.model_validate_json(msg.data))

    await nc.subscribe(subjects.PERF_RECORD, cb=on)
    await nc.flush()
    await chat_runner.start(system_prompt="S.", prewarm=True, compact_tail_reuse=tail_reuse)
    warm_reply = text_reply("warm", usage={"prompt_tokens": 300, "completion_tokens": 1})
    cid = await five_points(client, fake_engine, [warm_reply])  # compacted at the fifth's end
    await until(lambda: any(r.kind == "prewarm" for r in records))
    assert len(prewarm_leases(supervisor)) == 1
    # named by this process like its other leases: an unclaimed grant drops its other waiters
    [warm] = prewarm_leases(supervisor)
    assert warm.holder and warm.holder == next(r.holder for r in supervisor.requests)
    warm = fake_engine.requests[-1].json
    assert warm["stream"] is True and warm["max_tokens"] == 1
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    nxt = fake_engine.requests[-1].json
    # the prefix is the next request less its new user message (joined, with the tail first)
    if tail_reuse:
        assert warm["messages"][:-1] == nxt["messages"][:-1]
        assert nxt["messages"][-1]["content"].startswith(warm["messages"][-1]["content"])
        assert nxt["messages"][-1]["content"].endswith("\n\nThanks")
    else:
        assert warm["messages"] == nxt["messages"][:-1]
    assert {k: v for k, v in warm.items() if k not in ("messages", "max_tokens")} == {
        k: v for k, v in nxt.items() if k not in ("messages", "max_tokens")
    }
    [rec] = [r for r in records if r.kind == "prewarm"]
    assert rec.conversation == cid
    assert supervisor.held() == 0  # every lease released, the prewarm's included


async def test_with_reasoning_echo_the_prewarm_sends_the_reasoning_the_next_turn_sends(
    chat_runner, supervisor, client, fake_engine
):
    """REASONING_ECHO on: the tail's answers carry their ``reasoning_content`` in the
    prewarm exactly as in the next turn's request (else the prefix differs there)."""
    await chat_runner.start(system_prompt="S.", prewarm=True, reasoning_echo=True)
    fake_engine.push(
        *(
            text_reply(
                f"Noted {i}.",
                reasoning=f"Point {i} read.",
                usage=default_usage(prompt_tokens=700 * i if i < 5 else 3300, completion_tokens=5),
            )
            for i in range(1, 6)
        ),
        text_reply(SUMMARY),
        text_reply("warm", usage=default_usage(prompt_tokens=300, completion_tokens=1)),
    )
    cid, _ = await client.turn(point(1))
    for i in range(2, 6):
        await client.turn(point(i), cid)
    assert len(summary_requests(fake_engine)) == 1
    await until(lambda: fake_engine.requests[-1].json.get("max_tokens") == 1)
    warm = fake_engine.requests[-1].json
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    nxt = fake_engine.requests[-1].json
    echoed = [m for m in nxt["messages"] if "reasoning_content" in m]
    assert echoed, "the tail kept no answer with reasoning: nothing to compare"
    assert warm["messages"] == nxt["messages"][:-1]


async def test_the_next_turn_preempts_a_running_prewarm(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.", prewarm=True)
    # the prewarm's answer is slow: ~6 s if it were left to run
    cid = await five_points(client, fake_engine, [text_reply("slow", pieces=3, delay_s=2.0)])
    await until(lambda: len(prewarm_leases(supervisor)) == 1)
    await until(lambda: fake_engine.requests[-1].json.get("max_tokens") == 1)
    fake_engine.push(reply("Sure.", 900))
    t0 = time.monotonic()
    _, end = await client.turn("Thanks", cid)
    assert end.finish_reason == "stop" and time.monotonic() - t0 < 3.0
    assert supervisor.held() == 0  # the prewarm's lease was released, the turn's too
    # the prewarm's lease went back before the turn asked for its own
    [warm] = [
        lid for lid, r in zip(lease_ids(supervisor), supervisor.requests) if r.kind == "prewarm"
    ]
    turn_lease = lease_ids(supervisor)[-1]
    assert supervisor.released.index(warm) < supervisor.released.index(turn_lease)
    await until(lambda: fake_engine.disconnects >= 1, timeout=5.0)  # its stream was cut
    assert fake_engine.requests[-1].json["messages"][-1]["content"] == "Thanks"


async def test_a_revoked_prewarm_lease_cancels_the_request(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.ttl_s = 0.3  # renewals every 0.1 s
    await chat_runner.start(system_prompt="S.", prewarm=True)
    await five_points(client, fake_engine, [text_reply("slow", pieces=3, delay_s=2.0)])
    await until(lambda: fake_engine.requests[-1].json.get("max_tokens") == 1)
    [warm] = [i for i, r in supervisor.live.items() if r.kind == "prewarm"]
    del supervisor.live[warm]  # the supervisor gave the slot to a real request
    await until(lambda: warm in supervisor.released, timeout=2.0)


@pytest.mark.parametrize("on,external", [(False, False), (True, True)])
async def test_no_prewarm_request_when_off_or_external(
    chat_runner, supervisor, client, fake_engine, on, external
):
    supervisor.external = external
    await chat_runner.start(system_prompt="S.", prewarm=on)
    cid = await five_points(client, fake_engine)
    await asyncio.sleep(0.3)
    assert len(prewarm_leases(supervisor)) == (1 if on else 0)  # external: asked, unused
    assert not any(r.json.get("max_tokens") == 1 for r in fake_engine.requests)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)


def compaction_turns(client, cid: str) -> list[tuple[int, str]]:
    """Each compaction marker of ``cid``'s display log as (user turns before it, trigger)."""
    out, users = [], 0
    for event in client.tap.events[cid]:
        loki = event.loki or {}
        if loki.get("event") == "user":
            users += 1
        elif loki.get("event") == "compaction":
            out.append((users, loki.get("trigger")))
    return out


@pytest.mark.parametrize("on", [False, True])
async def test_with_prewarm_the_turn_end_looks_ahead_at_the_next_message(
    chat_runner, supervisor, client, fake_engine, nc, on
):
    # five ~200-token points; the fifth ends at 2,905 of 4,096 (threshold 3,072): the next
    # point would pass it. Off: the sixth turn compacts at its start, its user waiting for the
    # summary. On: the fifth compacts at its end (look-ahead) and the prewarm follows.
    await chat_runner.start(system_prompt="S.", prewarm=on)
    fake_engine.push(*(reply(f"Noted {i}.", 560 * i) for i in range(1, 5)), reply("Noted 5.", 2900))
    cid, _ = await client.turn(point(1))
    for i in range(2, 5):
        await client.turn(point(i), cid)
    if on:
        fake_engine.push(text_reply(SUMMARY), text_reply("warm"))
    await client.turn(point(5), cid)
    if on:
        await until(lambda: len(prewarm_leases(supervisor)) == 1)
        await until(lambda: fake_engine.requests[-1].json.get("max_tokens") == 1)
        assert compaction_turns(client, cid) == [(5, "end")]
        fake_engine.push(reply("Noted 6.", 1200))
    else:
        assert compaction_turns(client, cid) == []
        fake_engine.push(text_reply(SUMMARY), reply("Noted 6.", 1200))
    _, end = await client.turn(point(6), cid)
    assert end.finish_reason == "stop"
    assert compaction_turns(client, cid) == ([(5, "end")] if on else [(6, "start")])
    assert len(summary_requests(fake_engine)) == 1
    assert len(prewarm_leases(supervisor)) == (1 if on else 0)


class OneLease:
    """What :func:`run_prewarm` asks of the leases: here one granted lease, never lost."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = False

    def prewarm_lease(
        self, cid: str, wait_s: float | None = None, fingerprints: list[str] | None = None
    ):
        self.fingerprints = fingerprints

        @contextlib.asynccontextmanager
        async def held():
            yield self

        return held()


@pytest.mark.parametrize("system", [None, "S.\n\nThe project's snapshot line."])
async def test_the_prewarm_sends_the_system_message_the_turn_sent(fake_engine, tmp_path, system):
    """The turn's last system message (a project's snapshot line added to it) is the
    prewarm's; without one, the configured system prompt."""
    settings = chat_settings(
        "nats://127.0.0.1:1", "redis://127.0.0.1:1", tmp_path, system_prompt="S."
    )
    lease = Lease(lease_id="l1", kind="prewarm", base_url=fake_engine.url, model="fake-model")
    job = PrewarmJob("c1", [ChatMessage(role="user", content="Hi.")], None, system=system)
    records: list[PerfRecord] = []
    async with httpx.AsyncClient() as http:
        engine = EngineClient(http, [0.05])
        outcome = await run_prewarm(
            job, settings=settings, leases=OneLease(lease), engine=engine, publish=records.append
        )
    assert outcome == "done" and [r.kind for r in records] == ["prewarm"]
    sent = fake_engine.requests[-1].json
    assert sent["messages"][0] == {"role": "system", "content": system or "S."}
    assert sent["messages"][1:] == [{"role": "user", "content": "Hi."}]
    assert sent["max_tokens"] == 1


async def test_the_prewarm_check_skips_or_lets_it_go(fake_engine, tmp_path):
    """The check run once the lease is granted (PREWARM after an engine restart asks
    whether SLOT_PERSIST restored the slot): an outcome sends nothing, None sends it."""
    settings = chat_settings("nats://127.0.0.1:1", "redis://127.0.0.1:1", tmp_path)
    lease = Lease(lease_id="l1", kind="prewarm", base_url=fake_engine.url, model="fake-model")
    job = PrewarmJob("c1", [ChatMessage(role="user", content="Hi.")], None)
    asked: list[str] = []

    async def restored(held: Lease) -> str | None:
        asked.append(held.lease_id)
        return "restored"

    async def not_restored(held: Lease) -> str | None:
        asked.append(held.lease_id)
        return None

    async with httpx.AsyncClient() as http:
        engine = EngineClient(http, [0.05])
        kw = dict(settings=settings, leases=OneLease(lease), engine=engine, publish=lambda r: None)
        assert await run_prewarm(job, check=restored, **kw) == "restored"
        assert fake_engine.requests == []
        assert await run_prewarm(job, check=not_restored, **kw) == "done"
        assert len(fake_engine.requests) == 1 and asked == ["l1", "l1"]


async def test_a_lease_lost_as_the_answer_ends_counts_as_preempted(fake_engine, tmp_path):
    """The supervisor revoked the lease while the last bytes came: the slot is another
    request's now, so the prewarm reports a pre-emption and publishes no record."""
    settings = chat_settings("nats://127.0.0.1:1", "redis://127.0.0.1:1", tmp_path)
    lease = Lease(lease_id="l1", kind="prewarm", base_url=fake_engine.url, model="fake-model")
    held = OneLease(lease)

    class RevokedAtTheEnd(EngineClient):
        async def stream(self, *args, **kwargs):
            result = await super().stream(*args, **kwargs)
            held.lost = True  # seen at the renewal that follows the answer
            return result

    job = PrewarmJob("c1", [ChatMessage(role="user", content="Hi.")], None)
    records: list[PerfRecord] = []
    async with httpx.AsyncClient() as http:
        engine = RevokedAtTheEnd(http, [0.05])
        outcome = await run_prewarm(
            job, settings=settings, leases=held, engine=engine, publish=records.append
        )
    assert outcome == "preempted" and records == []
    assert len(fake_engine.requests) == 1
