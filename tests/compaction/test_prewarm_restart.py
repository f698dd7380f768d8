"""PREWARM after an engine restart (``loki_chat.restart_prewarm``), on the scripted fake engine
and the fake supervisor: a ``loki.engine.state`` ``ready`` event of a local engine sends the
prefix of the conversation of the instance's last main turn (the next request less its user
message) under a ``prewarm`` lease; nothing when the key is off, for an external preset or
another state, when SLOT_PERSIST restored the slot, when no turn ran, when the owner's turn
runs, or when a turn step was asked since the event."""

from __future__ import annotations

import asyncio
import time

import pytest

from loki_shared import subjects
from loki_shared.messages.engine import EngineState
from loki_shared.messages.perf import PerfRecord
from tests.fakes.fake_engine import text_reply

from .test_compaction_tail_reuse import reply


async def until(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def prewarm_leases(supervisor) -> list:
    return [r for r in supervisor.requests if r.kind == "prewarm"]


def warm_requests(fake_engine) -> list[dict]:
    return [r.json for r in fake_engine.requests if r.json.get("max_tokens") == 1]


async def ready(nc, state: str = "ready", external: bool = False, engine: str = "") -> None:
    """The supervisor's event after a (re)start (``engine``: a pooled engine's, issue 44)."""
    event = EngineState(state=state, ts=time.time(), external=external, engine=engine)
    await nc.publish(subjects.ENGINE_STATE, event.model_dump_json().encode())
    await nc.flush()


async def two_conversations(client, fake_engine, service) -> tuple[str, str]:
    """A turn in A, then one in B (B's is the instance's last main turn); returns once both
    workers are done (after its end event a worker still writes the conversation)."""
    fake_engine.push(reply("Hello A.", 200), reply("Hello B.", 200))
    a, _ = await client.turn("First conversation, first message.")
    b, _ = await client.turn("Second conversation, first message.")
    await until(lambda: not any(actor.busy for actor in service.actors.values()))
    return a, b


async def test_a_ready_event_prewarms_the_last_main_conversation(
    chat_runner, supervisor, client, fake_engine, nc
):
    records: list[PerfRecord] = []

    async def on(msg) -> None:
        records.append(PerfRecord.model_validate_json(msg.data))

    await nc.subscribe(subjects.PERF_RECORD, cb=on)
    await nc.flush()
    service = await chat_runner.start(system_prompt="S.", prewarm=True)
    _, b = await two_conversations(client, fake_engine, service)
    assert prewarm_leases(supervisor) == []  # no compaction: no prewarm at turn end
    fake_engine.push(text_reply("w", usage={"prompt_tokens": 40, "completion_tokens": 1}))
    await ready(nc)
    await until(lambda: service.restart_prewarm.task is not None)
    assert service.restart_prewarm.last == "sent"
    assert await service.restart_prewarm.task == "done"
    [lease] = prewarm_leases(supervisor)
    assert lease.conversation == b and lease.wait_s == 15.0
    [warm] = warm_requests(fake_engine)
    assert warm["stream"] is True
    fake_engine.push(reply("Sure.", 300))
    await client.turn("Thanks", b)
    nxt = fake_engine.requests[-1].json
    assert warm["messages"] == nxt["messages"][:-1]  # the next request less its user message
    assert nxt["messages"][-1]["content"] == "Thanks"
    assert {k: v for k, v in warm.items() if k not in ("messages", "max_tokens")} == {
        k: v for k, v in nxt.items() if k not in ("messages", "max_tokens")
    }
    await until(lambda: any(r.kind == "prewarm" for r in records))
    [rec] = [r for r in records if r.kind == "prewarm"]
    assert rec.conversation == b
    assert supervisor.held() == 0


@pytest.mark.parametrize(
    "case", ["off", "external", "starting", "stopped", "restored", "no_turn_yet", "pooled"]
)
async def test_nothing_is_sent_unless_a_local_engine_came_back_empty(
    chat_runner, supervisor, client, fake_engine, nc, case
):
    service = await chat_runner.start(system_prompt="S.", prewarm=case != "off")
    if case == "restored":
        supervisor.slot_persist = {"action": "restore", "file": "x.bin", "n_restored": 900}
    if case != "no_turn_yet":
        await two_conversations(client, fake_engine, service)
    await ready(
        nc,
        state=case if case in ("starting", "stopped") else "ready",
        external=case == "external",
        engine="gpu1" if case == "pooled" else "",
    )
    if case in ("restored", "no_turn_yet"):
        await until(lambda: service.restart_prewarm.last is not None)
    await asyncio.sleep(0.5)
    task = service.restart_prewarm.task
    if case == "restored":  # the lease was asked (the restore ran first), nothing sent
        assert task is not None and await task == "restored"
        assert len(prewarm_leases(supervisor)) == 1
    else:
        assert task is None and prewarm_leases(supervisor) == []
    assert service.restart_prewarm.last == {"no_turn_yet": "no_owner", "restored": "sent"}.get(case)
    assert warm_requests(fake_engine) == []
    assert supervisor.held() == 0


async def test_a_failed_restore_still_prewarms(chat_runner, supervisor, client, fake_engine, nc):
    service = await chat_runner.start(system_prompt="S.", prewarm=True)
    supervisor.slot_persist = {"action": "restore", "error": "no slot file to restore"}
    await two_conversations(client, fake_engine, service)
    fake_engine.push(text_reply("w"))
    await ready(nc)
    await until(lambda: service.restart_prewarm.task is not None)
    assert await service.restart_prewarm.task == "done"
    assert len(warm_requests(fake_engine)) == 1


async def test_the_owners_running_turn_or_a_step_asked_since_wins(
    chat_runner, supervisor, client, fake_engine, nc
):
    service = await chat_runner.start(system_prompt="S.", prewarm=True)
    _, b = await two_conversations(client, fake_engine, service)
    # the owner's own turn runs (a slow answer): its request fills the slot, no prewarm
    fake_engine.push(text_reply("slow", pieces=3, delay_s=0.5))
    await client.send("Another message.", b)
    await until(lambda: service.actors[b].busy)
    await ready(nc)
    await until(lambda: service.restart_prewarm.last is not None)
    assert service.restart_prewarm.last == "busy" and service.restart_prewarm.task is None
    await until(lambda: not service.actors[b].busy)
    # a turn step asked between the event and the prewarm's grant has the slot
    check = service.restart_prewarm._check(service.shared.leases.main_asked)
    service.shared.leases.main_asked += 1
    assert await check(None) == "taken"  # type: ignore[arg-type]
    assert warm_requests(fake_engine) == []


async def test_a_turn_that_has_ended_is_waited_for(
    chat_runner, supervisor, client, fake_engine, nc
):
    """The event comes right after the owner's end event, while its worker still writes the
    conversation's last state (slow here): the prewarm waits for it and is sent."""
    service = await chat_runner.start(system_prompt="S.", prewarm=True)
    _, b = await two_conversations(client, fake_engine, service)
    actor = service.actors[b]
    written = actor.persist

    async def slow_persist() -> None:  # Redis under load
        await asyncio.sleep(0.5)
        await written()

    actor.persist = slow_persist  # type: ignore[method-assign]
    fake_engine.push(reply("Sure.", 300))
    await client.turn("Thanks", b)
    assert actor.busy and not actor.conv.turn_open  # ended, the last write still under way
    fake_engine.push(text_reply("w"))
    await ready(nc)
    await until(lambda: service.restart_prewarm.last is not None)
    assert service.restart_prewarm.last == "sent"
    assert await service.restart_prewarm.task == "done"
    assert len(warm_requests(fake_engine)) == 1
