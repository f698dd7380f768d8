"""OpenAI-compatible ``/v1``: models, chat completions, completions, embeddings.

Every completion/embedding request runs under an engine lease of kind ``foreign``
(``loki.engine.lease``, renewed every ``ttl_s / 3``, released by ``loki.engine.release`` once
the answer is read, failed or abandoned). The body's ``id_slot`` is set to the lease's (or
removed when the lease names none); the lease's ``api_key`` goes only to the lease's
``base_url``; the client's own ``Authorization`` is never forwarded. Any ``/slots`` path is
refused with 405.

Streaming answers are passed through event by event as they arrive (no buffering,
``X-Accel-Buffering: no``); ``stream_options.include_usage`` is always asked upstream (the
usage goes to the perf record) and the usage chunk is given to the client only when it asked
for it. A client that goes away (while the engine is still reading the prompt, after the first
chunk, or while waiting for a non-streamed answer) closes the upstream connection, which
makes llama-server cancel the task and free the slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import suppress
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.messages.perf import PerfRecord
from loki_shared.perf_publish import publish_record

from ..bus import Bus
from ..deps import get_bus
from ..errors import MethodNotAllowed, ServiceError, ServiceUnavailable
from ..openai_compat import (
    engine_error,
    normalise_chat,
    normalise_completion,
    normalise_embeddings,
    parse_object,
)

log = logging.getLogger("loki.gateway.v1")
router = APIRouter(tags=["openai"])
T = TypeVar("T")

#: An upstream event that must be decoded (perf record, usage opt-in): the rest is relayed
#: byte for byte without decoding.
_MATTERS = re.compile(rb'"usage"|"timings"|"finish_reason"\s*:\s*"')
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_CHAT_SCHEMA = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string"},
                    "content": {"type": ["string", "null"]},
                },
            },
        },
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
        "n": {"type": "integer"},
    },
}
_COMPLETION_SCHEMA = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string"},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
    },
}
_EMBED_SCHEMA = {
    "type": "object",
    "required": ["input"],
    "properties": {"input": {"type": "string"}},
}


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was ready."""


def _join(base_url: str, path: str) -> str:
    """``base_url`` (with or without a trailing ``/v1``) joined with a ``/v1/...`` path."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        base = base[: -len("/v1")]
    return base + path


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` unless the client disconnects first, in which case it is
    cancelled (closing any upstream connection it holds) and :class:`ClientGone` raised.
    The request body must have been read already."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with suppress(BaseException):
        await task
    raise ClientGone()


class LeaseHolder:
    """One ``foreign`` lease: renewed in the background, released exactly once."""

    def __init__(self, bus: Bus, lease: Lease) -> None:
        self.bus = bus
        self.lease = lease
        self._renewer: asyncio.Task | None = None
        self._released = False
        if lease.ttl_s and lease.ttl_s > 0:
            self._renewer = asyncio.create_task(self._renew_loop(lease.ttl_s / 3))

    @classmethod
    async def acquire(cls, bus: Bus, wait_s: float) -> LeaseHolder:
        """Ask the supervisor for a ``foreign`` lease.

        Raises:
            ServiceUnavailable: the supervisor does not answer.
            ServiceError: it refused (busy, unavailable...).
        """
        try:
            lease = await bus.request_ok(
                subjects.ENGINE_LEASE,
                LeaseRequest(kind="foreign", wait_s=wait_s),
                Lease,
                timeout=wait_s + 5.0,
            )
        except ServiceError as exc:
            raise ServiceUnavailable(
                f"engine not available: {exc.message}", code=f"engine_{exc.code}"
            ) from exc
        return cls(bus, lease)

    async def _renew_loop(self, every: float) -> None:
        while True:
            await asyncio.sleep(max(every, 0.5))
            try:
                await self.bus.request_ok(
                    subjects.ENGINE_RENEW, RenewRequest(lease_id=self.lease.lease_id), Lease
                )
            except Exception as exc:  # noqa: BLE001 - expired or supervisor away: the request goes on
                log.warning("lease %s renewal failed: %s", self.lease.lease_id, exc)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            await self.bus.request(
                subjects.ENGINE_RELEASE,
                ReleaseRequest(lease_id=self.lease.lease_id),
                ReleaseReply,
            )
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            log.warning("lease %s release failed: %s", self.lease.lease_id, exc)


def _state(request: Request) -> Any:
    return request.app.state


def _upstream_headers(lease: Lease) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if lease.api_key:
        headers["Authorization"] = f"Bearer {lease.api_key}"
    return headers


async def _publish_perf(request: Request, record: PerfRecord) -> None:
    """Publish ``record`` into the perf stream (JetStream, acknowledged); never raises."""
    await publish_record(_state(request).bus.client, record)


def _publish_perf_later(request: Request, record: PerfRecord) -> None:
    """Publish in the background, so the client's answer does not wait for the ack."""
    tasks: set = _state(request).background
    task = asyncio.create_task(_publish_perf(request, record))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def _record(
    body: dict[str, Any],
    lease: Lease,
    started: float,
    ttft: float | None,
    final: dict[str, Any],
    cut: bool,
) -> PerfRecord:
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    now = time.monotonic()
    return PerfRecord(
        ts=time.time(),
        kind="foreign",
        model=str(final.get("model") or lease.model or ""),
        preset="external" if lease.external else "local",
        slot=lease.id_slot,
        timings=final.get("timings"),
        usage=final.get("usage"),
        ttft_ms=None if ttft is None else (ttft - started) * 1000.0,
        total_ms=(now - started) * 1000.0,
        finish_reason=final.get("finish_reason"),
        cut=cut,
        fingerprints=fingerprints(messages),
        roles=[str(m.get("role")) for m in messages if isinstance(m, dict)],
    )


