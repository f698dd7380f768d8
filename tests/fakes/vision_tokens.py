"""A scripted engine that sees images and counts tokens: the fake engine plus llama-server's
``/tokenize`` and ``/apply-template`` with a toy tokenizer (a token is a special marker, a
word or a punctuation mark) and a toy chat template. A completion streams the scripted reply
but reports ``usage.prompt_tokens`` as the toy tokenizer counts the rendered prompt, plus
:attr:`VisionTokenEngine.image_tokens` per ``image_url`` part (as a projector would)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from tests.fakes.fake_engine import FakeEngine, Stream, default_usage

TOKEN = re.compile(r"<\|[a-z_]+\|>|<s>|\w+|[^\w\s]")


def toy_tokens(text: str) -> int:
    return len(TOKEN.findall(text))


def toy_text(content: Any) -> str:
    """A message's text: a string, or its text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return str(content or "")


def images_in(messages: list[dict[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    )


def toy_render(messages: list[dict[str, Any]]) -> str:
    """BOS, ``<|role|>`` + text + ``<|end|>`` per message, then ``<|assistant|>``."""
    out = "<s>"
    for m in messages:
        content = toy_text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            content += f"{fn['name']}{fn['arguments']}"
        out += f"<|{m['role']}|>{content}<|end|>"
    return out + "<|assistant|>"


class VisionTokenEngine(FakeEngine):
    """See the module docstring; ``prompt_counts`` lists each completion's prompt_tokens."""

    image_tokens = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vision = True
        self.prompt_counts: list[int] = []

    async def _route(self, method, path, headers, body, writer):  # type: ignore[override]
        if method == "POST" and path in ("/tokenize", "/apply-template"):
            data = json.loads(body)
            if path == "/tokenize":
                n = toy_tokens(data["content"])
                await self._send_json(writer, 200, {"tokens": list(range(n))})
            else:
                await self._send_json(writer, 200, {"prompt": toy_render(data["messages"])})
            return True
        return await super()._route(method, path, headers, body, writer)

    async def _play(self, response, record, writer):  # type: ignore[override]
        if isinstance(response, Stream):
            messages = (record.json or {}).get("messages") or []
            n = toy_tokens(toy_render(messages)) + self.image_tokens * images_in(messages)
            self.prompt_counts.append(n)
            response = dataclasses.replace(response, usage=default_usage(n, 3))
        return await super()._play(response, record, writer)
