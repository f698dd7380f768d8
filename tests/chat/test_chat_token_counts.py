"""Exact token counts by the engine's tokenizer (issue 23), against a scripted engine that
speaks llama-server's ``/tokenize`` and ``/apply-template`` with a toy tokenizer (a token is a
special marker, a word or a punctuation mark) and a toy chat template; its completions report
``usage.prompt_tokens`` as that tokenizer counts the rendered prompt. The real engine's side
is the ten-paste scenario (not done yet: see docs/behaviour.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import httpx
import pytest

from loki_chat import tokens
from loki_chat.meter import ContextMeter, estimate_tokens
from loki_chat.tokens import Engine, TokenCounts
from loki_shared.messages.chat import ChatMessage
from tests.fakes.fake_engine import FakeEngine, default_usage, text_reply

TOKEN = re.compile(r"<\|[a-z_]+\|>|<s>|\w+|[^\w\s]")


def toy_tokens(text: str) -> int:
    return len(TOKEN.findall(text))


def toy_render(messages: list[dict[str, Any]]) -> str:
    """A toy chat template: BOS, ``<|role|>`` + content + ``<|end|>`` per message, then the
    generation prompt ``<|assistant|>``."""
    out = "<s>"
    for m in messages:
        content = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            content += f"{fn['name']}{fn['arguments']}"
        out += f"<|{m['role']}|>{content}<|end|>"
    return out + "<|assistant|>"


class TokenizingEngine(FakeEngine):
    """The fake engine plus ``/tokenize`` and ``/apply-template`` (``delay_s`` before each
    answer: a slow engine); completions count their prompt with the toy tokenizer."""

    delay_s = 0.0
    tokenize_calls = 0

    async def _route(self, method, path, headers, body, writer):  # type: ignore[override]
        if method == "POST" and path in ("/tokenize", "/apply-template"):
            await asyncio.sleep(self.delay_s)
            data = json.loads(body)
            if path == "/tokenize":
                self.tokenize_calls += 1
                n = toy_tokens(data["content"])
                if data.get("add_special") and not data["content"].startswith("<s>"):
                    n += 1  # BOS, as llama-server adds it when asked
                await self._send_json(writer, 200, {"tokens": list(range(n))})
            else:
                await self._send_json(writer, 200, {"prompt": toy_render(data["messages"])})
            return True
        return await super()._route(method, path, headers, body, writer)

    async def _play(self, response, record, writer):  # type: ignore[override]
        request = record.json
        n = toy_tokens(toy_render(request.get("messages") or []))
        response = text_reply(f"Reply {n}.", usage=default_usage(n, 3))
        return await super()._play(response, record, writer)


@pytest.fixture
def tok_engine():
    with TokenizingEngine() as engine:
        yield engine


CODE = "def f(x):\n    return {'k': [x, x * 2]}  # ünïcode ✓\n" * 8
MESSAGES = [
    ChatMessage(role="user", content="Here is some code:\n" + CODE),
    ChatMessage(role="assistant", content="It doubles x; the dict holds both."),
    ChatMessage(role="user", content="And in French?"),
]
SYSTEM = "You are a test."


async def test_counts_equal_the_engines_on_the_rendered_prompt(tok_engine):
    async with httpx.AsyncClient() as http:
        counts = TokenCounts(http, timeout_s=2.0)
        counts.use(tok_engine.url, None, "toy", external=False)
        meter = ContextMeter(counter=counts)
        before = meter.view_tokens(SYSTEM, MESSAGES)  # not primed: estimates
        assert before == estimate_tokens({"role": "system", "content": SYSTEM}) + sum(
            estimate_tokens(m) for m in MESSAGES
        )
        await meter.prime(SYSTEM, MESSAGES)
        assert counts.exact() and counts.batches == 1
        wire = [{"role": "system", "content": SYSTEM}] + [
            m.model_dump(exclude_none=True, exclude={"loki"}) for m in MESSAGES
        ]
        assert meter.view_tokens(SYSTEM, MESSAGES) == toy_tokens(toy_render(wire))
        # the estimate was far off on this code (the case), the count is exact
        assert abs(before - toy_tokens(toy_render(wire))) > 0.2 * toy_tokens(toy_render(wire))
        # cached by content: priming again asks nothing
        calls = tok_engine.tokenize_calls
        await meter.prime(SYSTEM, MESSAGES)
        assert tok_engine.tokenize_calls == calls


async def test_a_slow_engine_falls_back_to_the_estimate_logged_once(tok_engine, caplog):
    caplog.set_level(logging.WARNING, logger="loki.chat.tokens")
    tok_engine.delay_s = 0.5
    async with httpx.AsyncClient() as http:
        counts = TokenCounts(http, timeout_s=0.1)
        counts.use(tok_engine.url, None, "toy", external=False)
        meter = ContextMeter(counter=counts)
        for _ in range(2):
            await meter.prime(SYSTEM, MESSAGES)
        assert not counts.exact() and counts.fallbacks == 2
        assert meter.tokens(MESSAGES[0]) == estimate_tokens(MESSAGES[0])
        warned = [r for r in caplog.records if "estimates used" in r.getMessage()]
        assert len(warned) == 1
        # an external preset counts by estimate, without asking anything
        counts.use("https://api.example.test", "sk", "remote", external=True)
        calls = tok_engine.tokenize_calls
        assert not await counts.prime(MESSAGES) and tok_engine.tokenize_calls == calls


async def test_a_known_engine_is_not_looked_up_and_new_texts_are_counted(tok_engine):
    looked_up: list[int] = []

    async def locate():
        looked_up.append(1)
        return None

    async with httpx.AsyncClient() as http:
        counts = TokenCounts(http, timeout_s=2.0, locate=locate)
        counts.use(tok_engine.url, None, "toy", external=False)  # a lease said which engine
        assert await counts.prime(MESSAGES) is True and looked_up == []
        assert counts.batches == 1
        # nothing new: no batch; a new text and a tool call: counted in the next batch
        assert await counts.prime(MESSAGES) is True and counts.batches == 1
        call = {"id": "c1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
        more = [
            *MESSAGES,
            ChatMessage(role="assistant", content="Calling.", tool_calls=[call]),
            ChatMessage(role="tool", content="pong", tool_call_id="c1"),
            ChatMessage(role="assistant", content=None, tool_calls=[{**call, "id": "c2"}]),
            ChatMessage(role="tool", content="pong again", tool_call_id="c2"),
            ChatMessage(role="user", content="A new question, with words."),
        ]
        calls = tok_engine.tokenize_calls
        assert await counts.prime(more) is True and counts.batches == 2
        assert tok_engine.tokenize_calls == calls + 5  # the new texts only, each once
        meter = ContextMeter(counter=counts)
        wire = [{"role": "system", "content": SYSTEM}] + [
            m.model_dump(exclude_none=True, exclude={"loki"}) for m in more
        ]
        await meter.prime(SYSTEM, more)
        assert meter.view_tokens(SYSTEM, more) == toy_tokens(toy_render(wire))
        # a whole request's prompt, as the engine builds it
        assert await counts.text_prompt_tokens({"messages": wire}) == toy_tokens(toy_render(wire))
        # an image KEEP_TURN_IMAGES keeps adds its measured cost to the exact text count
        text = {"type": "text", "text": "What is on it?"}
        image = {"type": "image_url", "image_url": {"url": "data:,"}, "loki_cost": 300}
        plain = {"role": "user", "content": [text]}
        with_image = {"role": "user", "content": [text, image]}
        assert await counts.prime([with_image]) is True
        assert counts.message_tokens(with_image) == counts.message_tokens(plain) + 300


class NoTokenizeEngine(FakeEngine):
    """An engine that is not a llama-server: ``/tokenize`` and ``/apply-template`` answer
    ``status`` (counted in ``counting_calls``)."""

    status = 404
    counting_calls = 0

    async def _route(self, method, path, headers, body, writer):  # type: ignore[override]
        if method == "POST" and path in ("/tokenize", "/apply-template"):
            self.counting_calls += 1
            await self._send_json(writer, self.status, {"error": {"message": "Not Found"}})
            return True
        return await super()._route(method, path, headers, body, writer)


@pytest.mark.parametrize("status", [404, 501])
async def test_an_engine_without_tokenize_is_not_asked_again(status):
    with NoTokenizeEngine() as engine:
        engine.status = status
        async with httpx.AsyncClient() as http:
            counts = TokenCounts(http, timeout_s=2.0)
            counts.use(engine.url, None, "other", external=False)
            assert not await counts.prime(MESSAGES)
            asked = engine.counting_calls
            assert asked >= 1 and counts.fallbacks == 1
            # new texts, a prompt to measure: estimates, and nothing more is sent
            assert not await counts.prime([ChatMessage(role="user", content="Something new.")])
            assert await counts.text_prompt_tokens({"messages": [{"role": "user"}]}) is None
            assert engine.counting_calls == asked and counts.fallbacks == 1
            assert counts.message_tokens(MESSAGES[0]) == estimate_tokens(MESSAGES[0])


async def test_the_turn_loop_counts_like_the_engine(chat_runner, nc, client, tok_engine, caplog):
    """Through the chat service: the count made when each request is built equals the
    engine's ``prompt_tokens`` (no ``[ctx]`` line), and ``ctx_used`` is exact."""
    from tests.fakes.fake_supervisor import FakeSupervisor

    caplog.set_level(logging.INFO, logger="loki.chat.turn")
    sup = await FakeSupervisor(nc, tok_engine.url).start()
    try:
        await chat_runner.start(tools=False, system_prompt=SYSTEM, tokenize_timeout_s=2.0)
        cid, end = await client.turn(MESSAGES[0].content)
        _, end = await client.turn("And in French? " + CODE, cid)
        assert end.usage["prompt_tokens"] > 100
        assert not [r for r in caplog.records if "[ctx]" in r.getMessage()]
        # short turns: two tokens off would already be past 2% — the count made at send
        # includes the reply's end marker and the new generation prompt
        for text in ("Hi.", "And?", "Ok."):
            _, end = await client.turn(text, cid)
        cid2, _ = await client.turn("Hello.")
        await client.turn("Again.", cid2)
        assert not [r for r in caplog.records if "[ctx]" in r.getMessage()]
    finally:
        await sup.stop()


async def test_the_engine_is_looked_up_until_found_then_never_again(tok_engine, monkeypatch):
    monkeypatch.setattr(tokens, "LOCATE_EVERY_S", 0.0)  # no pause between looks
    answers = [None, Engine(tok_engine.url, None, "toy")]
    looked_up: list[int] = []

    async def locate():
        looked_up.append(1)
        return answers[min(len(looked_up), len(answers)) - 1]

    async with httpx.AsyncClient() as http:
        counts = TokenCounts(http, timeout_s=2.0, locate=locate)
        assert await counts.prime(MESSAGES) is False  # not up yet: estimates
        assert await counts.prime(MESSAGES) is True and counts.exact()  # found at the next look
        assert await counts.prime(MESSAGES) is True and len(looked_up) == 2  # known: no look