async def _send_once_more_if_stale(client: httpx.AsyncClient, req: httpx.Request) -> httpx.Response:
    """Send ``req`` (streamed answer); when the engine closed the pooled connection before
    answering anything (a keep-alive race), send it once more on a fresh connection."""
    try:
        return await client.send(req, stream=True)
    except httpx.RemoteProtocolError:
        log.info("engine closed a pooled connection before answering: sending again")
        return await client.send(req, stream=True)


async def _read_body(request: Request) -> dict[str, Any]:
    return parse_object(await request.body())


async def _proxy(
    request: Request, path: str, body: dict[str, Any], perf: bool, aggregate: bool = False
) -> Response:
    """Send ``body`` to the leased engine at ``path`` and relay the answer.

    ``aggregate``: a non-streamed (chat) completion is asked STREAMED upstream and assembled
    here (:func:`_assemble`), because llama-server only notices a client that went away on a
    streamed request; so a client that gives up on a non-streamed one frees the slot at once.
    """
    state = _state(request)
    settings = state.settings
    client: httpx.AsyncClient = state.http
    assemble = aggregate and not body.get("stream")
    if assemble:
        body["stream"] = True
    stream = bool(body.get("stream"))
    wants_usage = False
    if stream:
        opts = dict(body.get("stream_options") or {})
        wants_usage = bool(opts.get("include_usage"))
        opts["include_usage"] = True
        body["stream_options"] = opts
    try:
        holder = await race_disconnect(
            request, LeaseHolder.acquire(state.bus, settings.lease_wait_s)
        )
    except ClientGone:
        return Response(status_code=499)
    lease = holder.lease
    if lease.id_slot is not None:
        body["id_slot"] = lease.id_slot
    else:
        body.pop("id_slot", None)
    started = time.monotonic()
    upstream = client.build_request(
        "POST",
        _join(lease.base_url, path),
        content=json.dumps(body, ensure_ascii=False).encode("utf-8"),
        headers=_upstream_headers(lease),
    )
    try:
        resp = await race_disconnect(request, _send_once_more_if_stale(client, upstream))
    except ClientGone:
        await holder.release()
        if perf:
            _publish_perf_later(request, _record(body, lease, started, None, {}, cut=True))
        return Response(status_code=499)
    except httpx.HTTPError as exc:
        await holder.release()
        raise ServiceUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
    except BaseException:
        await holder.release()
        raise

    if assemble and resp.status_code == 200:
        try:
            status, payload = await race_disconnect(
                request, _assemble(resp, text=path == "/v1/completions")
            )
        except ClientGone:
            if perf:
                _publish_perf_later(request, _record(body, lease, started, None, {}, cut=True))
            return Response(status_code=499)
        finally:
            await resp.aclose()
            await holder.release()
        if status != 200:
            return JSONResponse(payload, status_code=status)
        if perf:
            final = {
                "usage": payload.get("usage"),
                "timings": payload.get("timings"),
                "model": payload.get("model"),
                "finish_reason": payload["choices"][0].get("finish_reason"),
            }
            _publish_perf_later(request, _record(body, lease, started, None, final, cut=False))
        return JSONResponse(payload)

    if not stream or resp.status_code != 200:
        try:
            raw = await race_disconnect(request, resp.aread())
        except ClientGone:
            await resp.aclose()
            await holder.release()
            return Response(status_code=499)
        finally:
            await resp.aclose()
            await holder.release()
        if resp.status_code != 200:
            status, err = engine_error(resp.status_code, raw)
            log.info("engine answered %s on %s: %s", resp.status_code, path, err["error"])
            return JSONResponse(err, status_code=status)
        if perf:
            final: dict[str, Any] = {}
            with suppress(ValueError, UnicodeDecodeError, AttributeError):
                payload = json.loads(raw)
                final = {
                    "usage": payload.get("usage"),
                    "timings": payload.get("timings"),
                    "model": payload.get("model"),
                    "finish_reason": (payload.get("choices") or [{}])[0].get("finish_reason"),
                }
            _publish_perf_later(request, _record(body, lease, started, None, final, cut=False))
        return Response(content=raw, status_code=200, media_type="application/json")

    relay = Relay(request, resp, holder, body, started, wants_usage, perf)
    return RelayResponse(
        relay,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _assemble(resp: httpx.Response, text: bool = False) -> tuple[int, dict[str, Any]]:
    """Read a streamed chat completion to its end and build the non-streamed answer
    (``object: "chat.completion"``): content and reasoning concatenated, tool calls merged
    by ``index`` (id and name from their first fragment, arguments appended), the last
    ``finish_reason``, ``usage`` and llama.cpp's ``timings``. ``text``: a (legacy)
    completion instead, ``object: "text_completion"``, the ``text`` fragments concatenated
    per choice ``index`` (a prompt array is several completions). A mid-stream error
    becomes (status, OpenAI error body)."""
    meta: dict[str, Any] = {}
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    texts: dict[int, list[str]] = {}
    finishes: dict[int, str] = {}
    finish: str | None = None
    usage = timings = None
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("error"), dict):
            code = chunk["error"].get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            return engine_error(status, json.dumps(chunk).encode())
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk and key not in meta:
                meta[key] = chunk[key]
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
        for choice in chunk.get("choices") or []:
            if text:  # one text per choice index (a prompt array is several completions)
                index = choice.get("index") if isinstance(choice.get("index"), int) else 0
                texts.setdefault(index, [])
                if isinstance(choice.get("text"), str):
                    texts[index].append(choice["text"])
                if choice.get("finish_reason"):
                    finishes[index] = choice["finish_reason"]
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
            for frag in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    int(frag.get("index") or 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if frag.get("id"):
                    call["id"] = frag["id"]
                fn = frag.get("function") or {}
                if fn.get("name"):
                    call["function"]["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    call["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if text:
        texts = texts or {0: []}
        done: dict[str, Any] = {
            "id": meta.get("id", ""),
            "object": "text_completion",
            "created": meta.get("created", int(time.time())),
            "model": meta.get("model", ""),
            "choices": [
                {
                    "index": i,
                    "text": "".join(texts[i]),
                    "logprobs": None,
                    "finish_reason": finishes.get(i),
                }
                for i in sorted(texts)
            ],
        }
        for key, value in (
            ("system_fingerprint", meta.get("system_fingerprint")),
            ("usage", usage),
            ("timings", timings),
        ):
            if value is not None:
                done[key] = value
        return 200, done
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(content) if content or not calls else None,
    }
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    out: dict[str, Any] = {
        "id": meta.get("id", ""),
        "object": "chat.completion",
        "created": meta.get("created", int(time.time())),
        "model": meta.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if "system_fingerprint" in meta:
        out["system_fingerprint"] = meta["system_fingerprint"]
    if usage is not None:
        out["usage"] = usage
    if timings is not None:
        out["timings"] = timings
    return 200, out


def _inspect(data: str, final: dict[str, Any]) -> dict[str, Any] | None:
    """Decode one upstream ``data:`` payload of an event :data:`_MATTERS` picked out, note
    its ``usage``, ``timings``, ``model`` and ``finish_reason`` in ``final`` and return the
    decoded chunk (None for ``[DONE]`` or what is not a JSON object)."""
    if data == "[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    if not isinstance(chunk, dict):
        return None
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            final["finish_reason"] = choice["finish_reason"]
    for key in ("usage", "timings", "model"):
        if chunk.get(key):
            final[key] = chunk[key]
    return chunk


def _dump(chunk: dict[str, Any]) -> str:
    return json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))


