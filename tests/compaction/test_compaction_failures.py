"""Summaries that keep failing (issue 26): never the same summary request twice, and the
context brought under the threshold anyway (archive, then drop the oldest exchanges).

The scripted case runs the chat service's turn loop on a fake engine with a 2,048-token
window that refuses any prompt over it (llama.cpp's ``exceed_context_size_error``), answers
every summary with a degenerate text, and counts prompts as the meter estimates them (so the
test is about the policy, not about the estimate)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loki_chat.compaction.decide import decide
from loki_chat.compaction.failures import MAX_REMEMBERED, FailedSummaries, torso_fingerprint
from loki_chat.compaction.health import FAILING_NOTE
from loki_chat.conversation import Conversation
from loki_chat.meter import estimate_tokens
from loki_shared.messages.chat import ChatMessage, ToolCall, ToolCallFunction
from tests.builders import A, T, U
from tests.fakes.fake_engine import HTTPError, default_usage, text_reply
from tests.fakes.fake_supervisor import FakeSupervisor

from .conftest import SummaryEngine, summary_requests
from .test_compaction_policy import block, long_conv, recall_text_via

N_CTX = 2048
THRESHOLD = 0.75
#: What the summariser answers: the same short line repeated (judged degenerate).
DEGENERATE = "\n".join(["The user and the assistant talk."] * 12)


def wire_tokens(messages: list[dict[str, Any]]) -> int:
    """The prompt size as the meter estimates it (characters of each message's JSON / 4 + 4)."""
    return sum(estimate_tokens(m) for m in messages)


class WindowEngine(SummaryEngine):
    """Answers by the request, not by a script: over the window, llama.cpp's overflow error;
    a summary request (``stream: false``), the degenerate summary; a turn, a short reply."""

    async def _play(self, response, record, writer):  # type: ignore[override]
        request = record.json
        n = wire_tokens(request["messages"])
        if n > self.n_ctx:
            response = HTTPError(
                400,
                {
                    "error": {
                        "code": 400,
                        "type": "exceed_context_size_error",
                        "message": "the request exceeds the available context size",
                        "n_prompt_tokens": n,
                        "n_ctx": self.n_ctx,
                    }
                },
            )
        elif request.get("stream") is False:
            response = text_reply(DEGENERATE, usage=default_usage(n, 60))
        else:
            turn = sum(1 for m in request["messages"] if m["role"] == "user")
            answer = f"Answer {turn}: noted, the part about {turn * 37 % 101} is clear."
            response = text_reply(answer, usage=default_usage(n, len(answer) // 4))
        return await super()._play(response, record, writer)


def message(i: int) -> str:
    """A 700-character user message, varied (nothing degenerate, no big block to strip)."""
    words = ["lexer", "parser", "token", "node", "graph", "cache", "slot", "window", "prompt"]
    out = f"Turn {i}:"
    k = 0
    while len(out) < 700:
        out += f" {words[(i * 7 + k * 3) % len(words)]}{(i * 31 + k * 17) % 997}"
        k += 1
    return out[:700]


@pytest.fixture
def window_engine() -> Any:
    with WindowEngine(n_ctx=N_CTX) as engine:
        yield engine


@pytest.fixture
async def small_supervisor(nc: Any, window_engine: WindowEngine) -> AsyncIterator[Any]:
    sup = await FakeSupervisor(nc, window_engine.url, n_ctx=N_CTX).start()
    yield sup
    await sup.stop()


def markers(client: Any, cid: str) -> list[dict[str, Any]]:
    return [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "compaction"]


async def test_failing_summaries_never_repeat_and_the_context_comes_down(
    chat_runner, small_supervisor, client, window_engine, recall, caplog
):
    caplog.set_level(logging.INFO, logger="loki.chat.compaction")
    await chat_runner.start(tools=False, compact_threshold=THRESHOLD)
    cid = None
    for i in range(14):
        cid, end = await client.turn(message(i), cid)
        assert end.finish_reason == "stop" and "error" not in end.loki, end.loki
        # after every turn (the one that crossed the threshold included) the context is
        # under the threshold
        assert end.loki["ctx_used"] <= THRESHOLD * N_CTX, (i, end.loki)
    summaries = summary_requests(window_engine)
    bodies = [json.dumps(r["messages"], sort_keys=True) for r in summaries]
    # summaries were asked for, and none of them twice — but for the one retry of a looping
    # answer, in the same lease, right after it, warmer and penalising repeats
    firsts = [b for b, r in zip(bodies, summaries) if "repeat_penalty" not in r]
    assert summaries and len(set(firsts)) == len(firsts)
    for i, r in enumerate(summaries):
        if "repeat_penalty" in r:
            assert i and bodies[i - 1] == bodies[i] and "repeat_penalty" not in summaries[i - 1]
    # every summary failed: the oldest exchanges were archived, then dropped, at turn end or
    # start — never through a refusal of the engine
    marks = markers(client, cid)
    assert marks and all(m["path"] == "shrink" for m in marks)
    assert all(m["trigger"] in ("start", "end") for m in marks)
    assert all(m["failure"] == "degenerate" for m in marks)
    turn_requests = [r for r in window_engine.requests if r.json.get("stream") is True]
    assert all(wire_tokens(r.json["messages"]) <= N_CTX for r in turn_requests)
    # what was dropped is in recall, verbatim: the first message comes back whole
    archived = [block for m in marks for block in m["archived"]]
    texts = [await recall_text_via(chat_runner_broker(chat_runner), b) for b in archived]
    assert any(t.endswith(message(0)) for t in texts)
    # the second failure in a row on the model: logged once, said in the marker from then on
    assert len(marks) >= 2 and "note" not in marks[0]
    assert all(m["note"] == FAILING_NOTE for m in marks[1:])
    failing = [r for r in caplog.records if "summaries fail on fake-model" in r.getMessage()]
    assert len(failing) == 1


def chat_runner_broker(runner: Any) -> Any:
    """An object with the running chat service's broker (what ``recall_text_via`` needs)."""

    class Via:
        broker = runner.running[0][1]

    return Via()


# --------------------------------------------------------------------------- unit
def test_fingerprint_memory():
    torso = [U("Here is the plan."), A("Noted."), U("And the tests?"), A("They pass.")]
    fp = torso_fingerprint(torso, 256)
    # the same torso and budget: the same fingerprint (copies included)
    assert fp == torso_fingerprint([m.model_copy() for m in torso], 256)
    assert len(fp) == 32 and int(fp, 16) >= 0
    # any change to what would be summarised, or to the budget, is another request
    assert fp != torso_fingerprint(torso, 512)
    assert fp != torso_fingerprint(torso[:-1], 256)
    assert fp != torso_fingerprint([*torso[:-1], A("They fail.")], 256)
    assert fp != torso_fingerprint([U("Here is the plan.", "summary"), *torso[1:]], 256)
    # reasoning is never sent to the summariser: it does not change the fingerprint
    thought = torso[1].model_copy(update={"reasoning_content": "hmm"})
    assert fp == torso_fingerprint([torso[0], thought, *torso[2:]], 256)
    memory = FailedSummaries()
    assert not memory.failed(fp)
    memory.remember(fp, 1700)
    assert memory.failed(fp) and len(memory) == 1
    # bounded: the oldest is forgotten first, a remembered one seen again moves to the end
    others = [torso_fingerprint(torso, b) for b in range(1000, 1000 + MAX_REMEMBERED)]
    memory.remember(others[0], 1800)
    memory.remember(fp, 1900)
    for other in others[1:]:
        memory.remember(other, 2000)
    assert len(memory) == MAX_REMEMBERED and memory.failed(fp) and not memory.failed(others[0])


def test_failed_summary_hold_off():
    """The hold-off after a failed summary is the refusal's: no new try before +10% of
    context, except at 90% of the window; forgotten when the context drops."""

    def at(used: int, failed_at: int | None = 1600) -> Any:
        return decide("end", used, N_CTX, threshold=THRESHOLD, since_step=0, refused_at=failed_at)

    assert at(1650).why is None  # +3%
    assert at(1759).why is None  # just under +10%
    assert at(1761).why == "threshold"  # +10%
    assert at(1700, failed_at=1560).why is None
    assert at(0.9 * N_CTX + 1, failed_at=1800).why == "threshold"  # 90% of the window
    dropped = at(1200)
    assert dropped.why is None and dropped.forget_refusal
    assert at(1650, failed_at=None).why == "threshold"


# --------------------------------------------------------------------------- policy
def calls(call_id: str) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        tool_calls=[ToolCall(id=call_id, function=ToolCallFunction(name="read", arguments="{}"))],
    )


async def test_a_failed_summary_is_never_asked_again(harness, fake_engine, supervisor, recall):
    """One request, a tool loop of mid-sized results: nothing to strip, no exchange to drop.
    The failed summary holds off the next tries, and is not sent again after +10%."""
    h = harness()
    conv = Conversation(id="f1", messages=[U("Read the nine parts.")])
    for i in range(9):
        conv.messages += [calls(f"c{i}"), T(f"c{i}", message(i))]
    conv.messages.append(A("All read."))
    fake_engine.default = text_reply(DEGENERATE)
    # each summary is one request and its one retry (it loops again)
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
    assert len(summary_requests(fake_engine)) == 2
    assert not await h.policy.maybe_compact(h.view(conv, "start", ctx_used=3300))  # +3%
    for used in (3600, 3800, 4000):  # +10%, 90% of the window: the same torso, never again
        assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=used))
    assert not await h.policy.maybe_compact(h.view(conv, "manual", ctx_used=3300))
    assert len(summary_requests(fake_engine)) == 2
    # another torso is another request
    conv.messages[0] = U("Read the nine parts again.")
    assert not await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3700))
    assert len(summary_requests(fake_engine)) == 4


