"""A scripted fake of llama-server's OpenAI streaming endpoint, for exact edge cases.

It is a real HTTP/1.1 server on 127.0.0.1 (asyncio, in a background thread, usable from sync
and async tests). ``POST /v1/chat/completions`` (and ``/v1/completions``, whose frames the
script gives as text-completion chunks; ``/v1/responses``, whose frames the script gives as
Responses events) records the exact request bytes and plays the
next scripted response; ``GET /health``, ``GET /props`` and ``GET /slots`` answer like
llama-server does (``/slots`` reports ``is_processing`` while a stream is being sent).

Usage::

    from tests.fakes.fake_engine import FakeEngine, text_reply, tool_reply, HTTPError

    with FakeEngine() as engine:                     # started; engine.url = "http://127.0.0.1:PORT"
        engine.push(tool_reply([("c1", "recall", '{"id":"r1"}')], split=4),
                    text_reply("done"))
        ...                                          # point a client at engine.url
        engine.requests[0].body                      # the exact bytes received
        engine.requests[0].json["messages"]          # decoded for convenience
        await engine.await_requests(2)               # async tests: never block the loop

Responses (played in FIFO order, one per completion request; ``engine.default`` when the
script is empty, a plain "ok" reply unless changed). A request without ``"stream": true``
gets the scripted :class:`Stream` aggregated into one ``chat.completion`` JSON
(:func:`aggregate`). ``GET /v1/models`` lists ``engine.model_id`` (``fake-model``; set a path
to play llama-server started with ``-m <path>``); ``POST /v1/embeddings`` answers 501 as
llama-server does without ``--embeddings``, or one small vector per input once
``engine.embeddings`` is True.

- :class:`Stream` — SSE ``data:`` frames written one network write each (``delay_s`` between
  writes), optionally ending with ``data: [DONE]`` (``done``), or cut (``end="abort"`` closes
  the socket without the final chunk of the chunked body; ``end="clean"`` finishes the HTTP
  body normally). A frame given as ``bytes`` is written as is, so a test can split a frame,
  even inside a multi-byte character, across two writes (see :func:`split_writes`).
- :class:`HTTPError` — a non-200 answer with an OpenAI/llama.cpp-shaped error body.
- :class:`Drop` — read the request, then close the connection without answering (a failed
  connection before the first byte, as seen by the client).

Builders: :func:`text_reply`, :func:`tool_reply`, :func:`chunk`, :func:`final_chunk`,
:func:`error_frame`. Frames follow llama-server's shape: ``choices[0].delta`` with ``role``,
``content``, ``reasoning_content``, ``tool_calls`` (by ``index``; the first fragment of a call
carries ``id``, ``type`` and ``function.name``, later ones only ``function.arguments``
suffixes), then a chunk with ``finish_reason``, then a final chunk with ``choices: []``,
``usage`` and ``timings`` (only sent when the request set ``stream_options.include_usage``,
as llama-server does), then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loki_shared.tool_calls import ToolCallAssembler

__all__ = [
    "Drop",
    "FakeEngine",
    "HTTPError",
    "RecordedRequest",
    "Stream",
    "chunk",
    "error_frame",
    "final_chunk",
    "split_writes",
    "sse",
    "text_reply",
    "tool_reply",
]

_ids = itertools.count(1)

#: llama-server's answer to ``/v1/embeddings`` when it was started without ``--embeddings``.
NO_EMBEDDINGS = {
    "error": {
        "code": 501,
        "message": "This server does not support embeddings. Start it with `--embeddings`",
        "type": "not_supported_error",
    }
}


def sse(obj: dict[str, Any] | str) -> bytes:
    """One SSE frame: ``data: <json>\\n\\n`` (a ``str`` is sent after ``data: `` as is)."""
    payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def chunk(
    delta: dict[str, Any] | None = None, finish_reason: str | None = None, model: str = "fake-model"
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice holding ``delta``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "system_fingerprint": "b0-fake",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}],
    }


def final_chunk(
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    model: str = "fake-model",
) -> dict[str, Any]:
    """llama-server's last chunk: ``choices: []`` with ``usage`` and ``timings``."""
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [],
    }
    if usage is not None:
        out["usage"] = usage
    if timings is not None:
        out["timings"] = timings
    return out


