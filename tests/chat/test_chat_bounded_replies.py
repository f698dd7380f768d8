"""Bounded replies (issue 23): ``max_tokens`` per step from the preset (through the lease),
a step cut there ends the turn with ``finish_reason: "length"`` and ``cut_at``, and Continue
resumes the same assistant message. Scripted fake engine; the real engine's side (the
continue request prefills only a few tokens) is in ``test_chat_real_engine.py``."""

from __future__ import annotations

import asyncio

from tests.fakes.fake_engine import default_usage, text_reply

PART_1 = "Counting: 1, 2, 3, 4,"
PART_2 = " 5, 6, 7. Done."


async def idle(client, cid: str) -> None:
    """Until the turn's worker is done (its turn end is published before it persists)."""
    for _ in range(200):
        if not (await client.state(cid)).generating:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the conversation stayed busy")


def cut_reply(text: str, completion_tokens: int):
    return text_reply(
        text,
        finish_reason="length",
        usage=default_usage(prompt_tokens=30, completion_tokens=completion_tokens),
    )


async def test_step_cap_comes_from_the_lease_and_a_cut_ends_the_turn(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.max_tokens = 64  # the preset's cap (a quarter of the window by default)
    await chat_runner.start(tools=False)
    fake_engine.push(cut_reply(PART_1, 64))
    cid, end = await client.turn("Count to ten.")
    assert fake_engine.requests[-1].json["max_tokens"] == 64
    assert end.finish_reason == "length" and end.loki["cut_at"] == 64
    # "length" because the window filled, below the cap: no cut_at
    fake_engine.push(cut_reply("and more", 20))
    _, end = await client.turn("Again.", cid)
    assert end.finish_reason == "length" and "cut_at" not in end.loki


async def test_loki_max_tokens_wins_over_the_lease_and_no_cap_sends_none(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.max_tokens = 64
    await chat_runner.start(tools=False, max_tokens=10)
    fake_engine.push(text_reply("ok"))
    await client.turn("Hi.")
    assert fake_engine.requests[-1].json["max_tokens"] == 10
    supervisor.max_tokens = None  # an external preset without a cap
    await chat_runner.stop_all()
    await chat_runner.start(tools=False)
    fake_engine.push(text_reply("ok"))
    await client.turn("Hi.")
    assert "max_tokens" not in fake_engine.requests[-1].json


async def test_continue_resumes_the_same_assistant_message(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.max_tokens = 64
    await chat_runner.start(tools=False)
    fake_engine.push(cut_reply(PART_1, 64))
    cid, _ = await client.turn("Count to seven.")
    await idle(client, cid)
    fake_engine.push(text_reply(PART_2))
    reply = await client.control(cid, "continue")
    assert reply.ok and reply.detail == "continuing"
    ends = await client.tap.wait_turn_ends(cid, 2)
    assert ends[1].finish_reason == "stop" and "cut_at" not in ends[1].loki
    # the request is the conversation as it was, its last message the cut reply: the
    # engine continues that message (llama-server's assistant prefill)
    sent = fake_engine.requests[-1].json["messages"]
    assert sent[-1] == {"role": "assistant", "content": PART_1}
    assert sent[-2] == {"role": "user", "content": "Count to seven."}
    # one assistant message holds both parts; the display log says it was continued
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant"]
    assert state.messages[-1].content == PART_1 + PART_2
    marks = [(e.loki or {}).get("event") for e in client.tap.events[cid]]
    assert marks.index("continue") > marks.index("turn_end")
    assert client.tap.text(cid).endswith(PART_1 + PART_2)
    # the next turn sends the whole reply as one message
    fake_engine.push(text_reply("ok"))
    await client.turn("Thanks.", cid)
    sent = fake_engine.requests[-1].json["messages"]
    assert sent[-2] == {"role": "assistant", "content": PART_1 + PART_2}


async def test_continue_needs_an_assistant_reply_and_an_idle_conversation(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(tools=False)
    fake_engine.push(text_reply("Sure.", delay_s=0.3, pieces=4))
    reply = await client.send("Hello.")
    cid = reply.conversation
    await fake_engine.await_requests(1)
    busy = await client.control(cid, "continue")
    assert not busy.ok and busy.detail == "a turn is running"
    await client.tap.wait_turn_ends(cid, 1)
    await idle(client, cid)
    await client.control(cid, "reset")
    nothing = await client.control(cid, "continue")
    assert not nothing.ok and nothing.detail == "no assistant reply to continue"
    assert len(fake_engine.requests) == 1
