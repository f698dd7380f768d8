"""The verifier (``LOKI_VERIFY``, a preset's ``VERIFY``) against the scripted fake engine:
off (byte-identical to the frozen copy), a pass, a fail (one corrective round, never two),
a malformed verdict (a pass, logged), a stop during the verification."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from loki_chat.tools import ToolBox
from loki_chat.verify import VERIFY_PROMPT, Verdict, corrective_reminder, parse_verdict
from tests.chat.test_chat_bounded_replies import idle
from tests.fakes.fake_engine import Stream, chunk, default_usage, text_reply, tool_reply

#: A one-message turn with the system prompt ``S.`` and no tools, as the chat service sent
#: it before the verifier existed: with the verifier off it must stay byte-identical.
FROZEN_TURN_REQUEST = (
    b'{"messages":[{"content":"S.","role":"system"},{"content":"What is 2+2?","role":"user"}],'
    b'"model":"fake-model","stream":true,"stream_options":{"include_usage":true}}'
)


async def start(chat_runner, **over):
    svc = await chat_runner.start(system_prompt="S.", **over)
    svc.toolbox = ToolBox()
    return svc


def verdict(v: str, reason: str = "r", **kw) -> Stream:
    return text_reply(json.dumps({"verdict": v, "reason": reason}), **kw)


def loki_events(client, cid: str, name: str) -> list[dict]:
    return [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == name]


@pytest.mark.parametrize("key,preset", [(False, None), (False, False), (True, False)])
async def test_verifier_off_sends_nothing_more_byte_identical(
    chat_runner, supervisor, client, fake_engine, key, preset
):
    supervisor.verify = preset  # the preset's VERIFY wins over the key when it says
    await start(chat_runner, verify=key)
    fake_engine.push(text_reply("4"))
    cid, end = await client.turn("What is 2+2?")
    assert end.finish_reason == "stop"
    assert [r.body for r in fake_engine.requests] == [FROZEN_TURN_REQUEST]
    assert [lease.kind for lease in supervisor.leases] == ["main"]
    assert loki_events(client, cid, "verify") == []


@pytest.mark.parametrize("key,preset", [(True, None), (False, True)])
async def test_a_passing_verdict_leaves_the_turn_as_it_was(
    chat_runner, supervisor, client, fake_engine, key, preset
):
    supervisor.verify = preset
    await start(chat_runner, verify=key)
    fake_engine.push(
        text_reply("4"),
        verdict("pass", "correct", usage=default_usage(prompt_tokens=9999)),
        text_reply("6"),
        verdict("pass", "correct"),
    )
    cid, end = await client.turn("What is 2+2?")
    assert end.finish_reason == "stop" and end.loki["steps"] == 1
    main, check = fake_engine.requests
    assert main.body == FROZEN_TURN_REQUEST  # the turn's own request is unchanged
    assert [lease.kind for lease in supervisor.leases] == ["main", "verify"]
    assert supervisor.leases[1].conversation == cid
    assert [r.job_done for r in supervisor.release_requests] == [False, True]
    body = check.json
    assert "tools" not in body and body["max_tokens"] == 512
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == VERIFY_PROMPT
    assert "<request>\nWhat is 2+2?\n</request>" in body["messages"][1]["content"]
    assert "<answer>\n4\n</answer>" in body["messages"][1]["content"]
    assert loki_events(client, cid, "verify") == [
        {"event": "verify", "verdict": "pass", "reason": "correct"}
    ]
    # nothing of the verifier in the history; its usage (9999 prompt tokens) is not the
    # conversation's ctx_used
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant"]
    assert end.loki["ctx_used"] < 9999 and state.ctx_used < 9999
    # the next turn extends the first one byte for byte
    await client.turn("And 3+3?", cid)
    nxt = fake_engine.requests[2].body.decode()
    assert nxt.startswith(main.body.decode()[: main.body.decode().index("]")])
    assert [m["content"] for m in fake_engine.requests[2].json["messages"]] == [
        "S.",
        "What is 2+2?",
        "4",
        "And 3+3?",
    ]


@pytest.mark.parametrize("budget", [1, 2, 6])
async def test_a_failing_verdict_adds_one_corrective_round_never_two(
    chat_runner, supervisor, client, fake_engine, budget
):
    await start(chat_runner, verify=True, step_budget=budget)
    fake_engine.push(
        text_reply("5"),
        verdict("fail", "2+2 is 4, not 5", usage=default_usage(prompt_tokens=9999)),
        text_reply("4"),
    )
    cid, end = await client.turn("What is 2+2?")
    assert end.finish_reason == "stop" and end.loki["steps"] == 2
    assert len(fake_engine.requests) == 3  # never a second verification nor correction
    assert [lease.kind for lease in supervisor.leases] == ["main", "verify", "main"]
    reminder = corrective_reminder(Verdict(ok=False, reason="2+2 is 4, not 5"))
    assert "2+2 is 4, not 5." in reminder
    sent = fake_engine.requests[2].json["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[-1]["content"] == reminder  # no budget reminder joined to it
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant", "user", "assistant"]
    assert stored[3].content == reminder and stored[3].loki.injected == "verify"
    assert stored[4].content == "4"
    assert loki_events(client, cid, "reminder") == [
        {"event": "reminder", "injected": "verify", "stored": True}
    ]
    assert loki_events(client, cid, "verify")[0]["verdict"] == "fail"
    assert end.loki["ctx_used"] < 9999
    assert supervisor.held() == 0


async def test_a_malformed_verdict_is_a_pass_and_logged(
    chat_runner, supervisor, client, fake_engine, caplog
):
    caplog.set_level(logging.WARNING, logger="loki.chat.verify")
    await start(chat_runner, verify=True)
    fake_engine.push(text_reply("4"), text_reply("Looks fine to me!"))
    cid, end = await client.turn("What is 2+2?")
    assert end.finish_reason == "stop" and len(fake_engine.requests) == 2
    (event,) = loki_events(client, cid, "verify")
    assert event["verdict"] == "pass" and event["malformed"] is True
    assert any("taken as a pass" in r.getMessage() for r in caplog.records)
    assert [m.role for m in (await client.state(cid)).messages] == ["system", "user", "assistant"]


async def test_stop_during_the_verification_keeps_the_answer_and_ends_the_turn(
    chat_runner, supervisor, client, fake_engine
):
    await start(chat_runner, verify=True)
    slow = Stream(frames=[chunk({"content": "{"})] * 200, delay_s=0.05)
    fake_engine.push(text_reply("4"), slow)
    reply = await client.send("What is 2+2?")
    cid = reply.conversation
    await asyncio.to_thread(fake_engine.wait_requests, 2)
    await asyncio.sleep(0.2)
    assert (await client.control(cid, "stop")).ok
    (end,) = await client.tap.wait_turn_ends(cid)
    assert end.finish_reason == "stopped"
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert stored[-1].content == "4" and stored[-1].loki is None
    assert loki_events(client, cid, "verify") == []
    assert len(fake_engine.requests) == 2 and supervisor.held() == 0


async def test_a_subagent_turn_is_never_verified(chat_runner, supervisor, client, fake_engine):
    svc = await chat_runner.start(verify=True)
    svc.toolbox.add(svc.subagent_tool())
    fake_engine.push(
        tool_reply([("c1", "subagent", '{"task": "t"}')]),
        text_reply("sub answer"),
        text_reply("final"),
        verdict("pass"),
    )
    await client.turn("delegate")
    kinds = [lease.kind for lease in supervisor.leases]
    assert kinds == ["main", "subagent", "main", "verify"]


async def test_a_continue_is_never_verified(chat_runner, supervisor, client, fake_engine):
    supervisor.max_tokens = 8  # the preset's cap: the first answer is cut there
    await start(chat_runner, verify=True)
    cut = text_reply("2+2 is", finish_reason="length", usage=default_usage(30, 8))
    fake_engine.push(cut, text_reply(" 4."), verdict("fail", "should never be asked"))
    cid, end = await client.turn("What is 2+2?")
    assert end.finish_reason == "length"  # cut: not verified either
    await idle(client, cid)
    assert (await client.control(cid, "continue")).ok
    ends = await client.tap.wait_turn_ends(cid, 2)
    assert ends[1].finish_reason == "stop" and ends[1].loki["steps"] == 1
    # the Continue ended by stop, yet no verify lease, request nor corrective round
    assert [lease.kind for lease in supervisor.leases] == ["main", "main"]
    assert len(fake_engine.requests) == 2
    assert loki_events(client, cid, "verify") == []
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert stored[-1].content == "2+2 is 4."
    assert supervisor.held() == 0


@pytest.mark.parametrize(
    "text,ok,malformed",
    [
        ('{"verdict": "pass", "reason": "fine"}', True, False),
        ('Verdict: {"verdict": "FAIL", "reason": "wrong"} done', False, False),
        ('{"verdict": "maybe"}', True, True),
        ("not json", True, True),
        ("", True, True),
    ],
)
def test_parse_verdict(text, ok, malformed):
    v = parse_verdict(text)
    assert (v.ok, v.malformed) == (ok, malformed)