async def test_fallback_above_the_threshold_archives_then_drops(
    harness, fake_engine, supervisor, recall
):
    """The fallback strips the big blocks but leaves the context above the threshold: the
    oldest exchanges are archived (every part, verbatim) and dropped, in one compaction."""
    h = harness()
    conv = long_conv("f2", blocks=2)
    for i in range(18):
        conv.messages += [U(message(i)), A(f"Answer {i}.")]
    used = conv.meter.used(h.settings.system_prompt, conv.messages)
    assert used > 0.75 * 4096
    fake_engine.push(text_reply(DEGENERATE), text_reply(DEGENERATE))  # and its retry
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=used))
    [mark] = h.markers
    assert mark["path"] == "shrink" and mark["failure"] == "degenerate"
    after = conv.meter.used(h.settings.system_prompt, conv.messages)
    assert after == mark["tokens_after"] <= 0.6 * 4096
    assert conv.messages[0].role == "user" and conv.messages[-1] == A("Answer 17.")
    # the big blocks (archived before the summary) and every dropped message, verbatim
    texts = [await recall_text_via(h, b) for b in mark["archived"]]
    assert any(t.endswith("Here is file 0:\n" + block(0)) for t in texts)
    assert any(t.endswith("\nNoted file 0.") for t in texts)
    assert any(t.endswith(message(0)) for t in texts)
    assert len(summary_requests(fake_engine)) == 2


