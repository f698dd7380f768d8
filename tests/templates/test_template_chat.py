"""What the template probe's verdicts change in the chat service, against the scripted fake
engine and a fake supervisor whose leases carry the verdicts (``Lease.template``):
tools withheld from a template that drops them (and the user told), REASONING_ECHO only to
a template that renders it, and NUDGE_IN_TOOL (off: byte-identical to the frozen copy)."""

from __future__ import annotations

import asyncio
import json

import pytest

from loki_chat.reminders import BUDGET_REMINDER
from loki_chat.tools import ToolBox, ToolSpec
from loki_shared import subjects
from loki_shared.messages.engine import TemplateProbe
from loki_shared.messages.perf import PerfRecord
from tests.fakes.fake_engine import HTTPError, text_reply, tool_reply


def verdicts(**over) -> TemplateProbe:
    """A template that renders tools and reasoning, keeps its prefix, allows two users."""
    values = dict(
        template_hash="h",
        supports_tools=True,
        renders_reasoning=True,
        stable_prefix=True,
        strict_alternation=False,
    )
    values.update(over)
    return TemplateProbe(**values)


async def pong(_args) -> str:
    return "pong"


async def start_ping_only(chat_runner, **over):
    """A chat service with the system prompt ``S.`` and one tool, ``ping``: the frozen
    request below depends on nothing else's defaults."""
    svc = await chat_runner.start(step_budget=2, system_prompt="S.", **over)
    svc.toolbox = ToolBox([ToolSpec(name="ping", description="Answers pong.", run=pong)])
    return svc


#: The budget reminder's request after one tool call, NUDGE_IN_TOOL off, frozen as the chat
#: service sent it before the key existed: with the key off it must stay byte-identical.
FROZEN_BUDGET_REQUEST = (
    b'{"messages":[{"content":"S.","role":"system"},{"content":"Ping please","role":"user"},'
    b'{"content":"","role":"assistant","tool_calls":[{"function":{"arguments":"","name":"ping"},'
    b'"id":"c1","type":"function"}]},{"content":"pong","role":"tool","tool_call_id":"c1"},'
    b'{"content":"[Loki] This is the last step of this turn: answer the user now with what you '
    b'have, without calling a tool.","role":"user"}],"model":"fake-model","stream":true,'
    b'"stream_options":{"include_usage":true},"tools":[{"function":{"description":"Answers '
    b'pong.","name":"ping","parameters":{"properties":{},"type":"object"}},"type":"function"}]}'
)


@pytest.mark.parametrize(
    "nudge,template",
    [
        (False, None),
        (False, verdicts()),  # off: even a stable template gets the separate message
        (True, None),  # on, but no probe: the separate message
        (True, verdicts(stable_prefix=False)),  # on, unstable prefix: the separate message
    ],
)
async def test_budget_reminder_stays_the_frozen_separate_message(
    chat_runner, supervisor, client, fake_engine, nudge, template
):
    supervisor.template = template
    await start_ping_only(chat_runner, nudge_in_tool=nudge)
    fake_engine.push(tool_reply([("c1", "ping", "")]), text_reply("pong!"))
    await client.turn("Ping please")
    assert fake_engine.requests[1].body == FROZEN_BUDGET_REQUEST


async def test_budget_reminder_stays_separate_on_an_external_api_with_nudge_on(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.template = verdicts()
    supervisor.external = True
    await start_ping_only(chat_runner, nudge_in_tool=True)
    fake_engine.push(tool_reply([("c1", "ping", "")]), text_reply("pong!"))
    await client.turn("Ping please")
    msgs = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in msgs][-2:] == ["tool", "user"]
    assert msgs[-1]["content"] == BUDGET_REMINDER


