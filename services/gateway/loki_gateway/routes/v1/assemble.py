"""The non-streamed ``/v1`` answer, assembled from a streamed one.

A non-streamed completion is asked STREAMED upstream (llama-server notices a client that
went away only on a streamed request, so a client that gives up frees the slot at once) and
assembled here from the shared decoder's events (:class:`loki_shared.sse.SSEDecoder`):

- chat (``object: "chat.completion"``): ``content`` and ``reasoning_content`` concatenated,
  tool calls by the shared assembler (:class:`loki_shared.tool_calls.ToolCallAssembler`: by
  ``index``, a new ``id`` at an index holding another is a new call), the last
  ``finish_reason``, ``usage`` and llama.cpp's ``timings`` (last value wins);
- legacy completion (``object: "text_completion"``): the ``text`` fragments concatenated per
  choice ``index`` (a prompt array is several completions), each with its ``finish_reason``;
- every other field a choice (or a chat delta) carried is kept, merged in stream order by
  :class:`loki_shared.stream_fields.FieldMerger`: ``logprobs.content`` entries appended
  token after token, a field Loki does not know kept as sent (a delta's unknown text field
  joined, as ``content`` is); nothing is written by hand (``logprobs`` is ``null`` only
  when the stream said so).

A stream error (any of its three forms) becomes the engine error in OpenAI's shape
(:func:`.protocol.engine_error`); a stream that ends without ``[DONE]`` is 502
``stream_cut``: a cut answer is never returned as a complete one.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from loki_shared.sse import SSEDecoder, StreamEvent
from loki_shared.stream_fields import FieldMerger
from loki_shared.tool_calls import ToolCallAssembler

from .protocol import engine_error
from .relay import CUT_MESSAGE

_META = ("id", "created", "model", "system_fingerprint")
#: The choice and delta fields assembled by hand; every other one is kept as the stream
#: carried it (:class:`loki_shared.stream_fields.FieldMerger`).
CHOICE_KNOWN = frozenset({"index", "delta", "finish_reason", "message"})
DELTA_KNOWN = frozenset({"role", "content", "reasoning_content", "tool_calls"})
TEXT_KNOWN = frozenset({"index", "text", "finish_reason"})


class _Chat:
    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls = ToolCallAssembler()
        self.extra = FieldMerger(CHOICE_KNOWN, join_text=False)
        self.delta_extra = FieldMerger(DELTA_KNOWN, join_text=True)

    def take(self, choice: dict[str, Any]) -> None:
        self.extra.take(choice)
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            self.reasoning.append(delta["reasoning_content"])
        self.calls.add_all(delta.get("tool_calls"))
        self.delta_extra.take(delta)

    def choices(self, finish: str | None) -> list[dict[str, Any]]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content or not self.calls else None,
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = self.calls.as_openai()
        for key, value in self.delta_extra.fields().items():
            message.setdefault(key, value)
        choice: dict[str, Any] = {"index": 0, "message": message}
        choice.update(self.extra.fields())
        choice["finish_reason"] = finish
        return [choice]


class _Text:
    def __init__(self) -> None:
        self.texts: dict[int, list[str]] = {}
        self.finishes: dict[int, str] = {}
        self.extras: dict[int, FieldMerger] = {}

    def take(self, choice: dict[str, Any]) -> None:
        raw = choice.get("index")
        index = raw if isinstance(raw, int) else 0
        self.texts.setdefault(index, [])
        if isinstance(choice.get("text"), str):
            self.texts[index].append(choice["text"])
        if choice.get("finish_reason"):
            self.finishes[index] = choice["finish_reason"]
        self.extras.setdefault(index, FieldMerger(TEXT_KNOWN, join_text=False)).take(choice)

    def choices(self, _: str | None) -> list[dict[str, Any]]:
        texts = self.texts or {0: []}
        out = []
        for i in sorted(texts):
            choice: dict[str, Any] = {"index": i, "text": "".join(texts[i])}
            extra = self.extras.get(i)
            if extra is not None:
                choice.update(extra.fields())
            choice["finish_reason"] = self.finishes.get(i)
            out.append(choice)
        return out


async def assemble(
    body: AsyncIterator[bytes], text: bool = False
) -> tuple[int, dict[str, Any], SSEDecoder]:
    """Read a streamed completion (``body``: the engine's bytes) to its end and build the
    non-streamed answer (see the module docstring).

    Returns (status, OpenAI body, the decoder: ``figures`` for the perf record, ``done``).
    Transport errors while reading are the caller's (see :mod:`.exchange`).
    """
    decoder = SSEDecoder()
    parts: _Chat | _Text = _Text() if text else _Chat()
    meta: dict[str, Any] = {}

    def take(events: list[StreamEvent]) -> bool:
        """Apply events; True once the stream is over (``[DONE]`` or an error)."""
        for event in events:
            if event.kind in ("done", "error"):
                return True
            if event.kind != "chunk" or event.chunk is None:
                continue
            chunk = event.chunk
            for key in _META:
                if key in chunk and key not in meta:
                    meta[key] = chunk[key]
            for choice in chunk.get("choices") or []:
                if isinstance(choice, dict):
                    parts.take(choice)
        return False

    ended = False
    async for data in body:
        if take(decoder.feed(data)):
            ended = True
            break
    if not ended:
        take(decoder.close())
    return (*_finish(decoder, parts, meta, text), decoder)


def _finish(
    decoder: SSEDecoder, parts: _Chat | _Text, meta: dict[str, Any], text: bool
) -> tuple[int, dict[str, Any]]:
    if decoder.error is not None:
        code = decoder.error.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else 500
        return engine_error(status, json.dumps({"error": decoder.error}).encode())
    if not decoder.done:
        return 502, {
            "error": {
                "message": CUT_MESSAGE,
                "type": "upstream_error",
                "param": None,
                "code": "stream_cut",
            }
        }
    figures = decoder.figures
    out: dict[str, Any] = {
        "id": meta.get("id", ""),
        "object": "text_completion" if text else "chat.completion",
        "created": meta.get("created", int(time.time())),
        "model": meta.get("model", ""),
        "choices": parts.choices(figures.finish_reason),
    }
    if "system_fingerprint" in meta:
        out["system_fingerprint"] = meta["system_fingerprint"]
    if figures.usage is not None:
        out["usage"] = figures.usage
    if figures.timings is not None:
        out["timings"] = figures.timings
    return 200, out