def error_frame(message: str = "boom", code: int = 500, type_: str = "server_error") -> dict:
    """A mid-stream ``data: {"error": ...}`` object as llama-server sends it."""
    return {"error": {"code": code, "message": message, "type": type_}}


def default_usage(prompt_tokens: int = 20, completion_tokens: int = 5) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def default_timings(prompt_n: int = 20, cache_n: int = 0, predicted_n: int = 5) -> dict[str, Any]:
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": 10.0,
        "prompt_per_second": 2000.0,
        "predicted_n": predicted_n,
        "predicted_ms": 20.0,
        "predicted_per_second": 250.0,
    }


@dataclass
class Stream:
    """A 200 streaming answer.

    Attributes:
        frames: each item is one network write: a ``dict`` is sent as one ``data:`` frame, a
            ``str`` as ``data: <str>``, ``bytes`` as is.
        done: end with ``data: [DONE]``.
        end: ``"clean"`` finishes the HTTP body; ``"abort"`` closes the socket mid-body.
        delay_s: pause before each write (slow streams, stop tests).
        usage / timings: the final chunk's objects; ``None`` uses defaults; the final chunk
            is only sent when the request asked for ``include_usage`` and ``final`` is true.
    """

    frames: list[dict[str, Any] | str | bytes] = field(default_factory=list)
    done: bool = True
    end: str = "clean"
    delay_s: float = 0.0
    final: bool = True
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class HTTPError:
    """A non-200 answer. ``body`` dict is sent as JSON, a str as text."""

    status: int
    body: dict[str, Any] | str = field(
        default_factory=lambda: {"error": {"code": 500, "message": "error", "type": "server_error"}}
    )
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Drop:
    """Close the connection after reading the request, without answering."""


def split_writes(frame: dict[str, Any], at_char: str) -> list[bytes]:
    """Split one SSE frame into two writes in the middle of the UTF-8 bytes of ``at_char``
    (its first occurrence), so the client receives a multi-byte character in two reads."""
    raw = sse(frame)
    encoded = at_char.encode("utf-8")
    if len(encoded) < 2:
        raise ValueError("at_char must be a multi-byte character")
    pos = raw.index(encoded) + 1
    return [raw[:pos], raw[pos:]]


def text_reply(
    content: str = "ok",
    *,
    reasoning: str | None = None,
    pieces: int = 3,
    finish_reason: str = "stop",
    delay_s: float = 0.0,
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
) -> Stream:
    """A streamed reply: optional ``reasoning_content`` pieces, then ``content`` in about
    ``pieces`` deltas, then ``finish_reason`` and the final chunk."""
    frames: list[dict[str, Any] | str | bytes] = [chunk({"role": "assistant", "content": None})]
    if reasoning:
        for part in _pieces(reasoning, pieces):
            frames.append(chunk({"reasoning_content": part}))
    for part in _pieces(content, pieces):
        frames.append(chunk({"content": part}))
    frames.append(chunk({}, finish_reason))
    return Stream(frames=frames, delay_s=delay_s, usage=usage, timings=timings)


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def responses_reply(text: str = "ok", model: str = "fake-model") -> Stream:
    """A streamed ``/v1/responses`` answer as llama-server sends it: named events, the last
    ``response.completed`` (the whole response, ``usage``, and ``timings`` on its data), no
    ``[DONE]``."""
    done = {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 11, "output_tokens": 3, "total_tokens": 14},
        },
        "timings": {"prompt_n": 11, "predicted_n": 3, "cache_n": 0},
    }
    return Stream(
        frames=[
            _event("response.created", {"type": "response.created", "response": {"id": "r"}}),
            _event(
                "response.output_text.delta",
                {"type": "response.output_text.delta", "delta": text},
            ),
            _event("response.completed", done),
        ],
        done=False,
    )