async def test_nudge_in_tool_puts_the_budget_reminder_in_the_tool_result_persisted_as_sent(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.template = verdicts()
    await start_ping_only(chat_runner, nudge_in_tool=True)
    fake_engine.push(tool_reply([("c1", "ping", "")]), text_reply("pong!"), text_reply("next"))
    cid, end = await client.turn("Ping please")
    assert end.finish_reason == "stop"
    sent = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[-1]["content"] == f"pong\n\n{BUDGET_REMINDER}"
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool", "assistant"]
    assert stored[3].content == sent[-1]["content"]  # persisted exactly as sent
    events = [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "reminder"]
    assert events == [{"event": "reminder", "injected": "budget", "stored": True, "in_tool": True}]
    # the next turn's request extends the one that carried the nudge, byte for byte
    await client.turn("again", cid)
    second = fake_engine.requests[1].body.decode()
    third = fake_engine.requests[2].body.decode()
    head = json.dumps(sent, sort_keys=True, separators=(",", ":"), ensure_ascii=False)[:-1]
    assert second.startswith('{"messages":' + head) and third.startswith('{"messages":' + head)


async def test_an_unanswered_nudge_leaves_the_tool_result_as_it_was(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.template = verdicts()
    await start_ping_only(chat_runner, nudge_in_tool=True)
    refused = {"error": {"code": 400, "message": "bad request", "type": "invalid_request_error"}}
    fake_engine.push(tool_reply([("c1", "ping", "")]), HTTPError(400, refused))
    cid, end = await client.turn("Ping please")
    assert end.finish_reason == "error"
    nudged = fake_engine.requests[1].json["messages"][-1]
    assert nudged["role"] == "tool" and nudged["content"] == f"pong\n\n{BUDGET_REMINDER}"
    stored = (await client.state(cid)).messages
    assert stored[-1].role == "tool" and stored[-1].content == "pong"


@pytest.mark.parametrize("nudge", [False, True])
async def test_a_strict_alternation_template_never_sees_two_user_messages(
    chat_runner, supervisor, client, fake_engine, nudge
):
    supervisor.template = verdicts(strict_alternation=True)
    await start_ping_only(chat_runner, nudge_in_tool=nudge)
    fake_engine.push(
        text_reply("", reasoning="thinking only"),  # reasoning only: an act reminder
        text_reply("answer"),  # the last step: the budget reminder behind it
        tool_reply([("c1", "ping", "")]),
        text_reply("pong!"),  # after a tool result: the budget reminder
    )
    cid, _ = await client.turn("first")
    await client.turn("second", cid)
    assert len(fake_engine.requests) == 4
    for request in fake_engine.requests:
        roles = [m["role"] for m in request.json["messages"]]
        assert not any(a == b == "user" for a, b in zip(roles, roles[1:])), roles


async def test_tools_are_not_sent_to_a_template_that_drops_them_and_the_user_is_told(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.template = verdicts(supports_tools=False)
    await start_ping_only(chat_runner)
    fake_engine.push(text_reply("no tools here"), text_reply("still none"))
    cid, _ = await client.turn("hello")
    await client.turn("again", cid)
    assert all("tools" not in r.json for r in fake_engine.requests)
    told = [
        e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "tools_unavailable"
    ]
    assert len(told) == 2  # once per turn
    assert told[0]["tools"] == ["ping"] and "ignores tools" in told[0]["reason"]
    state = await client.state(cid)
    assert state.tools_unavailable and state.tools_unavailable["tools"] == ["ping"]
    # the engine changes to one whose template renders tools: offered again
    supervisor.template = verdicts()
    fake_engine.push(text_reply("tools back"))
    await client.turn("third", cid)
    assert [t["function"]["name"] for t in fake_engine.requests[2].json["tools"]] == ["ping"]
    assert (await client.state(cid)).tools_unavailable is None


@pytest.mark.parametrize("renders", [True, False])
async def test_reasoning_echo_consults_the_probe(
    chat_runner, supervisor, client, fake_engine, renders
):
    supervisor.template = verdicts(renders_reasoning=renders)
    await chat_runner.start(reasoning_echo=True)
    fake_engine.push(text_reply("A", reasoning="because"), text_reply("B"))
    cid, _ = await client.turn("q1")
    await client.turn("q2", cid)
    sent = fake_engine.requests[1].json["messages"][2]
    if renders:
        assert sent == {"role": "assistant", "content": "A", "reasoning_content": "because"}
    else:  # the template would drop it: nothing sent back, nothing counted as sent back
        assert sent == {"role": "assistant", "content": "A"}


@pytest.mark.parametrize("stable", [False, True, None])
async def test_an_unstable_prefix_marks_the_turn_end_and_the_perf_record(
    chat_runner, supervisor, client, fake_engine, nc, stable
):
    """Issue 16: with the probe's ``stable_prefix`` False the turn end says
    ``prefix_unstable`` (the UI's prefill badge says why) and the perf record is flagged (the
    perf service names the loss ``template``); True or not probed: neither."""
    got: list[PerfRecord] = []

    async def on(msg) -> None:
        got.append(PerfRecord.model_validate_json(msg.data))

    await nc.subscribe(subjects.PERF_RECORD, cb=on)
    await nc.flush()
    supervisor.template = verdicts(stable_prefix=False) if stable is False else None
    if stable is True:
        supervisor.template = verdicts()
    await start_ping_only(chat_runner)
    fake_engine.push(text_reply("hello"))
    _, end = await client.turn("Hi")
    assert end.finish_reason == "stop"
    assert (end.loki or {}).get("prefix_unstable") is (True if stable is False else None)
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.02)
    [record] = [r for r in got if r.kind == "main"]
    assert record.prefix_unstable is (stable is False)
