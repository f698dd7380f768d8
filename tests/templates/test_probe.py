"""The template probe's branches against scripted renderers (``/apply-template`` answered by
a Python function through httpx's mock transport): each verdict true, false and undecided,
the caps disagreement, an engine without ``/apply-template``, and the cache by template hash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx

from loki_supervisor.probe import (
    NOTE_CAPS,
    NOTE_NO_REASONING,
    NOTE_NO_TOOLS,
    NOTE_STRICT,
    NOTE_UNSTABLE,
    TOOL_DESCRIPTION,
    ProbeCache,
    probe_template,
    template_hash,
)

Renderer = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]


class Raise(Exception):
    """What a scripted template raises (llama-server answers 400 with the text)."""


def chatml(
    *,
    tools: bool = False,
    reasoning: bool = False,
    strict: bool = False,
    system_last: bool = False,
) -> Renderer:
    """A ChatML-like renderer with switches for what the probe detects."""

    def render(messages: list[dict[str, Any]], tool_list: Any, gen: bool) -> str:
        if strict:
            roles = [m["role"] for m in messages if m["role"] != "system"]
            if any(a == b == "user" for a, b in zip(roles, roles[1:])):
                raise Raise("Conversation roles must alternate user/assistant")
        out = []
        system = [m for m in messages if m["role"] == "system"]
        rest = [m for m in messages if m["role"] != "system"]
        head = system[0]["content"] if system else ""
        if tools and tool_list:
            head += "\nTools: " + json.dumps(tool_list)
        if not system_last:
            out.append(f"<|system|>{head}<|end|>")
        for m in rest:
            body = m.get("content") or ""
            if reasoning and m.get("reasoning_content"):
                body = f"<think>{m['reasoning_content']}</think>{body}"
            if m.get("tool_calls"):
                body += json.dumps(m["tool_calls"])
            out.append(f"<|{m['role']}|>{body}<|end|>")
        if system_last:  # a template that moves the system prompt to the end
            out.append(f"<|system|>{head}<|end|>")
        if gen:
            out.append("<|assistant|>")
        return "".join(out)

    return render


def client_for(render: Renderer | None, calls: list[dict[str, Any]] | None = None):
    """An httpx client whose ``/apply-template`` is ``render`` (None: 404, an old build)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/apply-template" or render is None:
            return httpx.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})
        body = json.loads(request.content)
        if calls is not None:
            calls.append(body)
        try:
            prompt = render(
                body["messages"], body.get("tools"), body.get("add_generation_prompt", True)
            )
        except Raise as exc:
            return httpx.Response(400, json={"error": {"code": 400, "message": str(exc)}})
        return httpx.Response(200, json={"prompt": prompt})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def probe(render: Renderer | None, caps: dict[str, Any] | None = None):
    async with client_for(render) as client:
        return await probe_template(
            client, "http://engine", None, template="T", model="m", caps=caps
        )


async def test_a_template_that_drops_tools_is_seen_and_said_in_words():
    p = await probe(chatml(), caps={"supports_tools": False})
    assert p.supports_tools is False and p.caps_supports_tools is False
    assert NOTE_NO_TOOLS in p.notes
    assert p.renders_reasoning is False and p.stable_prefix is True
    assert p.strict_alternation is False
    assert p.template_hash == template_hash("T") and p.model == "m" and p.error is None


async def test_a_template_that_renders_tools_and_reasoning():
    p = await probe(chatml(tools=True, reasoning=True))
    assert p.supports_tools is True and p.renders_reasoning is True
    assert p.stable_prefix is True and p.caps_supports_tools is None
    assert NOTE_NO_TOOLS not in p.notes


async def test_notes_are_said_only_for_what_the_template_lacks():
    bare = await probe(chatml())
    assert bare.notes == [NOTE_NO_TOOLS, NOTE_NO_REASONING]
    full = await probe(chatml(tools=True, reasoning=True))
    assert full.notes == []


async def test_tools_count_as_rendered_only_with_their_description():
    def names_only(messages, tool_list, gen):
        out = chatml()(messages, tool_list, gen)
        if tool_list:  # the names, not what they do: the model cannot use them
            out = "Tools: " + ", ".join(t["function"]["name"] for t in tool_list) + out
        return out

    p = await probe(names_only)
    assert p.supports_tools is False and NOTE_NO_TOOLS in p.notes


async def test_caps_are_compared_only_with_a_rendering_verdict():
    def no_tools(messages, tool_list, gen):
        if tool_list:
            raise Raise("tools are not supported")
        return chatml()(messages, tool_list, gen)

    p = await probe(no_tools, caps={"supports_tools": True})
    assert p.supports_tools is None and p.caps_supports_tools is True
    assert not any(n.startswith(NOTE_CAPS.split("{")[0]) for n in p.notes)


