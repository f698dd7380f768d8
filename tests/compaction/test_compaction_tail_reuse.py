"""COMPACT_TAIL_REUSE (``LOKI_COMPACT_TAIL_REUSE``) in the chat service's turn loop, on the
scripted fake engine and a fake supervisor: after a compaction the verbatim tail is sent right
after the system prompt with its bytes, the summary after it joined to the next user message;
the next compaction still tells the story in order (old summary first); off (or on an external
API, or a strict-alternation template): the request is byte-identical to the frozen copy."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from loki_chat.compaction.decide import SUMMARY_HEADER
from loki_chat.compaction.digest import INTRO
from loki_chat.compaction.layout import TAIL_FIRST_HEADER
from loki_chat.compaction.rules import budget_tokens
from loki_chat.compaction.summariser import EARLIER_SUMMARY_FIRST, TRANSCRIPT_HEADER
from loki_shared.messages.engine import TemplateProbe
from tests.fakes.fake_engine import default_usage, text_reply

from .conftest import recall_text, summary_requests

SUMMARY = "Goals: five points were listed. Decisions: none yet. State: points read."
SUMMARY_2 = "Goals: nine points. State: all read, nothing open."


def reply(text: str, prompt_tokens: int):
    return text_reply(text, usage=default_usage(prompt_tokens=prompt_tokens, completion_tokens=5))


def point(i: int) -> str:
    """A user message of about 750 characters (under the 800 of an archived block)."""
    return f"Point {i}: " + " ".join(f"w{i}{k}" for k in range(150))[:740]


async def five_points(client, fake_engine, then=(), first: str = "", summaries=()) -> str:
    """Five turns; the fifth ends past 75% of the 4096-token window (compaction at its end,
    the summary answered by :data:`SUMMARY`, or by ``summaries``); ``then``: answers queued
    after it; ``first``: the first message (else the first point)."""
    answers = summaries or (text_reply(SUMMARY),)
    fake_engine.push(
        reply("Noted 1.", 700),
        reply("Noted 2.", 1400),
        reply("Noted 3.", 2100),
        reply("Noted 4.", 2800),
        reply("Noted 5.", 3300),
        *answers,
        *then,
    )
    cid, _ = await client.turn(first or point(1))
    for i in range(2, 6):
        await client.turn(point(i), cid)
    assert len(summary_requests(fake_engine)) == len(answers)
    return cid


async def four_more(client, fake_engine, cid: str) -> None:
    """Four more points; the last turn ends past the threshold again: a second compaction
    (answered by :data:`SUMMARY_2`)."""
    fake_engine.push(
        reply("Noted 6.", 1000),
        reply("Noted 7.", 1700),
        reply("Noted 8.", 2400),
        reply("Noted 9.", 3150),
        text_reply(SUMMARY_2),
    )
    for i in range(6, 10):
        await client.turn(point(i), cid)


def no_two_users(messages: list[dict]) -> bool:
    roles = [m["role"] for m in messages]
    return all(not (a == b == "user") for a, b in zip(roles, roles[1:]))


#: The request of the turn after a compaction at turn end, key off, frozen as the chat service
#: sent it before the key existed (sha-256 of the body, computed on main before this key;
#: its shape is asserted below).
FROZEN_AFTER_COMPACTION_SHA256 = "b76292e8e2d594e94ff9cbd905b3c84c249bb8f9899163da36e67c64c8446cf5"


async def test_key_off_request_after_compaction_is_the_frozen_copy(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.")
    cid = await five_points(client, fake_engine)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    body = fake_engine.requests[-1].body
    sent = fake_engine.requests[-1].json["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert sent[1]["content"] == SUMMARY_HEADER + SUMMARY
    assert hashlib.sha256(body).hexdigest() == FROZEN_AFTER_COMPACTION_SHA256


async def test_tail_first_after_compaction_keeps_the_tail_bytes_and_alternation(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True)
    cid = await five_points(client, fake_engine)
    before = fake_engine.requests[-2].json["messages"]  # the fifth turn's request
    state = await client.state(cid)
    stored = state.messages
    # stored in chronological order: the summary first, marked to be sent after the tail
    assert stored[1].loki.injected == "summary" and stored[1].content == SUMMARY_HEADER + SUMMARY
    k = stored[1].loki.sent_after
    assert k == len(stored) - 2 and k >= 2  # the whole tail (it ends on an assistant)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    sent = fake_engine.requests[-1].json["messages"]
    # the tail keeps its place right after the system prompt: the fifth request's last k-1
    # messages...
    assert sent[0] == {"role": "system", "content": "S."}
    assert sent[1]["role"] == "assistant"
    assert sent[1:k] == before[len(before) - (k - 1) :]
    # ...and the reply that ended that turn
    assert sent[k]["role"] == "assistant" and sent[k]["content"] == "Noted 5."
    # the summary follows, joined to the next user message, re-headed
    assert sent[k + 1] == {
        "role": "user",
        "content": TAIL_FIRST_HEADER + SUMMARY + "\n\nThanks",
    }
    assert len(sent) == k + 2 and no_two_users(sent)
    # the turn after extends that request byte for byte (a stable prefix)
    fake_engine.push(reply("Bye.", 1000))
    await client.turn("Bye", cid)
    third = fake_engine.requests[-1].json["messages"]
    assert third[: len(sent)] == sent and no_two_users(third)


async def test_tail_first_tail_bytes_are_the_ones_sent_before(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True)
    cid = await five_points(client, fake_engine)
    fifth = fake_engine.requests[-2]
    k = (await client.state(cid)).messages[1].loki.sent_after
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    after = fake_engine.requests[-1]
    # the tail's messages (all but the reply to the fifth turn) were in the fifth request,
    # the same bytes: the serialised messages appear verbatim in both bodies
    tail = after.json["messages"][1:k]
    for message in tail:
        raw = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert raw.encode() in fifth.body and raw.encode() in after.body


async def test_next_compaction_tells_the_old_summary_first(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True)
    cid = await five_points(client, fake_engine)
    await four_more(client, fake_engine, cid)
    first, second = summary_requests(fake_engine)
    transcript = second["messages"][1]["content"]
    assert transcript.startswith(TRANSCRIPT_HEADER + "[earlier summary]: " + SUMMARY_HEADER)
    assert transcript.index(SUMMARY) < transcript.index("Noted 5.")
    stored = (await client.state(cid)).messages
    assert stored[1].content == SUMMARY_HEADER + SUMMARY_2 and stored[1].loki.sent_after
    assert not any(SUMMARY in str(m.content) for m in stored)  # the old one was summarised


async def test_continuation_demand_asks_for_the_old_summary_first(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True, compact_continuation=True)
    cid = await five_points(client, fake_engine)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    turn = fake_engine.requests[-1].json["messages"]
    await four_more(client, fake_engine, cid)
    sent = fake_engine.requests[-2].json["messages"]  # the turn that ended past the threshold
    demand_req = summary_requests(fake_engine)[-1]
    msgs = demand_req["messages"]
    # the continuation carries the request as it was sent (tail first), then the demand
    assert msgs[: len(sent)] == sent and len(turn) < len(sent)
    at = next(
        i for i, m in enumerate(sent) if m["role"] == "user" and TAIL_FIRST_HEADER in m["content"]
    )
    assert msgs[-1]["role"] == "user"
    assert msgs[-1]["content"].endswith(EARLIER_SUMMARY_FIRST.format(at=at))
    assert no_two_users(msgs)


@pytest.mark.parametrize(
    "external,template",
    [
        (True, None),  # an external API: its cache is not llama.cpp's
        (False, TemplateProbe(template_hash="h", strict_alternation=True)),
    ],
)
async def test_tail_first_not_applied_sends_the_summary_first(
    chat_runner, supervisor, client, fake_engine, external, template
):
    supervisor.external = external
    supervisor.template = template
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True)
    cid = await five_points(client, fake_engine)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    sent = fake_engine.requests[-1].json["messages"]
    assert sent[1]["content"] == SUMMARY_HEADER + SUMMARY and sent[-1]["content"] == "Thanks"


def long_point(i: int) -> str:
    """A user message of about 1,400 characters (a big block: archived verbatim)."""
    return f"Long point {i}: " + " ".join(f"v{i}{k}" for k in range(300))[:1380]


async def test_a_failed_summary_leaves_an_index_after_the_tail(
    chat_runner, supervisor, client, fake_engine, recall, nc
):
    """With the key on, a failed summary's fallback keeps the tail first: an index of the torso
    (each message's start, cut texts named by recall id, everything archived first) takes the
    summary's place, no longer than a summary's budget; the next request keeps the tail's bytes
    right after the system prompt. (PREWARM off: its look-ahead would compact a turn earlier.)"""
    await chat_runner.start(system_prompt="S.", compact_tail_reuse=True, prewarm=False)
    # the transcript summary comes back empty, and so does its retry: it failed
    empty = (text_reply(""), text_reply(""))
    cid = await five_points(client, fake_engine, first=long_point(1), summaries=empty)
    fifth = fake_engine.requests[-3].json["messages"]
    stored = (await client.state(cid)).messages
    index = stored[1]
    assert index.loki.injected == "summary" and index.loki.sent_after == len(stored) - 2
    text = index.content
    assert text.startswith(SUMMARY_HEADER + INTRO)
    assert len(text) // 4 <= budget_tokens(4096) + 40  # a summary's budget (and its header)
    # the long first message is cut and named by its id; recall gives it back verbatim
    ids = re.findall(r"recall:(r\d+)", text)
    assert ids
    blocks = [await recall_text(nc, block) for block in ids]
    assert any(long_point(1) in b for b in blocks) and any(point(2) in b for b in blocks)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    sent = fake_engine.requests[-1].json["messages"]
    k = index.loki.sent_after
    assert sent[1:k] == fifth[len(fifth) - (k - 1) :]  # the tail, right after the system
    assert sent[k + 1]["content"] == TAIL_FIRST_HEADER + text[len(SUMMARY_HEADER) :] + "\n\nThanks"
    assert no_two_users(sent)