async def test_a_summary_that_leaves_the_window_full_goes_on_to_drop(
    harness, fake_engine, supervisor, recall
):
    """A long paste in the verbatim tail: the summary passes but leaves 90% of the window
    or more (the request would not fit): archive-then-drop follows in the same call, so the
    first request after the compaction fits (issue 23's ten pastes)."""
    h = harness()
    conv = Conversation(id="f3")
    for i in range(4):
        conv.messages += [U(message(i)), A(f"Answer {i}.")]
    paste = "\n".join(f"line {k}: value_{k * 7919 % 10007} = fn_{k}(x)" for k in range(250))
    conv.messages += [A("Send the file."), U(paste), A("Read.")]
    used = conv.meter.used(h.settings.system_prompt, conv.messages)
    fake_engine.push(text_reply("The user sent four parts; the assistant answered each."))
    assert await h.policy.maybe_compact(h.view(conv, "start", n_ctx=2300, ctx_used=used))
    assert [m["path"] for m in h.markers] == ["summary", "shrink"]
    after = conv.meter.used(h.settings.system_prompt, conv.messages)
    assert h.markers[0]["tokens_after"] >= 0.9 * 2300 and after < h.markers[0]["tokens_after"]
    # the summary and the exchange before the paste were archived, then dropped
    assert conv.messages == [U(paste), A("Read.")]


async def test_no_lease_drops_nothing(harness, fake_engine, supervisor, recall):
    """The engine could not be reached for the summary (no lease): nothing is dropped for
    that, and the summary is not remembered as failed (it never left)."""
    h = harness(lease_timeout_s=0.5)
    conv = Conversation(id="f4")
    for i in range(12):
        conv.messages += [U(message(i)), A(f"Answer {i}.")]
    before = list(conv.messages)
    supervisor.refuse = True
    assert not await h.policy.maybe_compact(h.view(conv, "end", n_ctx=4096, ctx_used=3500))
    assert conv.messages == before and not h.markers and not fake_engine.requests
    assert len(h.policy.state("f4").failed) == 0
