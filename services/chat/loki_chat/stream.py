"""Parsing a streamed completion: SSE frames, deltas, tool-call assembly, final figures.

- :class:`SSEDecoder` cuts the byte stream into SSE events incrementally and decodes UTF-8
  only on whole frames, so a multi-byte character split across network reads comes out
  intact.
- :class:`StepAccumulator` applies ``chat.completion.chunk`` objects: ``content`` and
  ``reasoning_content`` are appended; ``tool_calls`` are assembled by ``index`` (the first
  fragment carries ``id``, ``function.name`` and the start of ``function.arguments``; later
  fragments append argument suffixes; a re-sent ``name`` or ``id`` replaces, not appends).
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

DONE = "[DONE]"

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


class SSEDecoder:
    """Incremental SSE decoder (the ``text/event-stream`` format).

    :meth:`feed` takes raw bytes as they arrive and returns the ``data`` payload (str) of
    every event completed so far; bytes of an unfinished event stay buffered. Lines are
    split on ``\\n`` (a trailing ``\\r`` is dropped); an event ends at an empty line; several
    ``data:`` lines of one event are joined with ``\\n``; comments (``:``) and other fields
    are ignored. UTF-8 is decoded per whole event, with invalid bytes replaced.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        out: list[str] = []
        while True:
            cut, sep = _find_event_end(self._buf)
            if cut < 0:
                break
            raw = bytes(self._buf[:cut])
            del self._buf[: cut + sep]
            payload = _event_data(raw.decode("utf-8", "replace"))
            if payload is not None:
                out.append(payload)
        return out

    def flush(self) -> list[str]:
        """Return the data of a last event not followed by an empty line (end of body)."""
        if not self._buf.strip():
            self._buf.clear()
            return []
        raw = bytes(self._buf)
        self._buf.clear()
        payload = _event_data(raw.decode("utf-8", "replace"))
        return [payload] if payload is not None else []

    @property
    def pending(self) -> int:
        """Bytes buffered of an unfinished event."""
        return len(self._buf)


def _find_event_end(buf: bytearray) -> tuple[int, int]:
    best = (-1, 0)
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best[0] < 0 or i < best[0]):
            best = (i, len(sep))
    return best


def _event_data(text: str) -> str | None:
    lines = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value.removeprefix(" "))
    return "\n".join(lines) if lines else None


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
class PartialCall:
    """A tool call being assembled from its fragments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class StepAccumulator:
    """What one streamed completion produced so far.

    ``reasoning_pieces`` counts the ``reasoning_content`` deltas (each at most one token, an
    under-estimate of the reasoning tokens: the safe direction for context accounting).
    ``raw_timings`` / ``raw_usage`` are the final chunk's objects as sent (for perf records);
    ``timings`` / ``usage`` their tolerant decodes.
    """

    content: str = ""
    reasoning: str = ""
    reasoning_pieces: int = 0
    calls: dict[int, PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    raw_timings: dict[str, Any] | None = None
    raw_usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    done: bool = False
    chunks: int = 0

    def apply(self, obj: Any) -> list[dict[str, Any]]:
        """Apply one decoded chunk; return the display deltas it carries (OpenAI delta keys,
        ``tool_calls`` normalised to ``{index, id?, type?, function: {name?, arguments}}``).

        Raises:
            StreamErrorPayload: the chunk is ``{"error": ...}``.
        """
        if not isinstance(obj, dict):
            return []
        if "error" in obj and obj.get("error") is not None:
            raise StreamErrorPayload(obj["error"])
        self.chunks += 1
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if "timings" in obj:
            self.raw_timings = obj["timings"] if isinstance(obj["timings"], dict) else None
            self.timings = decode_timings(obj["timings"])
        if "usage" in obj and obj["usage"] is not None:
            self.raw_usage = obj["usage"] if isinstance(obj["usage"], dict) else None
            self.usage = decode_usage(obj["usage"])
        deltas: list[dict[str, Any]] = []
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return deltas
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning += reasoning
            self.reasoning_pieces += 1
            deltas.append({"reasoning_content": reasoning})
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.content += content
            deltas.append({"content": content})
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            shown = []
            for entry in calls:
                item = self._apply_call(entry)
                if item is not None:
                    shown.append(item)
            if shown:
                deltas.append({"tool_calls": shown})
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
        return deltas

    def _apply_call(self, entry: Any) -> dict[str, Any] | None:
        if not isinstance(entry, dict):
            return None
        index = entry.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = len(self.calls) if entry.get("id") else max(self.calls, default=0)
        call = self.calls.setdefault(index, PartialCall(index=index))
        shown: dict[str, Any] = {"index": index}
        if isinstance(entry.get("id"), str) and entry["id"]:
            call.id = entry["id"]  # a re-sent id replaces
            shown["id"] = call.id
            shown["type"] = "function"
        function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
        fn_shown: dict[str, Any] = {}
        if isinstance(function.get("name"), str) and function["name"]:
            call.name = function["name"]  # a re-sent name replaces, never appends
            fn_shown["name"] = call.name
        args = function.get("arguments")
        if isinstance(args, str) and args:
            call.arguments += args
            fn_shown["arguments"] = args
        elif isinstance(args, dict):  # a server that sends an object instead of text
            call.arguments += json.dumps(args, ensure_ascii=False)
            fn_shown["arguments"] = json.dumps(args, ensure_ascii=False)
        shown["function"] = fn_shown
        return shown

    def ordered_calls(self) -> list[PartialCall]:
        """Assembled calls in index order."""
        return [self.calls[i] for i in sorted(self.calls)]


class StreamErrorPayload(Exception):
    """A ``data: {"error": ...}`` frame arrived mid-stream."""

    def __init__(self, error: Any) -> None:
        self.error = error
        if isinstance(error, dict):
            text = str(error.get("message") or error)
        else:
            text = str(error)
        super().__init__(text)


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
