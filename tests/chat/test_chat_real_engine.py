"""Main paths against the real llama-server with the bundled SmolLM2-135M model.

Tool calls with a 135M model are unreliable, so these turns check plain replies, prompt-cache
reuse across turns (the prefix is byte-stable), and that a stop frees the engine's slot.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.fakes.fake_supervisor import FakeSupervisor

pytestmark = pytest.mark.engine


@pytest.fixture
async def real_supervisor(nc, engine_url):
    sup = await FakeSupervisor(nc, engine_url, n_ctx=4096, model="").start()
    yield sup
    await sup.stop()


async def test_real_engine_two_turns_reuse_the_prompt_cache(chat_runner, real_supervisor, client):
    await chat_runner.start(tools=False, max_tokens=8, temperature=0.0)
    cid, end1 = await client.turn("Reply with one word: pong", timeout=120)
    assert end1.finish_reason in ("stop", "length"), end1.loki
    assert client.tap.text(cid).strip()
    assert end1.usage["prompt_tokens"] > 0 and end1.timings["prompt_n"] > 0
    _, end2 = await client.turn("And again, one word.", cid, timeout=120)
    assert end2.finish_reason in ("stop", "length"), end2.loki
    assert end2.timings["cache_n"] > 0  # the previous turn's prefix was reused
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert state.ctx_used >= end2.usage["prompt_tokens"]


async def test_real_engine_stop_frees_the_slot(chat_runner, real_supervisor, client, engine_url):
    await chat_runner.start(tools=False, max_tokens=3000, temperature=0.8)
    reply = await client.send("Write a very long story about a dragon, at least 2000 words.")
    cid = reply.conversation
    await client.tap.wait(lambda: len(client.tap.text(cid)) > 8, timeout=120)
    async with httpx.AsyncClient() as http:
        assert any(s["is_processing"] for s in (await http.get(f"{engine_url}/slots")).json())
        await client.control(cid, "stop")
        ends = await client.tap.wait_turn_ends(cid, 1, timeout=20)
        assert ends[0].finish_reason == "stopped"
        for _ in range(50):
            slots = (await http.get(f"{engine_url}/slots")).json()
            if not any(s["is_processing"] for s in slots):
                break
            await asyncio.sleep(0.1)
        assert not any(s["is_processing"] for s in slots)
    last = (await client.state(cid)).messages[-1]
    assert last.role == "assistant" and last.loki.stopped and last.content


async def test_real_engine_continue_prefills_only_the_new_tokens(
    chat_runner, real_supervisor, client
):
    """Issue 23: a reply cut at the preset's ``max_tokens`` is resumed by Continue; the
    prefix (the prompt and the reply so far) is in the slot's cache, so the continue request
    prefills only a few tokens, and the reply stays one message."""
    real_supervisor.max_tokens = 24
    await chat_runner.start(tools=False, temperature=0.0)
    cid, end = await client.turn("Count from 1 to 100, separated by commas.", timeout=120)
    assert end.finish_reason == "length" and end.loki["cut_at"] == 24, end.loki
    first = (await client.state(cid)).messages[-1].content
    for _ in range(100):  # the turn end is published just before the worker is done
        if not (await client.state(cid)).generating:
            break
        await asyncio.sleep(0.05)
    reply = await client.control(cid, "continue")
    assert reply.ok, reply
    ends = await client.tap.wait_turn_ends(cid, 2, timeout=120)
    timings = ends[1].timings
    assert ends[1].finish_reason in ("stop", "length"), ends[1].loki
    assert timings["cache_n"] > end.usage["prompt_tokens"]  # the prompt and the cut reply
    assert timings["prompt_n"] <= 8, timings  # only the new tokens are computed
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant"]
    assert state.messages[-1].content.startswith(first) and len(state.messages[-1].content) > len(
        first
    )


async def test_real_engine_runs_a_subagent_request_with_kind_subagent(chat_runner, real_supervisor):
    """SmolLM2's template has no tool support, so the sub-agent is driven directly: its
    request runs on the real engine under a ``subagent`` lease and its answer comes back."""
    from loki_chat.subagent import run_subagent
    from loki_chat.tools.box import CallContext

    svc = await chat_runner.start(tools=False, max_tokens=8, temperature=0.0)
    events: list[dict] = []

    async def emit(delta=None, **fields):
        events.append(fields.get("loki") or {})

    call = CallContext("c1", "conv-real", asyncio.Event(), emit)
    answer = await asyncio.wait_for(
        run_subagent(svc.shared, {"task": "Reply with one word: pong"}, call), 120
    )
    assert answer.strip() and not answer.startswith(("Error", "Stopped"))
    assert [lease.kind for lease in real_supervisor.leases] == ["subagent"]
    assert real_supervisor.leases[0].conversation == "conv-real"
    assert real_supervisor.release_requests[0].job_done
    assert events[-1]["inner"]["loki"]["event"] == "turn_end"


async def test_real_engine_verifies_an_answer_under_a_verify_lease(
    chat_runner, real_supervisor, client
):
    """The verifier's request runs on the real engine under a ``verify`` lease for the
    conversation, released with ``job_done``, and the engine's answer becomes a verdict
    (SmolLM2 rarely writes the JSON: prose is a malformed verdict, a pass). Driven directly:
    SmolLM2's replies seldom end before a small cap, and a cut answer is never verified
    (the turn path is on the fake engine, ``test_chat_verify.py``)."""
    from loki_chat.verify import run_verify

    svc = await chat_runner.start(tools=False, temperature=0.0, verify_max_tokens=48)
    shared = svc.shared
    records: list = []
    outcome = await asyncio.wait_for(
        run_verify(
            settings=shared.settings,
            engine=shared.engine,
            lease=lambda sent: shared.leases.lease("conv-real", kind="verify", fingerprints=sent),
            conversation="conv-real",
            request="What is 2+2?",
            answer="2+2 is 4.",
            stop=asyncio.Event(),
            publish_perf=records.append,
        ),
        120,
    )
    verdict = outcome.verdict
    assert verdict is not None and not outcome.stopped
    assert not verdict.reason.startswith(("verifier failed", "no lease")), verdict
    assert [lease.kind for lease in real_supervisor.leases] == ["verify"]
    assert real_supervisor.leases[0].conversation == "conv-real"
    assert real_supervisor.release_requests[0].job_done
    assert [r.kind for r in records] == ["verify"] and records[0].conversation == "conv-real"
    assert real_supervisor.held() == 0
