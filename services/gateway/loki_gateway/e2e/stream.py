"""The sealed SSE stream of ``GET /api/e2e/chat``: the frames of ``/api/chat``'s stream
(:func:`loki_gateway.event_hub.conversation_stream`, unchanged), each data sealed for one
device, and the stream cut as soon as the device is revoked.

Frame by frame:

- ``id: <seq>\\ndata: <event>`` becomes ``id: <seq>\\ndata: <envelope>``: the id stays the
  plain seq (``Last-Event-ID`` resume stays exact); the associated data binds the device,
  the conversation, the stream id the client chose, the name ``message``, the seq and the
  seq sent before it on this stream (the resume point for the first one), so a dropped,
  repeated, reordered or transplanted frame does not open;
- ``event: <name>\\ndata: <json>`` (``history``, ``reconnect``) is sealed the same way with
  its name, seq and previous seq both the last seq sent;
- ``retry:`` and comments (``: ping``) pass as they are (no content).

Revocation: the device is checked every :data:`CHECK_S` seconds while the stream waits, and
before each chunk; once revoked the stream ends (the client's reconnection is then refused).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress

from loki_shared import e2e_envelope as env

from .devices import DeviceStore

CHECK_S = 0.5


class FrameSealer:
    """Seals the frames of one stream (see the module docstring); ``last`` is the seq of
    the last event sealed (starts at the resume point)."""

    def __init__(self, key: bytes, device: str, conversation: str, stream: str, after: int):
        self.key = key
        self.device = device
        self.conversation = conversation
        self.stream = stream
        self.last = after

    def _seal(self, name: str, seq: int, data: str) -> str:
        aad = env.aad(
            self.device, "chat", "event", self.conversation, self.stream, name, seq, self.last
        )
        sealed = env.seal(self.key, self.device, json.loads(data), aad)
        return json.dumps(sealed, separators=(",", ":"))

    def frame(self, raw: str) -> str:
        """One SSE frame (without its blank line) sealed; unknown lines are dropped."""
        fields: dict[str, str] = {}
        for line in raw.split("\n"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" not in fields:
            return raw  # retry:, comments: no content
        if "id" in fields:
            seq = int(fields["id"])
            out = f"id: {seq}\ndata: {self._seal('message', seq, fields['data'])}"
            self.last = seq
            return out
        name = fields.get("event", "message")
        return f"event: {name}\ndata: {self._seal(name, self.last, fields['data'])}"

    def chunk(self, data: bytes) -> bytes:
        """A chunk of whole frames (what the event hub yields) sealed."""
        frames = data.decode("utf-8").split("\n\n")
        return "".join(self.frame(f) + "\n\n" for f in frames if f).encode()


async def sealed_stream(
    inner: AsyncIterator[bytes], sealer: FrameSealer, store: DeviceStore
) -> AsyncIterator[bytes]:
    """``inner``'s chunks sealed by ``sealer``, ended when the device is revoked."""
    iterator = inner.__aiter__()
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=CHECK_S)
            if not await store.active(sealer.device):
                return
            if not done:
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield sealer.chunk(chunk)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with suppress(BaseException):
                await pending
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            with suppress(Exception):
                await aclose()