async def test_a_prefix_check_whose_rendering_fails_is_undecided():
    def no_closed_turn(messages, tool_list, gen):
        if not gen:  # a conversation ending with an answer is refused
            raise Raise("cannot render without a generation prompt")
        return chatml(tools=True)(messages, tool_list, gen)

    assert (await probe(no_closed_turn)).stable_prefix is None

    def no_tool_results(messages, tool_list, gen):
        if messages[-1]["role"] == "tool":
            raise Raise("tool results are not supported")
        return chatml(tools=True)(messages, tool_list, gen)

    p = await probe(no_tool_results)
    assert p.supports_tools is True and p.stable_prefix is None


async def test_the_rendering_wins_over_chat_template_caps():
    p = await probe(chatml(tools=True), caps={"supports_tools": False})
    assert p.supports_tools is True and p.caps_supports_tools is False
    assert any("chat_template_caps" in n for n in p.notes)


async def test_strict_alternation_is_a_template_that_raises_on_two_user_messages():
    p = await probe(chatml(strict=True))
    assert p.strict_alternation is True and NOTE_STRICT in p.notes
    assert p.stable_prefix is True  # the other probes never send two user messages


async def test_a_template_that_moves_the_system_prompt_has_no_stable_prefix():
    p = await probe(chatml(system_last=True))
    assert p.stable_prefix is False and NOTE_UNSTABLE in p.notes


async def test_a_template_that_rewrites_an_answer_once_a_turn_follows_has_no_stable_prefix():
    base = chatml()

    def render(messages, tool_list, gen):
        # an earlier answer is rendered shorter once a user message follows it (as templates
        # that strip an answer's thinking do): the request after an answer no longer starts
        # with what the engine held, though both start with the first request
        if messages[-1]["role"] == "user":
            messages = [
                {**m, "content": "(answered)"} if m["role"] == "assistant" else m for m in messages
            ]
        return base(messages, tool_list, gen)

    p = await probe(render)
    assert p.supports_tools is False and p.stable_prefix is False
    assert NOTE_UNSTABLE in p.notes


async def test_a_tool_result_that_re_renders_the_call_breaks_the_prefix():
    base = chatml(tools=True)

    def render(messages, tool_list, gen):
        if messages[-1]["role"] == "tool":  # the call is written again in another form
            messages = [
                {**m, "tool_calls": None, "content": "(called)"} if m.get("tool_calls") else m
                for m in messages
            ]
        return base(messages, tool_list, gen)

    p = await probe(render)
    assert p.supports_tools is True and p.stable_prefix is False


async def test_a_rendering_that_fails_leaves_that_verdict_undecided():
    base = chatml()

    def render(messages, tool_list, gen):
        if any(m.get("reasoning_content") for m in messages):
            raise Raise("reasoning_content is not supported")
        return base(messages, tool_list, gen)

    p = await probe(render)
    assert p.renders_reasoning is None and p.supports_tools is False


async def test_an_engine_without_apply_template_gives_an_error_and_no_verdict():
    p = await probe(None)
    assert p.error and "404" in p.error
    assert (p.supports_tools, p.renders_reasoning, p.stable_prefix, p.strict_alternation) == (
        None,
        None,
        None,
        None,
    )


async def test_the_cache_probes_a_template_once_and_retries_a_failed_probe(caplog):
    caplog.set_level(logging.INFO, logger="loki_supervisor.probe")
    calls: list[dict[str, Any]] = []
    cache = ProbeCache()
    async with client_for(chatml(tools=True, reasoning=True), calls) as client:
        first = await cache.get(client, "http://e", None, template="T", model="m", caps=None)
        n = len(calls)
        assert n >= 5 and any(TOOL_DESCRIPTION in json.dumps(c) for c in calls)
        again = await cache.get(client, "http://e", None, template="T", model="m", caps=None)
        assert again is first and len(calls) == n  # same template: not rendered again
        other = await cache.get(client, "http://e", None, template="T2", model="m", caps=None)
        assert other.template_hash == template_hash("T2") and len(calls) > n
    async with client_for(None) as client:
        failed = await cache.get(client, "http://e", None, template="T3", model="m", caps=None)
    assert failed.error
    async with client_for(chatml(), calls) as client:
        later = await cache.get(client, "http://e", None, template="T3", model="m", caps=None)
    assert later.error is None and later.supports_tools is False
    # each verdict is logged once, naming the model (an unnamed one as "the model")
    said = [r.getMessage() for r in caplog.records if "supports_tools=" in r.getMessage()]
    assert len(said) == 3 and all(" of m: supports_tools=" in line for line in said)
    async with client_for(chatml()) as client:
        await cache.get(client, "http://e", None, template="T4", model="", caps=None)
    assert " of the model: " in caplog.records[-1].getMessage()
