"""The untrusted relay stand-in of issue 45's tests: a plain HTTP proxy on loopback that
records every byte both ways and can tamper with them.

:class:`Relay` runs an aiohttp server in a background thread and forwards each request to
``upstream`` (the gateway) as it came (path, query, headers, body), streaming the answer back.
It keeps :attr:`Relay.records` (``("request", bytes)`` / ``("response", bytes)``, the request
line, headers and body; the answer's body, chunk by chunk) and applies, when set:

- :attr:`Relay.on_request`: ``(method, path_qs, headers, body) -> (method, path_qs, headers,
  body)``: rewrite a request (flip a byte, point it at ``/api/chat``, add a header);
- :attr:`Relay.on_body`: ``(path, bytes) -> bytes``: rewrite a whole (non-SSE) answer;
- :attr:`Relay.on_frame`: ``(path, frame) -> list[bytes]``: each SSE frame of an answer
  (without its blank line) becomes the frames returned: drop ``[]``, repeat, swap, alter;
  raising :class:`CutMidFrame` sends its ``partial`` bytes and ends the answer there (a
  stream truncated in the middle of a frame).

:meth:`Relay.replay` sends a recorded request again, as it was.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from loki_shared import servers

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class CutMidFrame(Exception):
    """Raised by :attr:`Relay.on_frame`: write ``partial`` (no blank line) and end the answer."""

    def __init__(self, partial: bytes) -> None:
        super().__init__("the relay cuts the stream mid-frame")
        self.partial = partial


class Relay:
    """See the module docstring. ``start()`` returns once it listens at :attr:`url`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.records: list[tuple[str, bytes]] = []
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.on_request: Callable[..., tuple[str, str, dict[str, str], bytes]] | None = None
        self.on_body: Callable[[str, bytes], bytes] | None = None
        self.on_frame: Callable[[str, bytes], list[bytes]] | None = None
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> Relay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("relay did not start")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        """Forget the hooks (not the records)."""
        self.on_request = self.on_body = self.on_frame = None

    def recorded(self) -> bytes:
        """Every byte seen, both ways, concatenated."""
        return b"".join(data for _, data in self.records)

    def replay(self, index: int = -1) -> tuple[int, bytes]:
        """Send the recorded request ``index`` (of :attr:`requests`) again: ``(status,
        body)``."""
        method, path_qs, headers, body = self.requests[index]
        return asyncio.run_coroutine_threadsafe(
            self._send_raw(method, path_qs, headers, body), self.loop
        ).result(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._open())
        self._ready.set()
        self.loop.run_forever()

    async def _open(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _send_raw(
        self, method: str, path_qs: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.request(
            method, self.upstream + path_qs, headers=headers, data=body
        ) as resp:
            return resp.status, await resp.read()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        method, path_qs = request.method, request.path_qs
        head = f"{method} {path_qs}\n" + "".join(f"{k}: {v}\n" for k, v in headers.items())
        self.records.append(("request", head.encode() + b"\n" + body))
        if self.on_request is not None:
            method, path_qs, headers, body = self.on_request(method, path_qs, headers, body)
        self.requests.append((method, path_qs, dict(headers), body))
        upstream = await self._session.request(
            method, self.upstream + path_qs, headers=headers, data=body or None
        )
        try:
            out = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP and key.lower() != "content-encoding":
                    out.headers[key] = value
            sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
            if not sse:
                data = await upstream.read()
                self.records.append(("response", data))
                if self.on_body is not None:
                    data = self.on_body(request.path, data)
                out.content_length = len(data)
                await out.prepare(request)
                await out.write(data)
                return out
            await out.prepare(request)
            buffer = b""
            async for chunk in upstream.content.iter_any():
                self.records.append(("response", chunk))
                buffer += chunk
                while b"\n\n" in buffer:
                    frame, buffer = buffer.split(b"\n\n", 1)
                    try:
                        frames = (
                            [frame] if self.on_frame is None else self.on_frame(request.path, frame)
                        )
                    except CutMidFrame as cut:
                        await out.write(cut.partial)
                        return out
                    for item in frames:
                        await out.write(item + b"\n\n")
            return out
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return out  # the client went away (a test closed its stream)
        finally:
            upstream.release()


def frame_fields(frame: bytes) -> dict[str, Any]:
    """The ``id``/``event``/``data`` fields of one SSE frame (bytes, no blank line)."""
    out: dict[str, Any] = {}
    for line in frame.decode().split("\n"):
        name, _, value = line.partition(":")
        if name:
            out[name] = value[1:] if value.startswith(" ") else value
    return out