def tool_reply(
    calls: list[tuple[str, str, str]],
    *,
    content: str | None = None,
    split: int = 3,
    resend_name: bool = False,
    delay_s: float = 0.0,
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    interleave: bool = False,
) -> Stream:
    """A streamed reply calling tools natively.

    Args:
        calls: ``(id, name, arguments_text)`` per call, index = position.
        content: text before the calls.
        split: the arguments text is sent in about ``split`` fragments.
        resend_name: the second fragment of each call re-sends ``function.name`` (a server
            that repeats it; the client must replace, not append).
        interleave: send the fragments of the calls interleaved (index 0, 1, 0, 1, ...).
    """
    frames: list[dict[str, Any] | str | bytes] = [chunk({"role": "assistant", "content": None})]
    if content:
        for part in _pieces(content, 2):
            frames.append(chunk({"content": part}))
    per_call: list[list[dict[str, Any]]] = []
    for index, (call_id, name, args) in enumerate(calls):
        parts = _pieces(args, split) or [""]
        fragments = []
        for n, part in enumerate(parts):
            function: dict[str, Any] = {"arguments": part}
            entry: dict[str, Any] = {"index": index, "function": function}
            if n == 0:
                entry["id"] = call_id
                entry["type"] = "function"
                function["name"] = name
            elif n == 1 and resend_name:
                function["name"] = name
            fragments.append(chunk({"tool_calls": [entry]}))
        per_call.append(fragments)
    if interleave:
        for group in itertools.zip_longest(*per_call):
            frames.extend(f for f in group if f is not None)
    else:
        for fragments in per_call:
            frames.extend(fragments)
    frames.append(chunk({}, "tool_calls"))
    return Stream(frames=frames, delay_s=delay_s, usage=usage, timings=timings)


