"""The compaction policy against the scripted fake engine, a fake supervisor, the real NATS
(JetStream) and the real recall service."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from loki_chat.compaction import summariser as S
from loki_chat.compaction.decide import REQUEST_HEADER, SUMMARY_HEADER, SUMMARY_HEADER_NO_TOOLS
from loki_chat.compaction.rules import tail_start
from loki_chat.compaction.summary_client import RETRY_SAMPLING
from loki_chat.context import OverflowInfo
from loki_chat.conversation import Conversation
from loki_chat.request import build_payload, encode, wire_messages
from loki_shared import subjects
from loki_shared.messages.engine import Lease, TemplateProbe
from loki_shared.messages.events import CompactionEvent
from loki_shared.messages.perf import PerfRecord
from loki_shared.perf_publish import ensure_perf_stream
from tests.builders import A, T, U
from tests.fakes.fake_engine import HTTPError, text_reply, tool_reply

from .conftest import recall_text, summary_requests

SUMMARY = (
    "Goals: the user shares three design files. Decisions: keep the lexer apart "
    "(recall:r1). Open: error reporting. State: files read, design summarised next."
)


def block(i: int, size: int = 3000) -> str:
    lines = [f"File design_{i}.md — section {i}"]
    k = 0
    while sum(len(x) + 1 for x in lines) < size:
        lines.append(
            f"{i}.{k}: the component {i * 31 + k} reads token {k * 7 % 13} and "
            f"emits node {k * 11 % 17} ({'é' if k % 3 else 'ß'})"
        )
        k += 1
    return "\n".join(lines)[:size]


def long_conv(cid: str = "c1", blocks: int = 3) -> Conversation:
    conv = Conversation(id=cid)
    for i in range(blocks):
        conv.messages += [U(f"Here is file {i}:\n" + block(i)), A(f"Noted file {i}.")]
    conv.messages += [U("Now tell me the design in one line."), A("A lexer and a parser.")]
    return conv


async def collect(nc: Any, subject: str) -> list[Any]:
    got: list[Any] = []

    async def on(msg: Any) -> None:
        got.append(msg)

    await nc.subscribe(subject, cb=on)
    await nc.flush()
    return got


async def until(pred, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met")


async def test_threshold_archives_then_summarises(harness, fake_engine, supervisor, recall, nc):
    events = await collect(nc, subjects.EVENTS_COMPACTION)
    perf = await collect(nc, subjects.PERF_RECORD)
    await ensure_perf_stream(nc.jetstream())
    h = harness()
    conv = long_conv()
    original = list(conv.messages)
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    # the summary request: same endpoint, 0.2, no streaming, budget on the window, no tools
    assert req["stream"] is False and req["temperature"] == 0.2 and req["max_tokens"] == 256
    assert "tools" not in req and "top_p" not in req and req["model"] == "fake-model"
    transcript = req["messages"][1]["content"]
    # each big part of the torso: its first 400 characters plus its id, never the whole
    # block (file 2 is in the tail: it stays verbatim)
    assert tail_start(original) == 3
    for i, block_id in enumerate(["r1", "r2"]):
        text = f"Here is file {i}:\n" + block(i)
        assert text[:400] + f" […] (archived verbatim as recall:{block_id})" in transcript
        assert text[400:800] not in transcript
        # ... and the block comes back verbatim through recall
        got = await recall_text(nc, block_id)
        assert got == f"[{block_id} · user: Here is file {i}: · verbatim]\n{text}"
    # after: summary message (user, marked), then the tail starting on an assistant message
    first = conv.messages[0]
    assert first.role == "user" and first.loki.injected == "summary"
    assert first.content == SUMMARY_HEADER + SUMMARY
    assert conv.messages[1:] == original[3:]
    assert conv.meter.measured is None  # invalidated: estimates until the next completion
    roles = [m.role for m in conv.messages]
    assert all(not (a == b == "user") for a, b in zip(roles, roles[1:]))
    # marker, audit event (JetStream) and a compact perf record
    [marker] = h.markers
    assert marker["event"] == "compaction" and marker["path"] == "summary"
    assert marker["archived"] == ["r1", "r2"] and marker["tokens_before"] == 3200
    await until(lambda: events and perf)
    event = CompactionEvent.model_validate_json(events[0].data)
    assert (event.trigger, event.path, event.archived) == ("end", "summary", ["r1", "r2"])
    assert event.tokens_after < event.tokens_before and event.duration_s >= 0
    js = nc.jetstream()
    stored = await js.get_last_msg(subjects.STREAM_EVENTS, subjects.EVENTS_COMPACTION)
    assert CompactionEvent.model_validate_json(stored.data) == event
    record = PerfRecord.model_validate_json(perf[0].data)
    assert (
        record.kind == "compact"
        and record.conversation == "c1"
        and record.roles == ["system", "user"]
    )


async def test_below_threshold_nothing_happens(harness, fake_engine, supervisor):
    h = harness(prewarm=False)  # PREWARM's turn-end look-ahead has its own test
    conv = long_conv()
    before = list(conv.messages)
    for trigger in ("start", "mid", "end"):
        assert not await h.policy.maybe_compact(h.view(conv, trigger, ctx_used=3000))
    assert conv.messages == before and not fake_engine.requests


async def test_generation_guard_never_below_half_window(harness, fake_engine, supervisor, recall):
    h = harness()
    conv = long_conv()
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    h.policy.note_step(conv.id, lease, b"{}", {"completion_tokens": 1800}, len(conv.messages))
    # 45% used: 1.2 x 1800 does not fit, but never below half the window
    assert not await h.policy.maybe_compact(h.view(conv, "start", ctx_used=1850))
    fake_engine.push(text_reply(SUMMARY))
    # 54%: 1.2 x 1800 = 2160 > 4096 - 2200
    assert await h.policy.maybe_compact(h.view(conv, "start", ctx_used=2200))
    assert h.markers[0]["path"] == "summary"


async def test_turn_end_lookahead_only_with_prewarm_on_a_local_engine(
    harness, fake_engine, supervisor, recall
):
    # long_conv's requests are ~750-token files: the look-ahead expects 409 (a tenth of 4096);
    # 2700 + 409 passes the 3072 threshold at turn end, never at turn start
    local = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    external = local.model_copy(update={"external": True})
    off = harness(prewarm=False)
    conv = long_conv()
    before = list(conv.messages)
    off.policy.note_step(conv.id, local, b"{}", {"completion_tokens": 10}, len(conv.messages))
    assert not await off.policy.maybe_compact(off.view(conv, "end", ctx_used=2700))
    on = harness(prewarm=True)
    on.policy.note_step(conv.id, external, b"{}", {"completion_tokens": 10}, len(conv.messages))
    assert not await on.policy.maybe_compact(on.view(conv, "end", ctx_used=2700))
    on.policy.note_step(conv.id, local, b"{}", {"completion_tokens": 10}, len(conv.messages))
    assert not await on.policy.maybe_compact(on.view(conv, "start", ctx_used=2700))
    assert not await on.policy.maybe_compact(on.view(conv, "end", ctx_used=2600))
    assert conv.messages == before and not fake_engine.requests
    fake_engine.push(text_reply(SUMMARY))
    assert await on.policy.maybe_compact(on.view(conv, "end", ctx_used=2700))
    assert conv.messages[0].loki.injected == "summary"
    [marker] = on.markers
    assert (marker["trigger"], marker["path"]) == ("end", "summary")


async def test_refusal_without_reduction_and_hold_off(harness, fake_engine, supervisor, nc):
    events = await collect(nc, subjects.EVENTS_COMPACTION)
    h = harness()
    conv = Conversation(id="c2", messages=[U("hi"), A("hello"), U("x" * 12000), A("ok")])
    # the tail (the huge message) cannot be summarised: an empty summary would save < 20%
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3300))
    await until(lambda: len(events) == 1)
    assert CompactionEvent.model_validate_json(events[0].data).path == "refused"
    # no new try before the context grows 10% more ...
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3500))
    await asyncio.sleep(0.2)
    assert len(events) == 1
    # +10%: tried again (and refused again)
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3640))
    await until(lambda: len(events) == 2)
    # the context drops: the refusal is forgotten
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3100))
    await until(lambda: len(events) == 3)
    assert not summary_requests(fake_engine) and not h.markers
    # at 90% of the window the hold-off never applies, and a refused summary goes on to
    # archive-then-drop: the request would not fit (issue 23's ten pastes)
    big = conv.messages[2]
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3700))
    await until(lambda: len(events) == 5)
    assert [CompactionEvent.model_validate_json(e.data).path for e in events[3:]] == [
        "refused",
        "shrink",
    ]
    assert conv.messages == [big, A("ok")] and h.markers[-1]["path"] == "shrink"
    assert not summary_requests(fake_engine)


@pytest.mark.parametrize(
    "reply",
    [
        text_reply("", reasoning="Let me think about the summary"),
        text_reply("<think>I will summarise, first I need"),
        text_reply("word " * 400),
        tool_reply([("c9", "recall", '{"id": "r1"}')]),
        HTTPError(500, {"error": {"code": 500, "message": "boom", "type": "server_error"}}),
    ],
)
async def test_failed_summary_falls_back_to_stripped_torso(
    harness, fake_engine, supervisor, recall, reply
):
    h = harness()
    conv = long_conv()
    tail = list(conv.messages[-1:])
    fake_engine.push(reply, reply)  # a looping or empty answer is asked once more
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    assert h.markers[0]["path"] == "fallback"
    # no summary, no raw reasoning installed; the torso stays, big blocks stripped, ids kept
    assert not any(m.loki and m.loki.injected == "summary" for m in conv.messages)
    assert all("think" not in (m.content or "") for m in conv.messages)
    assert (
        conv.messages[0].content
        == ("Here is file 0:\n" + block(0))[:400] + " […] (archived verbatim as recall:r1)"
    )
    assert conv.messages[-1:] == tail
    # the last request is not re-injected after a failed summary
    assert sum(1 for m in conv.messages if "Now tell me the design" in (m.content or "")) == 1


async def test_length_keeps_text_marked(harness, fake_engine, supervisor, recall):
    h = harness()
    conv = long_conv()
    fake_engine.push(text_reply(SUMMARY, finish_reason="length"))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY + " […]"


async def test_request_reinjected_only_when_tail_has_no_user_request(
    harness, fake_engine, supervisor, recall
):
    h = harness()
    # mid-turn: the tail is the tool loop, without the user's request
    conv = Conversation(
        id="c3",
        messages=[
            U("Read the three files and compare them."),
            A(None, [("c1", "read", '{"p": "a"}')]),
            T("c1", block(0)),
            A(None, [("c2", "read", '{"p": "b"}')]),
            T("c2", block(1)),
            A(None, [("c3", "read", '{"p": "c"}')]),
            T("c3", block(2, 900)),
        ],
    )
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "mid", ctx_used=3200))
    first = conv.messages[0]
    assert first.content == (
        SUMMARY_HEADER + SUMMARY + REQUEST_HEADER + "Read the three files and compare them."
    )
    assert conv.messages[1].role == "assistant" and conv.messages[1].tool_calls
    assert conv.messages[2].role == "tool"  # a call never separated from its result
    # the tail holds a user request: nothing re-injected
    conv2 = long_conv("c4")
    fake_engine.push(text_reply(SUMMARY))
    conv2.messages += [U("And the tests?"), A("They pass.")]
    assert await h.policy.maybe_compact(h.view(conv2, "end", ctx_used=3300))
    assert REQUEST_HEADER not in conv2.messages[0].content


async def test_recall_unreachable_summarises_without_archiving(harness, fake_engine, supervisor):
    h = harness()
    conv = long_conv()
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    transcript = summary_requests(fake_engine)[0]["messages"][1]["content"]
    assert "recall:" not in transcript and ("Here is file 0:\n" + block(0))[:400] in transcript
    assert h.markers[0]["archived"] == [] and conv.messages[0].loki.injected == "summary"


async def test_at_most_two_compactions_per_step(harness, fake_engine, supervisor, recall):
    h = harness()
    conv = long_conv("c5", blocks=6)
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    h.policy.note_step(conv.id, lease, b"{}", {"completion_tokens": 5}, len(conv.messages))
    done = 0
    for _ in range(4):
        fake_engine.push(text_reply(SUMMARY + f" v{done}"))
        conv.messages += [U("more " + block(9, 2500)), A("ok")]
        done += await h.policy.maybe_compact(h.view(conv, "mid", ctx_used=3500))
    assert done == 2
    h.policy.note_step(conv.id, lease, b"{}", {"completion_tokens": 5}, len(conv.messages))
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "mid", ctx_used=3500))


async def test_reactive_then_shrink(harness, fake_engine, supervisor, recall):
    h = harness()
    conv = Conversation(
        id="c6",
        messages=[
            U("Read it"),
            A(None, [("c1", "read", "{}")]),
            T("c1", block(0, 6000)),
            A("Read. Next?"),
            U("Read the other"),
            A(None, [("c2", "read", "{}")]),
            T("c2", block(1, 6000)),
            A("Done."),
            U("Compare"),
            A("They differ."),
        ],
    )
    overflow = OverflowInfo(
        status=400, body="exceeds the available context size", n_prompt_tokens=4500, n_ctx=4096
    )
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "reactive", ctx_used=3700, overflow=overflow))
    assert h.markers[0]["trigger"] == "reactive"
    # the engine still refuses: last resort, shrink toward 60% of the window
    before = [m.model_copy() for m in conv.messages]
    used = conv.meter.used(h.settings.system_prompt, conv.messages)
    conv.messages += [U("y" * 5000), A(None, [("c3", "read", "{}")]), T("c3", block(3, 9000))]
    assert await h.policy.maybe_compact(
        h.view(conv, "reactive", ctx_used=used + 4600, overflow=overflow)
    )
    assert h.markers[-1]["path"] == "shrink"
    after = conv.meter.used(h.settings.system_prompt, conv.messages)
    assert after <= 0.6 * 4096
    assert conv.messages[0].role == "user" and before  # still starts on a user message
    # what was cut is archived: nothing lost
    for block_id in h.markers[-1]["archived"]:
        assert "verbatim" in await recall_text_via(h, block_id)


async def recall_text_via(h: Any, block_id: str) -> str:
    from loki_shared.messages.recall import ToolReply, ToolRequest

    msg = await h.broker.request(
        ToolRequest(name="recall", arguments={"id": block_id}), subjects.RECALL_TOOL, timeout=5
    )
    return ToolReply.model_validate_json(msg.body).text


# --------------------------------------------------------------------------- continuation
def sent_request(h: Any, conv: Conversation, lease: Lease) -> bytes:
    from loki_chat.tools import ToolBox, ToolSpec

    async def run(args: dict[str, Any]) -> str:
        return "x"

    box = ToolBox([ToolSpec(name="read", description="Reads.", run=run)])
    wire = wire_messages(h.settings.system_prompt, conv.messages)
    return encode(build_payload(h.settings, lease, wire, box.schemas()))


def stamped(h: Any, fake_engine: Any, cid: str) -> Conversation:
    """A long conversation whose last request the slot holds (as sent, no usage reported)."""
    conv = long_conv(cid)
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    h.policy.note_step(conv.id, lease, sent_request(h, conv, lease), None, len(conv.messages))
    return conv


async def test_continuation_is_the_sent_request_plus_one_demand(
    harness, fake_engine, supervisor, recall
):
    h = harness(compact_continuation=True, temperature=0.8, top_k=20)
    supervisor.id_slot = 0
    conv = long_conv("c7")
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url, id_slot=0)
    # the last step: its request as sent, then the reply accepted
    conv.messages.pop()
    body = sent_request(h, conv, lease)
    h.policy.note_step(conv.id, lease, body, {"completion_tokens": 9}, len(conv.messages))
    conv.messages.append(A("A lexer and a parser."))
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    sent = json.loads(body)
    n = len(sent["messages"])
    assert req["messages"][:n] == sent["messages"]  # exactly as sent
    assert req["messages"][n] == {"role": "assistant", "content": "A lexer and a parser."}
    demand = req["messages"][n + 1]
    assert demand["role"] == "user" and len(req["messages"]) == n + 2
    assert (
        "up to, but not including, message #4 (a assistant message that starts with "
        '"Noted file 1."); the last 5 messages stay verbatim' in demand["content"]
    )
    assert "recall:r<N> id next to what it holds (archived: r1, r2)" in demand["content"]
    assert "state of progress at that message last" in demand["content"]
    assert req["tools"] == sent["tools"] and req["tool_choice"] == "none"
    assert req["temperature"] == 0.2 and "top_k" not in req and req["stream"] is False
    assert req["id_slot"] == 0 and req["max_tokens"] == 256
    assert h.markers[0]["path"] == "continuation"
    assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY


async def test_continuation_leaves_out_trailing_user_messages(
    harness, fake_engine, supervisor, recall
):
    """A turn-start compaction: the new user message is not in the slot's cache, so the
    continuation request stops at the accepted reply; the fit counts the slot's prompt as the
    engine did (usage), not the whole view with the new message."""
    h = harness(compact_continuation=True)
    supervisor.id_slot = 0
    conv = long_conv("c15")
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url, id_slot=0)
    conv.messages.pop()
    body = sent_request(h, conv, lease)
    h.policy.note_step(
        conv.id, lease, body, {"prompt_tokens": 2600, "completion_tokens": 9}, len(conv.messages)
    )
    conv.messages.append(A("A lexer and a parser."))
    pasted = "Next file, please review:\n" + "z" * 2400
    conv.messages.append(U(pasted))
    fake_engine.push(text_reply(SUMMARY))
    # 3,500 of 4,096 with the new message: whole view + demand + budget would not fit
    assert await h.policy.maybe_compact(h.view(conv, "start", ctx_used=3500))
    [req] = summary_requests(fake_engine)
    sent = json.loads(body)
    n = len(sent["messages"])
    assert req["messages"][:n] == sent["messages"]
    assert req["messages"][n] == {"role": "assistant", "content": "A lexer and a parser."}
    assert len(req["messages"]) == n + 2 and req["messages"][n + 1]["role"] == "user"
    assert pasted not in json.dumps(req)
    assert h.markers[-1]["path"] == "continuation"
    # the new message stays, verbatim, at the end of the compacted conversation
    assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY
    assert conv.messages[-1].content == pasted


async def test_continuation_fit_uses_the_engine_count(harness, fake_engine, supervisor, recall):
    """The slot holds more than the estimate says (usage.prompt_tokens near the window): the
    continuation would not fit, so the transcript path is taken without a failed try."""
    h = harness(compact_continuation=True)
    conv = long_conv("c16")
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    h.policy.note_step(
        conv.id,
        lease,
        sent_request(h, conv, lease),
        {"prompt_tokens": 3700, "completion_tokens": 9},
        len(conv.messages),
    )
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    assert "tools" not in req and h.markers[-1]["path"] == "summary"
    assert not h.policy.suspended


async def test_continuation_fit_without_usage_counts_the_demand(
    harness, fake_engine, supervisor, recall
):
    """No usage from the engine: the view's count stands for the slot's prompt, and the
    demand and the summary budget still have to fit beside it."""
    h = harness(compact_continuation=True)
    conv = stamped(h, fake_engine, "c17")
    fake_engine.push(text_reply(SUMMARY))
    # 3,780 + 256 (budget) fits 4,096, but not with the demand on top
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3780))
    [req] = summary_requests(fake_engine)
    assert "tools" not in req and h.markers[-1]["path"] == "summary"


@pytest.mark.parametrize("second_passes", [True, False])
async def test_a_looping_continuation_summary_is_asked_once_more_warmer(
    harness, fake_engine, supervisor, recall, second_passes
):
    h = harness(compact_continuation=True)
    conv = stamped(h, fake_engine, "c7r")
    looping = "The buffer fails. " * 40
    fake_engine.push(text_reply(looping), text_reply(SUMMARY if second_passes else looping))
    if not second_passes:
        fake_engine.push(text_reply(SUMMARY))  # the transcript path's
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    reqs = summary_requests(fake_engine)
    first, again = reqs[0], reqs[1]
    # the same request, warmer and penalising repeats: the slot holds its prompt, only the
    # answer is computed again
    assert first["temperature"] == 0.2 and "repeat_penalty" not in first
    assert again == {**first, "temperature": 0.6, "repeat_penalty": 1.15}
    if second_passes:
        assert len(reqs) == 2 and h.markers[-1]["path"] == "continuation"
        assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY
    else:  # then the transcript path, as after any failed continuation (one failure counted)
        assert len(reqs) == 3 and "tools" not in reqs[2] and reqs[2]["temperature"] == 0.2
        assert h.markers[-1]["path"] == "summary"
        assert h.policy.failures == {"fake-model": 1} and not h.policy.suspended


@pytest.mark.parametrize("external", [False, True])
async def test_a_looping_transcript_summary_is_asked_once_more_on_a_local_engine(
    harness, fake_engine, supervisor, recall, external
):
    """The transcript path's looping answer is asked once more in the same lease with the
    retry's sampling on the local llama-server; an external API is asked once (each request
    is billed there, and its models rarely loop): the fallback follows."""
    supervisor.external = external
    h = harness()
    conv = long_conv("c7t")
    looping = "The buffer fails. " * 40
    fake_engine.push(text_reply(looping), text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    reqs = summary_requests(fake_engine)
    if external:
        assert len(reqs) == 1 and h.markers[-1]["path"] == "fallback"
        return
    first, again = reqs
    assert again == {**first, **RETRY_SAMPLING} and h.markers[-1]["path"] == "summary"
    assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY


async def test_continuation_falls_back_and_suspends_on_tool_call(
    harness, fake_engine, supervisor, recall
):
    h = harness(compact_continuation=True)
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    for n, cid in enumerate(["c8", "c9"]):
        conv = long_conv(cid)
        h.policy.note_step(cid, lease, sent_request(h, conv, lease), None, len(conv.messages))
        if n == 0:
            fake_engine.push(text_reply('<tool_call>{"name": "read", "arguments": {}}</tool_call>'))
        fake_engine.push(text_reply(SUMMARY))
        assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
        assert h.markers[-1]["path"] == "summary"
    reqs = summary_requests(fake_engine)
    # first compaction: continuation (tools carried) then transcript; then suspended for the
    # model: the second compaction goes straight to the transcript path
    assert ["tools" in r for r in reqs] == [True, False, False]


async def test_continuation_void_after_another_request(
    harness, fake_engine, supervisor, recall, nc
):
    h = harness(compact_continuation=True)
    conv = stamped(h, fake_engine, "c10")
    js = nc.jetstream()
    await ensure_perf_stream(js)
    await h.policy.slots.start()
    assert h.policy._perf_sub is not None
    # a /v1 client's completion left for the engine: the slot no longer holds the prompt
    rec = PerfRecord(ts=0, kind="foreign", conversation=None)
    await js.publish(
        subjects.PERF_RECORD, rec.model_dump_json().encode(), stream=subjects.STREAM_PERF
    )
    await until(lambda: h.policy.states["c10"].stamp is None)
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    assert "tools" not in summary_requests(fake_engine)[0]


async def test_key_off_never_continues(harness, fake_engine, supervisor, recall):
    h = harness()  # COMPACT_CONTINUATION off
    conv = stamped(h, fake_engine, "c11")
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    assert [m["role"] for m in req["messages"]] == ["system", "user"] and "tools" not in req


async def test_continuation_view_mismatch_falls_back_without_suspending(
    harness, fake_engine, supervisor, recall
):
    h = harness(compact_continuation=True)
    lease = Lease(model="fake-model", n_ctx=4096, base_url=fake_engine.url)
    for n, cid in enumerate(["c12", "c13", "c14"]):
        conv = long_conv(cid)
        body = json.loads(sent_request(h, conv, lease))
        if n < 2:  # an ephemeral instruction was sent at the end: not the stored view
            body["messages"][-1]["content"] += "\n\n(Answer now.)"
        h.policy.note_step(cid, lease, json.dumps(body).encode(), None, len(conv.messages))
        fake_engine.push(text_reply(SUMMARY))
        assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
        assert h.markers[-1]["path"] == ("summary" if n < 2 else "continuation")
    # nothing went out for the mismatches: never suspended
    assert ["tools" in r for r in summary_requests(fake_engine)] == [False, False, True]


# --------------------------------------------------------------------------- issue 16
def no_tools_template() -> TemplateProbe:
    """The probe's verdicts for a template that drops ``tools`` and re-renders its prefix."""
    return TemplateProbe(template_hash="h", supports_tools=False, stable_prefix=False)