def _frame(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n\n").encode("utf-8")


class Relay:
    """One streamed answer being relayed: the event loop (:meth:`events`) and its cleanup
    (close upstream, release the lease, publish the perf record), run exactly once whether
    the stream ends, fails, or the client leaves before it even started."""

    def __init__(
        self,
        request: Request,
        resp: httpx.Response,
        holder: LeaseHolder,
        body: dict[str, Any],
        started: float,
        wants_usage: bool,
        perf: bool,
    ) -> None:
        self.request = request
        self.resp = resp
        self.holder = holder
        self.body = body
        self.started = started
        self.wants_usage = wants_usage
        self.perf = perf
        self.final: dict[str, Any] = {}
        self.ttft: float | None = None
        self.cut = True
        self._cleaned = False

    async def cleanup(self) -> None:
        """Idempotent; shielded from the cancellation a client disconnect causes."""
        if self._cleaned:
            return
        self._cleaned = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await self.resp.aclose()
            await self.holder.release()
        if self.perf:
            # In the background: the end of the client's response must not wait for the
            # JetStream ack (it would hold the client's connection, and ours to the engine).
            _publish_perf_later(
                self.request,
                _record(
                    self.body, self.holder.lease, self.started, self.ttft, self.final, cut=self.cut
                ),
            )

    async def _upstream_blocks(self) -> AsyncIterator[list[bytes]]:
        """The engine's SSE events as they arrive: the complete events of each read (the
        blank line that ends them removed, CRLF line ends made LF), one list per read —
        events that arrived together leave together, nothing waits for more."""
        buf = b""
        async for raw in self.resp.aiter_bytes():
            buf += raw
            if b"\r\n" in buf:
                buf = buf.replace(b"\r\n", b"\n")
            *blocks, buf = buf.split(b"\n\n")
            blocks = [b for b in blocks if b.strip()]
            if blocks:
                if self.ttft is None and any(b"data:" in b for b in blocks):
                    self.ttft = time.monotonic()
                yield blocks
        if buf.strip():
            yield [buf]

    def _decoded(self, block: bytes) -> tuple[list[str], dict[str, Any] | None]:
        """One event that may carry ``usage``, ``timings`` or a ``finish_reason``: its lines
        and its decoded chunk (noted in ``final``; None when not JSON)."""
        lines = block.decode("utf-8", "replace").split("\n")
        chunk = None
        for i, line in enumerate(lines):
            if line.startswith("data:"):
                data = line[5:].lstrip(" ")
                chunk = _inspect(data, self.final)
                lines[i] = "data: " + data
        return lines, chunk

    async def events(self) -> AsyncIterator[bytes]:
        """Relay the engine's SSE events as they come: one write per upstream read, the
        events byte for byte except those carrying ``usage``, ``timings`` or a
        ``finish_reason``, which are decoded for the perf record.

        When the client did not ask for ``include_usage`` the stream it gets is the one
        llama-server sends without it: the usage-only chunk (``choices: []``) is dropped,
        its ``timings`` moved onto the chunk holding ``finish_reason`` (held back until the
        next event for that), and ``usage`` removed from any other chunk.
        """
        held: dict[str, Any] | None = None  # finish_reason chunk waiting for the timings
        try:
            async for blocks in self._upstream_blocks():
                out: list[bytes] = []
                for block in blocks:
                    if not _MATTERS.search(block):
                        if held is not None:
                            out.append(_frame(["data: " + _dump(held)]))
                            held = None
                        out.append(block + b"\n\n")
                        continue
                    lines, chunk = self._decoded(block)
                    if self.wants_usage or chunk is None:
                        if held is not None:
                            out.append(_frame(["data: " + _dump(held)]))
                            held = None
                        out.append(_frame(lines))
                        continue
                    if "usage" in chunk and not chunk.get("choices"):
                        # the usage-only chunk the client did not ask for
                        if held is not None:
                            if chunk.get("timings") and "timings" not in held:
                                held["timings"] = chunk["timings"]
                            out.append(_frame(["data: " + _dump(held)]))
                            held = None
                        continue
                    chunk.pop("usage", None)
                    if held is not None:
                        out.append(_frame(["data: " + _dump(held)]))
                        held = None
                    if any(
                        isinstance(c, dict) and c.get("finish_reason")
                        for c in chunk.get("choices") or []
                    ):
                        held = chunk
                        continue
                    out.append(_frame(["data: " + _dump(chunk)]))
                if out:
                    yield b"".join(out)
            if held is not None:
                yield _frame(["data: " + _dump(held)])
            self.cut = False
        finally:
            await self.cleanup()


class RelayResponse(StreamingResponse):
    """A streaming response whose relay is cleaned up even when the client leaves before
    the first byte (the body generator then never runs, so its ``finally`` cannot)."""

    def __init__(self, relay: Relay, **kwargs: Any) -> None:
        super().__init__(relay.events(), **kwargs)
        self.relay = relay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.cleanup()


@router.get("/v1/models")
async def models(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """The engine's ``/v1/models`` (no lease needed: it does not use a slot)."""
    info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
    if info.state != "ready" or not info.base_url:
        raise ServiceUnavailable(f"engine is {info.state}", code="engine_not_ready")
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    try:
        resp = await _state(request).http.get(
            _join(info.base_url, "/v1/models"), headers=headers, timeout=10
        )
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        status, err = engine_error(resp.status_code, resp.content)
        return JSONResponse(err, status_code=status)
    return Response(content=resp.content, media_type="application/json")


@router.post(
    "/v1/chat/completions",
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": _CHAT_SCHEMA}}}
    },
)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, streamed or not (see the module docstring)."""
    body = normalise_chat(await _read_body(request))
    return await _proxy(request, "/v1/chat/completions", body, perf=True, aggregate=True)


@router.post(
    "/v1/completions",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _COMPLETION_SCHEMA}},
        }
    },
)
async def completions(request: Request) -> Response:
    """OpenAI (legacy) completions, streamed or not (a non-streamed one is asked streamed
    upstream and assembled, as for chat completions)."""
    body = normalise_completion(await _read_body(request))
    return await _proxy(request, "/v1/completions", body, perf=True, aggregate=True)


@router.post(
    "/v1/embeddings",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _EMBED_SCHEMA}},
        }
    },
)
async def embeddings(request: Request) -> Response:
    """OpenAI embeddings, passed through when the engine serves them (llama-server started
    with ``--embeddings``; otherwise the engine's refusal is relayed in OpenAI's shape)."""
    body = normalise_embeddings(await _read_body(request))
    body.pop("stream", None)
    return await _proxy(request, "/v1/embeddings", body, perf=False)


@router.api_route("/v1/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/v1/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
async def slots_refused(request: Request) -> Response:
    """Slot save/restore/erase is the supervisor's alone: any ``/slots`` path is 405."""
    raise MethodNotAllowed(f"{request.url.path} is not available through the gateway")
