"""The streamed ``/v1`` answer: what the client is sent for each read of the engine's stream.

:class:`Relay` is pure (bytes in, bytes out); :mod:`.exchange` does the I/O, one write to
the client per read from the engine, so nothing waits for more (no buffering).

- Events are cut by the shared decoder (:class:`loki_shared.sse.SSEDecoder`, CRLF line ends
  made LF, events split across reads put back together) and forwarded byte for byte,
  undecoded, except the few that matter (:data:`MATTERS`): those carrying ``usage``,
  ``timings``, a ``finish_reason`` (perf record, usage opt-in), an error, or ``[DONE]``.
- An error in any of the stream's three forms (``data: {"error": ...}``, an ``error:`` field,
  ``event: error``) reaches the client as ``data: {"error": ...}``, the one form the OpenAI
  SDKs read, with ``param`` (null when the engine named none).
- The client that did not ask for ``stream_options.include_usage`` gets what llama-server
  sends without it: the usage-only chunk (``choices: []``) is dropped, its ``timings`` moved
  onto the chunk holding ``finish_reason`` (held back until the next event for that), and
  ``usage`` removed from any other chunk.
- A stream that ends without ``[DONE]`` (the engine or the network closed it) ends with an
  error event in OpenAI's shape saying so, and no ``[DONE]``: a client must not take a cut
  answer for a complete one (open-webui #29628).
"""

from __future__ import annotations

import json
import re
from typing import Any

from loki_shared.sse import SSEDecoder, StreamEvent

from .protocol import error_frame

#: An upstream event that must be decoded; the rest is relayed byte for byte.
MATTERS = re.compile(
    rb'"usage"|"timings"|"finish_reason"\s*:\s*"|"error"\s*:|\[DONE\]|(?:^|\n)(?:error|event)\s*:'
)

CUT_MESSAGE = "the engine closed the stream before its end (no [DONE])"


def _dump(chunk: dict[str, Any]) -> bytes:
    return (
        b"data: "
        + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode()
        + (b"\n\n")
    )


class Relay:
    """One streamed answer being relayed (see the module docstring).

    Args:
        wants_usage: the client asked for ``stream_options.include_usage``.

    Attributes:
        decoder: the shared decoder; after :meth:`close`, its ``figures`` (usage, timings,
            model, finish_reason) feed the perf record.
        first_data: whether an event with data was seen (time to first token).
    """

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage
        self.decoder = SSEDecoder()
        self.first_data = False
        self._held: dict[str, Any] | None = None  # finish_reason chunk waiting for timings

    @property
    def cut(self) -> bool:
        """The answer did not end properly: no ``[DONE]``, or an error event."""
        return not self.decoder.done or self.decoder.error is not None

    def feed(self, data: bytes) -> bytes:
        """The bytes to send the client for one read of the engine's stream (may be
        empty: an unfinished event waits for its end)."""
        blocks = self.decoder.split(data)
        if not blocks:
            return b""
        if not self.first_data:
            self.first_data = any(b"data:" in b for b in blocks)
        out: list[bytes] = []
        for block in blocks:
            if MATTERS.search(block) is None:
                self._release_held(out)
                out.append(block + b"\n\n")
            else:
                self._decoded(block, out)
        return b"".join(out)

    def close(self, broken: str | None = None) -> bytes:
        """The last bytes for the client when the engine's body ended (``broken``: why the
        connection failed, when it did): a last event not followed by a blank line (when
        it decodes), the held chunk, and the error event of a cut stream."""
        out: list[bytes] = []
        rest = self.decoder.flush()
        if rest is not None:
            event = self.decoder.decode(rest)
            if event is not None and event.kind != "invalid":  # a half event is dropped
                self._send(event, rest, out)
        self._release_held(out)
        if not self.decoder.done and self.decoder.error is None:
            message = CUT_MESSAGE if broken is None else f"{CUT_MESSAGE}: {broken}"
            out.append(error_frame(message, "upstream_error", "stream_cut"))
        return b"".join(out)

    def _release_held(self, out: list[bytes]) -> None:
        if self._held is not None:
            out.append(_dump(self._held))
            self._held = None

    def _decoded(self, block: bytes, out: list[bytes]) -> None:
        event = self.decoder.decode(block)
        if event is None:
            self._release_held(out)
            out.append(block + b"\n\n")
            return
        self._send(event, block, out)

    def _send(self, event: StreamEvent, block: bytes, out: list[bytes]) -> None:
        if event.kind == "error":
            self._release_held(out)
            error = dict(event.error or {})
            if event.chunk is not None and "param" in error:  # OpenAI's shape already: as sent
                out.append(block + b"\n\n")
            else:  # an error: field, event: error or no param: in the form clients read
                error.setdefault("param", None)
                out.append(_dump({"error": error}))
            return
        chunk = event.chunk
        if chunk is None or self.wants_usage:
            self._release_held(out)
            out.append(block + b"\n\n")
            return
        if "usage" in chunk and not chunk.get("choices"):
            # the usage-only chunk the client did not ask for: its timings go to the held
            # finish_reason chunk
            if self._held is not None and chunk.get("timings") and "timings" not in self._held:
                self._held["timings"] = chunk["timings"]
            self._release_held(out)
            return
        self._release_held(out)
        if "usage" in chunk:
            chunk = {k: v for k, v in chunk.items() if k != "usage"}
        if any(isinstance(c, dict) and c.get("finish_reason") for c in chunk.get("choices") or []):
            self._held = chunk
            return
        out.append(_dump(chunk))