async def test_no_tool_template_archives_but_cites_no_recall_id(
    harness, fake_engine, supervisor, recall, nc
):
    perf = await collect(nc, subjects.PERF_RECORD)
    await ensure_perf_stream(nc.jetstream())
    supervisor.template = no_tools_template()
    h = harness()
    conv = long_conv()
    conv.messages += [U("x" * 900)]  # a big request in the tail-less torso is re-injected
    conv.messages += [A("Noted."), A("Still here.")]
    fake_engine.push(text_reply("Goals: the design files. State: read."))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3600))
    [req] = summary_requests(fake_engine)
    prompt, transcript = (m["content"] for m in req["messages"])
    assert prompt == S.SUMMARISER_PROMPT_NO_TOOLS and "recall" not in prompt
    # the blocks are archived (the marker names them, recall has them) ...
    assert h.markers[0]["archived"][:2] == ["r1", "r2"]
    text = "Here is file 0:\n" + block(0)
    assert await recall_text(nc, "r1") == f"[r1 · user: Here is file 0: · verbatim]\n{text}"
    # ... but nothing the model reads invites it to call recall
    assert text[:400] + " […] (archived verbatim)" in transcript
    assert "recall" not in transcript
    installed = conv.messages[0]
    assert installed.loki.injected == "summary" and installed.content.startswith(
        SUMMARY_HEADER_NO_TOOLS
    )
    assert "recall" not in installed.content
    # the template has no stable prefix either: the compact perf record says so (perf: cause
    # ``template`` for its losses)
    await until(lambda: perf)
    assert PerfRecord.model_validate_json(perf[0].data).prefix_unstable is True


