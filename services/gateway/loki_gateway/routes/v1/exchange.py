"""One ``/v1`` request to the engine, from the lease to the last byte, as an ASGI response.

:class:`Exchange` is what a completion or embeddings route returns. It runs the whole
exchange inside ONE ``async with lease(...)`` (:mod:`loki_shared.lease`: kind ``foreign``,
renewed every ``ttl_s / 3``, released on every way out), so the lease is released whether the
answer was read, failed, or abandoned:

1. the lease (a refusal: 503 ``engine_<type>``, nothing reaches the engine);
2. the request to the lease's ``base_url`` (its ``api_key`` as Bearer, never the client's
   ``Authorization``), body from :func:`.protocol.upstream_body`; a request the engine
   dropped before answering anything (a keep-alive race) is sent once more;
3. the answer: an engine error in OpenAI's shape (:func:`.protocol.engine_error`), the
   stream relayed (:class:`.relay.Relay`, one client write per engine read), a non-streamed
   answer assembled (:func:`.assemble.assemble`), or the engine's JSON as is (embeddings);
   the local engine's ``model`` members name the model as ``/v1/models`` does, by its file
   name, never its path (:func:`.protocol.rename_models`; an external API's as it sent them);
4. the perf record (kind ``foreign``), published in the background (the end of the client's
   answer does not wait for the JetStream ack), marked ``cut`` when the answer did not end
   properly.

A client that goes away at any point (while the lease is awaited, while the engine reads
the prompt, mid-stream, while a non-streamed answer is assembled) cancels the exchange: the
upstream connection is closed, which makes llama-server cancel the task and free the slot,
and the lease is released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from loki_shared.fingerprint import fingerprints
from loki_shared.lease import LeaseError, lease
from loki_shared.messages.engine import Lease, LeaseRequest
from loki_shared.perf_publish import build_record, publish_record
from loki_shared.sse import StreamFigures

from ...errors import ServiceUnavailable, UpstreamError
from .assemble import assemble
from .protocol import (
    engine_error,
    model_id,
    passthrough_body,
    rename_models,
    upstream_body,
    wants_usage,
)
from .relay import CUT_MESSAGE, Relay
from .responses import ResponsesReader, responses_body

log = logging.getLogger("loki.gateway.v1")

Mode = Literal["stream", "assemble", "json", "responses_stream", "responses"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def join_url(base_url: str, path: str) -> str:
    """``base_url`` (with or without a trailing ``/v1``) joined with a ``/v1/...`` path."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        base = base[: -len("/v1")]
    return base + path


def _same(raw: bytes) -> bytes:
    return raw


