"""Issue 44 in the chat service: every lease request names the fingerprints of the messages
its request sends (``LeaseRequest.prompt_fingerprints``: the cache-affinity key with several
engines), and the perf record of each completion copies the lease's ``placement``
(``engine``, ``moved_from``, ``transfer``). On the scripted fake engine and the fake
supervisor, so the lease requests and the requests sent can be compared one for one."""

from __future__ import annotations

import json
import time
from typing import Any

from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import LeaseRequest, Placement
from loki_shared.messages.perf import PerfRecord
from tests.fakes.fake_engine import FakeEngine, text_reply, tool_reply
from tests.fakes.fake_supervisor import FakeSupervisor


def pairs(supervisor: FakeSupervisor, engine: FakeEngine) -> list[tuple[LeaseRequest, Any]]:
    """Each lease request with the request sent under it (the flows here are sequential:
    one request per lease, in order)."""
    sent = [r.json for r in engine.requests]
    assert len(supervisor.requests) == len(sent), (len(supervisor.requests), len(sent))
    return list(zip(supervisor.requests, sent, strict=True))


def assert_named(supervisor: FakeSupervisor, engine: FakeEngine) -> None:
    """Every lease request named exactly the fingerprints of the messages it sent."""
    for lease, body in pairs(supervisor, engine):
        assert lease.prompt_fingerprints, lease.kind
        assert lease.prompt_fingerprints == fingerprints(body["messages"]), lease.kind


async def records_of(nc: Any, cid: str, n: int, timeout: float = 10.0) -> list[PerfRecord]:
    """The first ``n`` perf records of conversation ``cid`` in the perf stream."""
    sub = await nc.jetstream().subscribe(subjects.PERF_RECORD, ordered_consumer=True)
    found: list[PerfRecord] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(found) < n:
        try:
            msg = await sub.next_msg(timeout=1)
        except Exception:  # noqa: BLE001 - nothing yet
            continue
        record = PerfRecord.model_validate_json(msg.data)
        if record.conversation == cid:
            found.append(record)
    await sub.unsubscribe()
    assert len(found) == n, found
    return found


async def test_every_lease_names_the_fingerprints_of_the_messages_it_sends(
    chat_runner, supervisor, client, fake_engine
):
    """A turn with a tool call (a sub-agent), its answer verified, then a second turn whose
    first step echoes the first turn's reasoning (REASONING_ECHO: the messages depend on the
    previous lease's model): each of the seven lease requests (main, subagent, main, verify,
    main, verify) names what its request sent, byte for byte."""
    svc = await chat_runner.start(verify=True, reasoning_echo=True, system_prompt="S.")
    svc.toolbox.add(svc.subagent_tool())
    verdict = json.dumps({"verdict": "pass", "reason": "answers"})
    fake_engine.push(
        tool_reply([("c1", "subagent", '{"task": "find it"}')]),
        text_reply("found"),
        text_reply("It is found.", reasoning="The sub-agent found it."),
        text_reply(verdict),
        text_reply("Nothing else.", reasoning="Still found."),
        text_reply(verdict),
    )
    cid, end = await client.turn("delegate")
    assert end.finish_reason == "stop"
    _, end = await client.turn("anything else?", cid)
    assert end.finish_reason == "stop"
    kinds = [r.kind for r in supervisor.requests]
    assert kinds == ["main", "subagent", "main", "verify", "main", "verify"]
    last = fake_engine.requests[4].json["messages"]
    assert any("reasoning_content" in m for m in last), "nothing echoed: nothing compared"
    assert_named(supervisor, fake_engine)


async def test_a_step_after_a_tool_call_names_the_messages_with_the_tool_results(
    chat_runner, supervisor, client, fake_engine
):
    """The second step of a turn (after a tool call) names the whole prompt, the tool's
    result included: its fingerprints extend the first step's."""
    await chat_runner.start(system_prompt="S.")
    fake_engine.push(
        tool_reply([("c1", "ping", "{}")]),
        text_reply("done"),
    )
    await client.turn("look it up")
    first, second = (r.prompt_fingerprints for r in supervisor.requests)
    assert len(second) > len(first) and second[: len(first)] == first
    assert_named(supervisor, fake_engine)


async def test_the_perf_record_copies_the_leases_placement(
    chat_runner, supervisor, client, fake_engine, nc
):
    """With a pooled grant (``Lease.placement``) the record says which engine ran it, where
    the conversation's prefix was and what was done about it; without one (one engine) the
    record is as before: ``engine`` "", ``moved_from`` and ``transfer`` None."""
    await chat_runner.start()
    fake_engine.push(text_reply("one"), text_reply("two"))
    cid, _ = await client.turn("q")
    supervisor.placement = Placement(
        engine="b", id_slot=1, reason="overloaded", prefix=0, moved_from="a", transfer="restored"
    )
    await client.turn("q2", cid)
    before, after = await records_of(nc, cid, 2)
    assert (before.engine, before.moved_from, before.transfer) == ("", None, None)
    assert (after.engine, after.moved_from, after.transfer) == ("b", "a", "restored")