async def test_no_tool_template_fallback_and_shrink_cite_no_recall_id(
    harness, fake_engine, supervisor, recall
):
    supervisor.template = no_tools_template()
    h = harness()
    conv = long_conv()
    fake_engine.push(HTTPError(500, {"error": {"code": 500, "message": "boom"}}))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    assert h.markers[0]["path"] in ("fallback", "shrink") and h.markers[0]["archived"]
    assert conv.messages[0].content == (
        ("Here is file 0:\n" + block(0))[:400] + " […] (archived verbatim)"
    )
    assert not any("recall" in (m.content or "") for m in conv.messages)


@pytest.mark.parametrize("supports_tools", [True, None])
async def test_tool_template_or_unknown_keeps_the_recall_ids(
    harness, fake_engine, supervisor, recall, supports_tools
):
    supervisor.template = TemplateProbe(template_hash="h", supports_tools=supports_tools)
    h = harness()
    conv = long_conv()
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    assert req["messages"][0]["content"] == S.SUMMARISER_PROMPT
    assert "(archived verbatim as recall:r1)" in req["messages"][1]["content"]
    assert conv.messages[0].content == SUMMARY_HEADER + SUMMARY


async def test_no_tool_template_continuation_demand_asks_no_recall_id(
    harness, fake_engine, supervisor, recall
):
    supervisor.template = no_tools_template()
    h = harness(compact_continuation=True)
    supervisor.id_slot = 0
    conv = long_conv("c8")
    lease = Lease(
        model="fake-model",
        n_ctx=4096,
        base_url=fake_engine.url,
        id_slot=0,
        template=no_tools_template(),
    )
    conv.messages.pop()
    body = sent_request(h, conv, lease)
    h.policy.note_step(conv.id, lease, body, {"completion_tokens": 9}, len(conv.messages))
    conv.messages.append(A("A lexer and a parser."))
    fake_engine.push(text_reply("Goals: design. State: read."))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    [req] = summary_requests(fake_engine)
    demand = req["messages"][-1]["content"]
    assert "keep decisions, constraints, open questions, in code work" in demand
    assert "recall" not in demand
    assert h.markers[0]["path"] == "continuation"
    assert conv.messages[0].content.startswith(SUMMARY_HEADER_NO_TOOLS)
