"""OpenAI's Responses API (``POST /v1/responses``) relayed to the engine with ``/v1``'s rules.

llama-server (the pinned build) serves ``/v1/responses`` by converting the body to a chat
completion (``input`` and ``instructions`` become ``messages``); streamed, it sends named
events (``event: response.output_text.delta`` ...) and ends with ``response.completed``,
whose ``response`` is the whole answer (with ``usage``) and whose data carries llama.cpp's
``timings``; it sends no ``[DONE]``. An error is ``data: {"error": ...}``.

- The body reaches the engine as the client wrote it, with ``stream: true`` (always asked
  streamed, so a client that goes away frees the slot at once) and ``id_slot`` the lease's
  (:func:`responses_body`); its media URLs follow :mod:`loki_gateway.media_urls`.
- Streamed: the events each engine read completes are relayed in one write, byte for byte
  (line ends made LF) but for the ``model`` members (:func:`.protocol.rename_models`); a
  stream that ends without ``response.completed`` (and without an error) ends with an
  OpenAI error event (``stream_cut``).
- Not streamed: the ``response`` of ``response.completed`` is the answer; an error event is
  the engine error in OpenAI's shape; no ``response.completed``: 502 ``stream_cut``.
- The perf record takes the usage (``input_tokens`` / ``output_tokens`` as
  ``prompt_tokens`` / ``completion_tokens``) and timings of ``response.completed``.
"""

from __future__ import annotations

import json
from typing import Any

from loki_shared.messages.engine import Lease
from loki_shared.sse import SSEDecoder, StreamFigures

from .protocol import engine_error, error_frame
from .relay import CUT_MESSAGE

COMPLETED = "response.completed"


def responses_body(body: dict[str, Any], lease: Lease) -> bytes:
    """The bytes sent to the engine: the client's body, ``stream: true``, ``id_slot`` the
    lease's (removed when it names none)."""
    out = dict(body)
    out["stream"] = True
    if lease.id_slot is not None:
        out["id_slot"] = lease.id_slot
    else:
        out.pop("id_slot", None)
    return json.dumps(out, ensure_ascii=False).encode("utf-8")


class ResponsesReader:
    """Reads one Responses stream (see the module docstring).

    Attributes:
        decoder: the shared SSE decoder (its ``error``).
        figures: usage (chat names) and timings of ``response.completed``, for the perf
            record.
        response: the ``response`` object of ``response.completed``, once seen.
        first_data: whether an event with data was seen (time to first token).
    """

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self.figures = StreamFigures()
        self.response: dict[str, Any] | None = None
        self.first_data = False

    @property
    def cut(self) -> bool:
        """The answer did not end properly: no ``response.completed``, or an error."""
        return self.response is None or self.decoder.error is not None

    def feed(self, data: bytes) -> bytes:
        """Take one read of the engine's body; returns the whole events it completed (line
        ends made LF), to relay (an unfinished event waits for its end)."""
        blocks = self.decoder.split(data)
        for block in blocks:
            self._take(block)
        return b"".join(block + b"\n\n" for block in blocks)

    def close(self) -> bytes:
        """The end of the body: an event not followed by a blank line, to relay."""
        rest = self.decoder.flush()
        if rest is None:
            return b""
        self._take(rest)
        return rest + b"\n\n"

    def _take(self, block: bytes) -> None:
        if b"data:" in block:
            self.first_data = True
        if COMPLETED.encode() not in block and b"error" not in block:
            return
        event = self.decoder.decode(block)
        if event is None or event.chunk is None or event.kind != "chunk":
            return
        chunk = event.chunk
        response = chunk.get("response")
        if chunk.get("type") != COMPLETED or not isinstance(response, dict):
            return
        self.response = response
        usage = response.get("usage")
        if isinstance(usage, dict):
            prompt = usage.get("input_tokens")
            completion = usage.get("output_tokens")
            self.figures.usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": usage.get("total_tokens"),
            }
        if isinstance(chunk.get("timings"), dict):
            self.figures.timings = chunk["timings"]
        if isinstance(response.get("model"), str):
            self.figures.model = response["model"]
        self.figures.finish_reason = str(response.get("status") or "completed")

    def tail(self, broken: str | None) -> bytes:
        """The last bytes for a streamed client: an error event when the stream was cut."""
        if self.response is None and self.decoder.error is None:
            message = CUT_MESSAGE if broken is None else f"{CUT_MESSAGE}: {broken}"
            return error_frame(message.replace("[DONE]", COMPLETED), "upstream_error", "stream_cut")
        return b""

    def answer(self) -> tuple[int, dict[str, Any]]:
        """The non-streamed answer: (status, body)."""
        if self.decoder.error is not None:
            code = self.decoder.error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            return engine_error(status, json.dumps({"error": self.decoder.error}).encode())
        if self.response is None:
            return 502, {
                "error": {
                    "message": CUT_MESSAGE.replace("[DONE]", COMPLETED),
                    "type": "upstream_error",
                    "param": None,
                    "code": "stream_cut",
                }
            }
        return 200, self.response
