"""What a streamed completion produced: deltas, tool calls, final figures.

The stream itself is decoded by :class:`loki_shared.sse.SSEDecoder` (the engine client,
:mod:`loki_chat.engine`, feeds it).

- :class:`StepAccumulator` applies ``chat.completion.chunk`` objects: ``content`` and
  ``reasoning_content`` are appended; ``tool_calls`` fragments go to the shared
  :class:`loki_shared.tool_calls.ToolCallAssembler` (by ``index``; a new ``id`` at an index
  holding another id is a new call; a re-sent ``name`` replaces).
- :func:`decode_timings` / :func:`decode_usage` read the final chunk tolerantly: a missing
  field is unknown (None), a field of the wrong type is dropped alone, never the chunk.
- :func:`extract_text_tool_calls` recognises calls a model wrote as text
  (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, the Hermes/Qwen form) when the
  server did not parse them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from loki_shared.sse import StreamFigures
from loki_shared.tool_calls import ToolCall, ToolCallAssembler

#: Integer fields of llama-server's ``timings`` object (tokens).
TIMING_INTS = ("cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted")
#: Float fields of ``timings`` (milliseconds and tokens per second).
TIMING_FLOATS = (
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
)
USAGE_INTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def decode_timings(raw: Any) -> dict[str, int | float] | None:
    """Tolerant decode of llama-server's ``timings``: known numeric fields of the right type
    only (bool is not a number here); unknown fields and wrong types are dropped one by one.
    Returns None when ``raw`` is not an object."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, int | float] = {}
    for key in TIMING_INTS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
        elif isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    for key in TIMING_FLOATS:
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def decode_usage(raw: Any) -> dict[str, Any] | None:
    """Tolerant decode of OpenAI ``usage`` (token counts; ``prompt_tokens_details.
    cached_tokens`` kept when an integer). None when ``raw`` is not an object."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key in USAGE_INTS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    details = raw.get("prompt_tokens_details")
    if isinstance(details, dict):
        cached = details.get("cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            out["cached_tokens"] = cached
    return out


@dataclass
class StepAccumulator:
    """What one streamed completion produced so far.

    ``reasoning_pieces`` counts the ``reasoning_content`` deltas (each at most one token, an
    under-estimate of the reasoning tokens: the safe direction for context accounting).
    ``raw_timings`` / ``raw_usage`` are the last objects the stream sent (for perf records;
    :class:`loki_shared.sse.StreamFigures`: last value wins, never summed); ``timings`` /
    ``usage`` their tolerant decodes.
    """

    content: str = ""
    reasoning: str = ""
    reasoning_pieces: int = 0
    calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    figures: StreamFigures = field(default_factory=StreamFigures)
    done: bool = False
    chunks: int = 0

    @property
    def raw_timings(self) -> dict[str, Any] | None:
        return self.figures.timings

    @property
    def raw_usage(self) -> dict[str, Any] | None:
        return self.figures.usage

    @property
    def timings(self) -> dict[str, Any] | None:
        return decode_timings(self.figures.timings)

    @property
    def usage(self) -> dict[str, Any] | None:
        return decode_usage(self.figures.usage)

    @property
    def model(self) -> str | None:
        return self.figures.model

    @property
    def finish_reason(self) -> str | None:
        return self.figures.finish_reason

    def apply(self, obj: Any) -> list[dict[str, Any]]:
        """Apply one decoded chunk (an error event never gets here: the decoder reports
        it); return the display deltas it carries (OpenAI delta keys, ``tool_calls``
        normalised to ``{index, id?, type?, function: {name?, arguments}}`` where ``index``
        is the call's position, distinct per call)."""
        if not isinstance(obj, dict):
            return []
        self.chunks += 1
        self.figures.note(obj)
        deltas: list[dict[str, Any]] = []
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return deltas
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta: dict[str, Any] = d if isinstance(d := choice.get("delta"), dict) else {}
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning += reasoning
            self.reasoning_pieces += 1
            deltas.append({"reasoning_content": reasoning})
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.content += content
            deltas.append({"content": content})
        shown = self.calls.add_all(delta.get("tool_calls"))
        if shown:
            deltas.append({"tool_calls": shown})
        return deltas

    def ordered_calls(self) -> list[ToolCall]:
        """Assembled calls, ordered by ``index`` then arrival."""
        return self.calls.calls


_TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def extract_text_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Find ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks in ``text``.

    Returns the text with the recognised blocks removed (stripped) and ``(name,
    arguments_json_text)`` per block in order. ``arguments`` may be an object or a JSON text;
    a block that is not JSON with a string ``name`` is left in the text untouched.
    """
    calls: list[tuple[str, str]] = []

    def take(match: re.Match[str]) -> str:
        try:
            obj = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return match.group(0)
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            args_text = args
        else:
            args_text = json.dumps(args if args is not None else {}, ensure_ascii=False)
        calls.append((obj["name"], args_text))
        return ""

    rest = _TEXT_CALL.sub(take, text)
    if not calls:
        return text, []
    return rest.strip(), calls
