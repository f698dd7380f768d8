"""Compaction inside the chat service's turn loop (default policy), on the scripted fake
engine, a fake supervisor, the real NATS, Redis and recall service."""

from __future__ import annotations

from loki_chat.compaction import CompactionPolicy
from loki_chat.compaction.decide import SUMMARY_HEADER
from tests.fakes.fake_engine import HTTPError, default_usage, text_reply

from .conftest import summary_requests
from .test_compaction_policy import SUMMARY, block


def reply(text: str, prompt_tokens: int):
    return text_reply(text, usage=default_usage(prompt_tokens=prompt_tokens, completion_tokens=5))


async def three_blocks(client, fake_engine, last_prompt: int = 2600) -> str:
    fake_engine.push(
        reply("Noted 0.", 900), reply("Noted 1.", 1700), reply("Noted 2.", last_prompt)
    )
    cid, _ = await client.turn("Here is file 0:\n" + block(0))
    await client.turn("Here is file 1:\n" + block(1), cid)
    await client.turn("Here is file 2:\n" + block(2), cid)
    return cid


def markers(client, cid: str) -> list[dict]:
    return [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "compaction"]


async def test_default_policy_compacts_at_turn_end(
    chat_runner, supervisor, client, fake_engine, recall
):
    svc = await chat_runner.start()
    assert isinstance(svc.policy, CompactionPolicy)  # the service's default
    cid = await three_blocks(client, fake_engine)
    assert not summary_requests(fake_engine) and not markers(client, cid)
    # the fourth turn ends past 75% of the 4096-token window: compaction at turn end
    fake_engine.push(reply("A lexer and a parser.", 3300), text_reply(SUMMARY))
    await client.turn("Tell me the design in one line.", cid)
    [summary_req] = summary_requests(fake_engine)
    assert summary_req["stream"] is False and "recall:r1" in summary_req["messages"][1]["content"]
    [mark] = markers(client, cid)
    assert mark["trigger"] == "end" and mark["path"] == "summary" and mark["archived"]
    state = await client.state(cid)
    roles = [m.role for m in state.messages]
    assert roles[0] == "system" and state.messages[1].loki.injected == "summary"
    assert state.messages[1].content == SUMMARY_HEADER + SUMMARY
    assert all(not (a == b == "user") for a, b in zip(roles, roles[1:]))
    # the next turn's request carries the summary after the fixed system prompt
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    nxt = fake_engine.requests[-1].json
    assert nxt["stream"] is True and nxt["messages"][1]["content"] == SUMMARY_HEADER + SUMMARY


async def test_reactive_overflow_compacts_and_replays(
    chat_runner, supervisor, client, fake_engine, recall
):
    await chat_runner.start()
    cid = await three_blocks(client, fake_engine, last_prompt=2500)
    overflow = HTTPError(
        400,
        {
            "error": {
                "code": 400,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 4300,
                "n_ctx": 4096,
                "message": "the request exceeds the available context size",
            }
        },
    )
    fake_engine.push(overflow, text_reply(SUMMARY), reply("Here it is.", 1200))
    _, end = await client.turn("Now paste it all back.", cid)
    assert end.finish_reason == "stop" and "error" not in end.loki
    [mark] = markers(client, cid)
    assert mark["trigger"] == "reactive"
    replayed = fake_engine.requests[-1].json
    assert replayed["stream"] is True
    assert replayed["messages"][1]["content"].startswith(SUMMARY_HEADER)
    assert replayed["messages"][-1]["content"] == "Now paste it all back."


async def test_manual_compact_control(chat_runner, supervisor, client, fake_engine, recall):
    await chat_runner.start()
    cid = await three_blocks(client, fake_engine, last_prompt=1800)
    fake_engine.push(text_reply(SUMMARY))
    reply_ = await client.control(cid, "compact")
    assert reply_.ok and reply_.detail == "compacted"
    [mark] = markers(client, cid)
    assert mark["trigger"] == "manual"
    state = await client.state(cid)
    assert state.messages[1].loki.injected == "summary"
