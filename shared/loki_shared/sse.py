"""The one decoder of llama-server / OpenAI streamed completions (``text/event-stream``).

Every reader of an engine stream uses it: the chat service's turn loop, the gateway's ``/v1``
relay and assembler, the bench's recording proxy and clients.

Framing (the SSE format, WHATWG HTML §9.2): lines end with LF, CRLF or CR; an event ends at an
empty line; ``data:`` lines of one event are joined with LF; one space after the colon is
dropped; a line starting with ``:`` is a comment (llama-server and proxies send bare ``:``
keep-alive pings). Bytes are cut into events before any UTF-8 decoding, so a multi-byte
character split anywhere across network reads comes out whole.

Meaning (what an event says about the completion):

- ``data: [DONE]``: the stream ended properly (OpenAI's and llama-server's last event);
- ``data: {json object}``: a ``chat.completion.chunk`` (or ``text_completion``) chunk;
- an error, in any of the three forms seen in the wild: ``data: {"error": ...}`` (llama-server
  today, OpenAI), an ``error:`` field (older llama-server builds and some proxies, llama.cpp
  PR #16109) and ``event: error`` with the error in ``data``. All three give the same
  :class:`StreamEvent` of kind ``"error"`` whose ``error`` is an object with a ``message``;
- anything else in ``data`` (not JSON, not an object) is kind ``"invalid"`` (readers skip it);
- a body that ends without ``[DONE]`` (and without an error) was cut: :attr:`SSEDecoder.done`
  stays False after :meth:`SSEDecoder.close`.

``usage`` (OpenAI), ``timings`` (llama.cpp), ``model`` and ``finish_reason`` may come on any
chunk; :class:`StreamFigures` keeps the last value of each (never summed).

Why not an SSE library: the spec's parsers drop the non-standard ``error:`` field, and the
gateway's relay must cut events at byte level (to forward each engine read in one write,
undecoded) and decode only the few events it needs; :meth:`SSEDecoder.split` and
:meth:`SSEDecoder.decode` give it both halves of the same decoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

DONE = "[DONE]"

EventKind = Literal["chunk", "done", "error", "invalid"]


@dataclass(slots=True)
class StreamEvent:
    """One decoded event.

    Attributes:
        kind: ``chunk`` (``chunk`` holds the JSON object), ``done`` (``data: [DONE]``),
            ``error`` (``error`` holds the engine's error object, with a ``message``),
            ``invalid`` (``data`` is not a JSON object).
        raw: the event's bytes as received, line ends made LF, without the blank line that
            ended it.
        data: the ``data`` lines joined with LF (None when the event had none).
        event: the ``event:`` field (None when absent).
    """

    kind: EventKind
    raw: bytes
    data: str | None = None
    event: str | None = None
    chunk: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class StreamFigures:
    """What a stream said about itself, from any chunk: the last ``usage`` (OpenAI) and
    ``timings`` (llama.cpp) objects, ``model`` and the last choice ``finish_reason``. A later
    value replaces an earlier one; nothing is summed; a value that is not an object (or a
    non-empty string) is ignored."""

    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None

    def note(self, chunk: dict[str, Any]) -> None:
        """Take the figures of one decoded chunk."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        model = chunk.get("model")
        if isinstance(model, str) and model:
            self.model = model
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    finish = choice.get("finish_reason")
                    if isinstance(finish, str) and finish:
                        self.finish_reason = finish


def json_object(raw: str | bytes) -> dict[str, Any] | None:
    """``raw`` decoded as JSON when it is one JSON object, else None (not JSON, not UTF-8,
    or another JSON value): the one "decode an object or skip" rule for what engines send
    (stream data, non-streamed answers, error bodies)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def error_object(value: Any) -> dict[str, Any]:
    """The engine's error as an object with a ``message``.

    ``value`` is what the stream carried: the JSON text of an ``error:`` field or of an
    ``event: error``'s data (``{"error": {...}}`` or the bare error object), the value of a
    chunk's ``error`` member (object or string), or plain text.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {"message": value.strip() or "engine error"}
    if (
        isinstance(value, dict)
        and isinstance(value.get("error"), (dict, str))
        and "message" not in value
    ):
        value = value["error"]  # {"error": {...}}: the data form
    if isinstance(value, str):
        return {"message": value or "engine error"}
    if not isinstance(value, dict):
        return {"message": json.dumps(value, ensure_ascii=False)}
    out = dict(value)
    if not isinstance(out.get("message"), str) or not out["message"]:
        out["message"] = json.dumps(value, ensure_ascii=False)
    return out


class SSEDecoder:
    """Incremental decoder of one streamed completion (see the module docstring).

    :meth:`feed` takes the body's bytes as they arrive and returns the events completed so
    far; :meth:`close` (at the end of the body) decodes a last event not followed by a blank
    line. :attr:`done` says whether ``[DONE]`` arrived, :attr:`error` holds the first error
    event's object, :attr:`figures` the last ``usage`` / ``timings`` / ``model`` /
    ``finish_reason``.

    The two halves are public for a relay that forwards bytes untouched: :meth:`split` cuts
    bytes into complete events (raw), :meth:`decode` decodes one of them.
    """

    __slots__ = ("_pending", "done", "error", "figures")

    def __init__(self) -> None:
        self._pending = b""
        self.done = False
        self.error: dict[str, Any] | None = None
        self.figures = StreamFigures()

    @property
    def pending(self) -> int:
        """Bytes held of an unfinished event."""
        return len(self._pending)

    def split(self, data: bytes) -> list[bytes]:
        """Add ``data`` and return the events it completed, raw: line ends made LF, the
        blank line that ended each one removed; blocks holding only blank lines dropped.
        The rest (an unfinished event) is kept for the next call."""
        buf = self._pending + data if self._pending else data
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # maybe the first half of CRLF: wait for the next byte
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *blocks, rest = buf.split(b"\n\n")
        self._pending = rest + held
        return [b for b in blocks if b.strip(b"\n")]

    def flush(self) -> bytes | None:
        """The unfinished event at the end of the body (None when nothing is left)."""
        rest = self._pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._pending = b""
        return rest if rest.strip(b"\n") else None

    def decode(self, raw: bytes) -> StreamEvent | None:
        """Decode one raw event (from :meth:`split` or :meth:`flush`); None when it has no
        field that matters (a comment, a ping, an ``id:`` or ``retry:`` alone). Updates
        :attr:`done`, :attr:`error` and :attr:`figures`."""
        data_lines: list[str] = []
        error_lines: list[str] = []
        event: str | None = None
        for line in raw.decode("utf-8", "replace").split("\n"):
            if not line or line[0] == ":":
                continue
            name, colon, value = line.partition(":")
            if colon and value[:1] == " ":
                value = value[1:]
            if name == "data":
                data_lines.append(value)
            elif name == "error":
                error_lines.append(value)
            elif name == "event":
                event = value
        data = "\n".join(data_lines) if data_lines else None
        if error_lines or event == "error":
            text = "\n".join(error_lines) if error_lines else (data or "")
            return self._failed(StreamEvent("error", raw, data, event, error=error_object(text)))
        if data is None:
            return None
        if data.strip() == DONE:
            self.done = True
            return StreamEvent("done", raw, data, event)
        obj = json_object(data)
        if obj is None:
            return StreamEvent("invalid", raw, data, event)
        if obj.get("error") is not None:
            return self._failed(
                StreamEvent("error", raw, data, event, chunk=obj, error=error_object(obj["error"]))
            )
        self.figures.note(obj)
        return StreamEvent("chunk", raw, data, event, chunk=obj)

    def _failed(self, event: StreamEvent) -> StreamEvent:
        if self.error is None:
            self.error = event.error
        return event

    def feed(self, data: bytes) -> list[StreamEvent]:
        """Add ``data``; return the decoded events it completed (pings and comments left
        out)."""
        out = []
        for raw in self.split(data):
            event = self.decode(raw)
            if event is not None:
                out.append(event)
        return out

    def close(self) -> list[StreamEvent]:
        """End of the body: decode what is left (an event not followed by a blank line)."""
        raw = self.flush()
        event = self.decode(raw) if raw is not None else None
        return [event] if event is not None else []

    @property
    def cut(self) -> bool:
        """After :meth:`close`: the stream ended without ``[DONE]`` and without an error
        event (the engine or the network closed it early)."""
        return not self.done and self.error is None


def decode_all(body: bytes) -> tuple[list[StreamEvent], SSEDecoder]:
    """Decode a whole body at once: its events and the decoder (``done``, ``error``,
    ``figures``)."""
    decoder = SSEDecoder()
    events = decoder.feed(body)
    events += decoder.close()
    return events, decoder


__all__ = [
    "DONE",
    "SSEDecoder",
    "StreamEvent",
    "StreamFigures",
    "decode_all",
    "error_object",
    "json_object",
]