def _pieces(text: str, n: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, n)))
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class RecordedRequest:
    """One request as received: ``body`` holds the exact bytes."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    ts: float

    @property
    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


Response = Stream | HTTPError | Drop


class FakeEngine:
    """The scripted server (see the module docstring).

    Attributes:
        url: ``http://127.0.0.1:<port>`` once started.
        requests: completion requests received, in order (:class:`RecordedRequest`).
        default: response played when the script is empty (a fresh copy each time).
        responder: when set, called with the decoded request body to choose the response
            played when the script is empty (instead of ``default``): a reply that depends
            on the conversation, e.g. a tool call first and text once the result is there.
        active_streams: streams being written right now (what ``/slots`` reports).
        disconnects: streams the client closed before the server finished writing.
        n_ctx: reported by ``/props`` and ``/slots``.
        model_path: ``/props`` ``model_path`` (``fake.gguf``).
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, n_ctx: int = 4096, total_slots: int = 1
    ) -> None:
        self.host = host
        self.port = port
        self.n_ctx = n_ctx
        self.total_slots = total_slots
        self.model_id = "fake-model"
        self.model_path = "fake.gguf"  # ``/props`` ``model_path``
        self.props_omit: set[str] = set()  # ``/props`` fields left out (an older server)
        self.slots_enabled = True  # False: ``GET /slots`` answers 501 (``--no-slots``)
        #: ``/slots`` ``id_task`` per slot (llama-server shows it once a slot ran a task)
        self.slot_tasks: dict[int, int] = {}
        self.aliases: list[str] = []  # ``data[].aliases`` (llama-server's ``--alias`` names)
        self.embeddings = False
        self.vision = False  # ``/props`` ``modalities.vision``
        self.url = ""
        self.requests: list[RecordedRequest] = []
        self.script: deque[Response] = deque()
        self.default: Response = text_reply("ok")
        self.responder: Callable[[dict[str, Any]], Response] | None = None
        self.active_streams = 0
        self.disconnects = 0
        self.completed_streams = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        """Start serving in a background thread; returns once the port is bound."""
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake engine did not start")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop and self._server and self._loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            try:
                fut.result(5)
            except Exception:  # noqa: BLE001 - the loop is stopped below anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(5)

    async def _shutdown(self) -> None:
        """Close the listening socket and cancel the connection handlers."""
        assert self._server is not None
        self._server.close()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> FakeEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ------------------------------------------------------------------------
    def push(self, *responses: Response) -> None:
        """Append responses to the script (played one per completion request, FIFO)."""
        with self._lock:
            self.script.extend(responses)

    def clear(self) -> None:
        """Forget recorded requests and the remaining script."""
        with self._lock:
            self.requests.clear()
            self.script.clear()
            self.disconnects = 0
            self.completed_streams = 0

    def wait_requests(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until at least ``n`` completion requests arrived; return them.

        Raises:
            TimeoutError: fewer arrived within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.requests)} requests, expected {n}")
                self._cond.wait(left)
            return list(self.requests)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until no stream is being written.

        Raises:
            TimeoutError: still streaming after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.active_streams:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("stream still active")
                self._cond.wait(left)

    async def await_requests(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """:meth:`wait_requests` for async tests (never blocks the event loop)."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.requests)} requests, expected {n}")
            await asyncio.sleep(0.01)
        return list(self.requests)

    async def await_idle(self, timeout: float = 10.0) -> None:
        """:meth:`wait_idle` for async tests (never blocks the event loop)."""
        deadline = time.monotonic() + timeout
        while self.active_streams:
            if time.monotonic() > deadline:
                raise TimeoutError("stream still active")
            await asyncio.sleep(0.01)

    # -- server ---------------------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(
            asyncio.start_server(self._handle, self.host, self.port)
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                keep = await self._route(method, path, headers, body, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - closing a dead socket
                pass

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        obj: Any,
        extra: dict[str, str] | None = None,
    ) -> None:
        data = obj.encode("utf-8") if isinstance(obj, str) else json.dumps(obj).encode()
        ctype = "text/plain" if isinstance(obj, str) else "application/json"
        head = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", f"Content-Length: {len(data)}"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()

    async def _route(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> bool:
        path_only = path.split("?", 1)[0]
        if method == "GET" and path_only == "/health":
            await self._send_json(writer, 200, {"status": "ok"})
            return True
        if method == "GET" and path_only == "/props":
            props = {
                "total_slots": self.total_slots,
                "default_generation_settings": {"n_ctx": self.n_ctx},
                "build_info": "b0-fake",
                "model_path": self.model_path,
                "modalities": {"vision": self.vision, "audio": False},
            }
            for name in self.props_omit:
                props.pop(name, None)
            await self._send_json(writer, 200, props)
            return True
        if method == "GET" and path_only in ("/v1/models", "/models"):
            await self._send_json(
                writer,
                200,
                {
                    "models": [{"name": self.model_id, "model": self.model_id}],
                    "object": "list",
                    "data": [
                        {
                            "id": self.model_id,
                            "aliases": list(self.aliases),
                            "object": "model",
                            "owned_by": "llamacpp",
                        }
                    ],
                },
            )
            return True
        if method == "POST" and path_only in ("/v1/embeddings", "/embeddings"):
            if not self.embeddings:  # llama-server started without --embeddings
                await self._send_json(writer, 501, NO_EMBEDDINGS)
                return True
            try:
                value = json.loads(body or b"{}").get("input", "")
            except (ValueError, AttributeError):
                value = ""
            inputs = value if isinstance(value, list) else [value]
            data = [
                {"object": "embedding", "index": i, "embedding": [0.0, 0.5, 1.0]}
                for i in range(len(inputs))
            ]
            await self._send_json(
                writer,
                200,
                {"object": "list", "data": data, "model": self.model_id, "usage": default_usage()},
            )
            return True
        if method == "GET" and path_only == "/slots" and not self.slots_enabled:
            await self._send_json(
                writer,
                501,
                {"error": {"code": 501, "message": "This server does not support slots endpoint."}},
            )
            return True
        if method == "GET" and path_only == "/slots":
            busy = self.active_streams
            await self._send_json(
                writer,
                200,
                [
                    {"id": i, "n_ctx": self.n_ctx, "is_processing": i < busy}
                    | ({"id_task": self.slot_tasks[i]} if i in self.slot_tasks else {})
                    for i in range(self.total_slots)
                ],
            )
            return True
        if method == "POST" and path_only in (
            "/v1/chat/completions",
            "/chat/completions",
            "/v1/completions",
            "/completions",
            "/v1/responses",
            "/responses",
        ):
            record = RecordedRequest(method, path, headers, body, time.time())
            with self._cond:
                self.requests.append(record)
                if self.script:
                    response = self.script.popleft()
                elif self.responder is not None:
                    response = self.responder(_json_or_empty(record))
                else:
                    response = _copy(self.default)
                self._cond.notify_all()
            return await self._play(response, record, writer)
        await self._send_json(
            writer, 404, {"error": {"code": 404, "message": "not found", "type": "not_found_error"}}
        )
        return True

    async def _play(
        self, response: Response, record: RecordedRequest, writer: asyncio.StreamWriter
    ) -> bool:
        if isinstance(response, Drop):
            return False
        if isinstance(response, HTTPError):
            await self._send_json(writer, response.status, response.body, response.headers)
            return True
        try:
            request = record.json
        except ValueError:
            request = {}
        if request.get("stream") is not True:
            await self._send_json(writer, 200, aggregate(response))
            with self._cond:
                self.completed_streams += 1
                self._cond.notify_all()
            return True
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        head = [
            "HTTP/1.1 200 OK",
            "Content-Type: text/event-stream",
            "Transfer-Encoding: chunked",
            "Cache-Control: no-cache",
        ]
        head += [f"{k}: {v}" for k, v in response.headers.items()]
        writes: list[bytes] = []
        for frame in response.frames:
            writes.append(frame if isinstance(frame, bytes) else sse(frame))
        if response.final and include_usage and response.end == "clean" and response.done:
            writes.append(
                sse(
                    final_chunk(
                        response.usage or default_usage(), response.timings or default_timings()
                    )
                )
            )
        if response.done:
            writes.append(b"data: [DONE]\n\n")
        with self._cond:
            self.active_streams += 1
            self._cond.notify_all()
        finished = False
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
            await writer.drain()
            for data in writes:
                if response.delay_s:
                    await asyncio.sleep(response.delay_s)
                if writer.is_closing() or writer.transport.is_closing():
                    raise ConnectionResetError
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
            if response.end == "abort":
                writer.transport.abort()
                return False
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            finished = True
            return True
        except (ConnectionError, OSError):
            return False
        finally:
            with self._cond:
                self.active_streams -= 1
                if finished:
                    self.completed_streams += 1
                elif response.end != "abort":
                    self.disconnects += 1
                self._cond.notify_all()


def aggregate(stream: Stream) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` equivalent of a scripted :class:`Stream` (what
    llama-server answers when the request has no ``stream: true``): content, reasoning and
    tool calls joined, ``finish_reason``, ``usage`` and ``timings``."""
    content, reasoning = "", ""
    calls = ToolCallAssembler()
    finish = None
    for frame in stream.frames:
        if not isinstance(frame, dict):
            continue
        for choice in frame.get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            calls.add_all(delta.get("tool_calls"))
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls.as_openai()
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
        "usage": stream.usage or default_usage(),
        "timings": stream.timings or default_timings(),
    }


def _copy(response: Response) -> Response:
    import copy

    return copy.deepcopy(response)


def _json_or_empty(record: RecordedRequest) -> dict[str, Any]:
    """The request's JSON body, ``{}`` when it is not a JSON object."""
    try:
        body = record.json
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