def upstream_headers(api_key: str | None) -> dict[str, str]:
    """Headers towards the engine: JSON, no compression, the engine's own key only."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def _send_json(send: Send, status: int, payload: Any) -> None:
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    await _send_raw(send, status, raw)


async def _send_raw(send: Send, status: int, raw: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if status == 501:
        # not implemented: asking again changes nothing (the openai SDKs retry every 5xx
        # unless told not to)
        headers.append((b"x-should-retry", b"false"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_once_more_if_stale(client: httpx.AsyncClient, req: httpx.Request) -> httpx.Response:
    """Send ``req`` (streamed answer); when the engine closed the pooled connection before
    answering anything (a keep-alive race), send it once more on a fresh connection."""
    try:
        return await client.send(req, stream=True)
    except httpx.RemoteProtocolError:
        log.info("engine closed a pooled connection before answering: sending again")
        return await client.send(req, stream=True)


@dataclass
class _Outcome:
    """What the perf record says of one exchange."""

    started: float = field(default_factory=time.monotonic)
    lease: Lease | None = None
    sent: bool = False  # the request went to the engine and it did not refuse it
    ttft: float | None = None
    figures: StreamFigures | None = None  # what the stream said (so far)
    cut: bool = True


class Exchange(Response):
    """One request to the engine under one lease (see the module docstring).

    Args:
        request: the client's request (its body already read and checked).
        path: the engine path (``/v1/chat/completions``, ``/v1/completions``,
            ``/v1/embeddings``).
        body: the checked body.
        mode: ``stream`` (relayed), ``assemble`` (asked streamed, answered as one JSON),
            ``json`` (the engine's JSON passed through), ``responses_stream`` /
            ``responses`` (the Responses API, :mod:`.responses`).
        perf: publish a perf record.
    """

    def __init__(
        self, request: Request, path: str, body: dict[str, Any], mode: Mode, perf: bool
    ) -> None:
        super().__init__(status_code=200)
        self.request = request
        self.path = path
        self.request_body = body
        self.mode = mode
        self.perf = perf

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._run(send))
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (or worse): both tasks go with it, then re-raised
            gone.cancel()
            work.cancel()
            raise
        if work in done:
            gone.cancel()
            work.result()
            return
        work.cancel()  # the client went away: close upstream, release the lease
        with suppress(asyncio.CancelledError):
            await work

    async def _run(self, send: Send) -> None:
        state = self.request.app.state
        outcome = _Outcome()
        try:
            async with lease(
                state.bus.client,
                LeaseRequest(
                    kind="foreign",
                    wait_s=state.settings.lease_wait_s,
                    prompt_fingerprints=fingerprints(self._messages()),
                ),
            ) as held:
                outcome.lease = held.lease
                await self._exchange(state.http, held.lease, send, outcome)
        except LeaseError as exc:  # refused before anything was sent: the exception handlers answer
            raise ServiceUnavailable(
                f"engine not available: {exc.message}", code=f"engine_{exc.type}"
            ) from exc
        finally:
            if self.perf and outcome.sent and outcome.lease is not None:
                self._publish(state, outcome)

    async def _exchange(
        self, client: httpx.AsyncClient, lease_: Lease, send: Send, outcome: _Outcome
    ) -> None:
        if self.mode == "json":
            content = passthrough_body(self.request_body, lease_)
        elif self.mode.startswith("responses"):
            content = responses_body(self.request_body, lease_)
        else:
            content = upstream_body(self.request_body, lease_)
        req = client.build_request(
            "POST",
            join_url(lease_.base_url, self.path),
            content=content,
            headers=upstream_headers(lease_.api_key),
        )
        outcome.sent = True
        try:
            resp = await _send_once_more_if_stale(client, req)
        except httpx.HTTPError as exc:
            outcome.sent = False
            raise ServiceUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
        try:
            if resp.status_code != 200:
                outcome.sent = False
                status, err = engine_error(resp.status_code, await resp.aread())
                log.info("engine answered %s on %s: %s", resp.status_code, self.path, err["error"])
                await _send_json(send, status, err)
            elif self.mode == "stream":
                await self._relay(resp, send, outcome, rename=not lease_.external)
            elif self.mode == "assemble":
                await self._assemble(resp, send, outcome, rename=not lease_.external)
            elif self.mode.startswith("responses"):
                await self._responses(resp, send, outcome, rename=not lease_.external)
            else:
                raw = await resp.aread()
                outcome.cut = False
                await _send_raw(send, 200, raw if lease_.external else rename_models(raw))
        finally:
            await resp.aclose()

    async def _relay(
        self, resp: httpx.Response, send: Send, outcome: _Outcome, rename: bool
    ) -> None:
        relay = Relay(wants_usage(self.request_body))
        name = rename_models if rename else _same
        outcome.figures = relay.decoder.figures
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        broken = None
        try:
            async for data in resp.aiter_bytes():
                out = relay.feed(data)
                if outcome.ttft is None and relay.first_data:
                    outcome.ttft = time.monotonic()
                if out:
                    await send({"type": "http.response.body", "body": name(out), "more_body": True})
        except httpx.HTTPError as exc:
            broken = f"{type(exc).__name__}"
        tail = name(relay.close(broken))
        outcome.cut = relay.cut
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _assemble(
        self, resp: httpx.Response, send: Send, outcome: _Outcome, rename: bool
    ) -> None:
        try:
            status, payload, decoder = await assemble(
                resp.aiter_bytes(), text=self.path == "/v1/completions"
            )
            if rename and "model" in payload:
                payload["model"] = model_id(payload["model"])
        except httpx.HTTPError as exc:  # nothing sent yet: the exception handlers answer
            raise UpstreamError(f"{CUT_MESSAGE}: {type(exc).__name__}", code="stream_cut") from exc
        outcome.figures = decoder.figures
        outcome.cut = status != 200
        await _send_json(send, status, payload)

    async def _responses(
        self, resp: httpx.Response, send: Send, outcome: _Outcome, rename: bool
    ) -> None:
        """A Responses API answer (:mod:`.responses`), streamed or not."""
        reader = ResponsesReader()
        outcome.figures = reader.figures
        name = rename_models if rename else _same
        streamed = self.mode == "responses_stream"
        broken = None
        if streamed:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        try:
            async for data in resp.aiter_bytes():
                events = reader.feed(data)
                if outcome.ttft is None and reader.first_data:
                    outcome.ttft = time.monotonic()
                if streamed and events:
                    out = name(events)
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except httpx.HTTPError as exc:
            if not streamed:  # nothing sent yet: the exception handlers answer
                raise UpstreamError(
                    f"{CUT_MESSAGE}: {type(exc).__name__}", code="stream_cut"
                ) from exc
            broken = type(exc).__name__
        rest = reader.close()
        outcome.cut = reader.cut
        if streamed:
            tail = name(rest) + reader.tail(broken)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        status, payload = reader.answer()
        if rename and status == 200 and "model" in payload:
            payload = {**payload, "model": model_id(payload["model"])}
        await _send_json(send, status, payload)

    def _messages(self) -> list[Any]:
        """The client's ``messages`` (none for a body without that list): their fingerprints
        go to the lease request (the cache-affinity key with several engines, issue 44) and
        to the perf record."""
        listed = self.request_body.get("messages")
        return listed if isinstance(listed, list) else []

    def _publish(self, state: Any, outcome: _Outcome) -> None:
        """The perf record, published in the background (see the module docstring)."""
        assert outcome.lease is not None
        messages = self._messages()
        figures = outcome.figures or StreamFigures()
        lease_ = outcome.lease
        record = build_record(
            kind="foreign",
            messages=messages,
            # the lease's model (the preset's, set by the supervisor): never the name the
            # client sent nor the one the upstream answered with, which become metric labels
            model=str(lease_.model or ""),
            preset="external" if lease_.external else "local",
            slot=lease_.id_slot,
            timings=figures.timings,
            usage=figures.usage,
            ttft_ms=None if outcome.ttft is None else (outcome.ttft - outcome.started) * 1000.0,
            total_ms=(time.monotonic() - outcome.started) * 1000.0,
            finish_reason=figures.finish_reason,
            cut=outcome.cut,
            placement=lease_.placement,
        )
        tasks: set = state.background
        task = asyncio.create_task(publish_record(state.bus.client, record))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
