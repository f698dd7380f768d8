"""One streamed completion against the engine, with network retries and stop.

Rule (network retries): while no byte of the response has been streamed, a failed
connection or an HTTP 429, 502, 503 or 504 is retried up to three times after 0.8 s, 1.6 s
and 3.2 s (``Settings.retry_delays``); the pauses are interrupted by a stop. Once a byte of a
200 response arrived, nothing is ever retried (the user already saw it). HTTP 500 is not
retried here: llama.cpp answers 500 to deterministic failures (unparsable tool call,
template error, prompt too long) that the turn loop handles itself. The count is per
request, so it restarts once a response arrives.

Stop closes the upstream HTTP request (the ``async with`` of the stream exits), which makes
llama-server cancel the task and free the slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from loki_shared.fingerprint import tools_fingerprint
from loki_shared.messages.engine import Lease
from loki_shared.messages.perf import PerfRecord
from loki_shared.perf_publish import build_record
from loki_shared.sse import SSEDecoder, StreamEvent

from .errors import EngineHTTPError, EngineUnreachable, StepError, StreamError
from .stream import StepAccumulator

log = logging.getLogger("loki.chat.engine")

RETRY_STATUSES = frozenset({429, 502, 503, 504})

DeltaSink = Callable[[list[dict[str, Any]]], Awaitable[None]]
RetrySink = Callable[[int, float, str], Awaitable[None]]


@dataclass
class StepResult:
    """The outcome of one completion request.

    ``ttft_ms``: milliseconds from sending to the first delta of any type; ``total_ms``:
    to the end of the stream. ``cut``: the stream started but did not end with ``[DONE]``
    (or carried an error). ``error`` is set when the step failed, ``stopped`` when a stop
    closed it; ``acc`` holds whatever was received (partial on error or stop).
    """

    acc: StepAccumulator = field(default_factory=StepAccumulator)
    ttft_ms: float | None = None
    total_ms: float | None = None
    cut: bool = False
    stopped: bool = False
    error: StepError | None = None
    attempts: int = 0
    responded: bool = False

    def perf_record(
        self,
        kind: str,
        conversation: str,
        lease: Lease,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> PerfRecord:
        """The perf record of this completion: ``kind`` (``main``, ``task``, ``subagent``,
        ``verify``, ``prewarm``) for ``conversation``, sent under ``lease`` (model, local or
        external, ``id_slot``, the template probe's ``stable_prefix``) with ``messages``
        (the wire array: only fingerprints and roles are kept) and ``tools`` (the tools
        offered: their fingerprint only); the engine's ``timings`` and ``usage`` as
        received, the times measured here; the lease's ``placement`` (several engines: the
        engine, ``moved_from``, ``transfer``).

        Raises:
            pydantic.ValidationError: ``kind`` is not a request kind.
        """
        return build_record(
            kind=kind,
            messages=messages,
            conversation=conversation,
            model=lease.model,
            preset="external" if lease.external else "local",
            slot=lease.id_slot,
            timings=self.acc.raw_timings,
            usage=self.acc.raw_usage,
            ttft_ms=self.ttft_ms,
            total_ms=self.total_ms,
            finish_reason=self.acc.finish_reason,
            cut=self.cut,
            prefix_unstable=lease.template is not None and lease.template.stable_prefix is False,
            tools_fingerprint=tools_fingerprint(tools),
            placement=lease.placement,
        )


class EngineClient:
    """Streams ``POST {base_url}/v1/chat/completions`` with an exact body.

    Args:
        http: a shared ``httpx.AsyncClient``.
        retry_delays: pauses in seconds before each retry (rule above).
        read_timeout_s: longest silence inside a stream before it counts as broken.
    """

    def __init__(
        self, http: httpx.AsyncClient, retry_delays: list[float], read_timeout_s: float = 600.0
    ) -> None:
        self.http = http
        self.retry_delays = list(retry_delays)
        self.timeout = httpx.Timeout(connect=10.0, read=read_timeout_s, write=30.0, pool=10.0)

    async def stream(
        self,
        base_url: str,
        body: bytes,
        *,
        api_key: str | None,
        stop: asyncio.Event,
        on_delta: DeltaSink,
        on_retry: RetrySink | None = None,
    ) -> StepResult:
        """Send ``body`` (canonical JSON bytes) and stream the answer.

        ``on_delta`` receives the display deltas of each chunk (see
        :meth:`StepAccumulator.apply`). Never raises for engine trouble: the result's
        ``error`` says what failed; ``stopped`` is set when ``stop`` fired first.
        """
        result = StepResult()
        task = asyncio.create_task(self._run(base_url, body, api_key, result, on_delta, on_retry))
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                result.stopped = True
                result.cut = result.responded
            else:
                task.result()
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            stopper.cancel()
        return result

    async def _run(
        self,
        base_url: str,
        body: bytes,
        api_key: str | None,
        result: StepResult,
        on_delta: DeltaSink,
        on_retry: RetrySink | None,
    ) -> None:
        url = base_url.rstrip("/") + "/v1/chat/completions"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        attempt = 0
        t0 = time.monotonic()
        while True:
            result.attempts = attempt + 1
            t0 = time.monotonic()
            reason = ""
            try:
                async with self.http.stream(
                    "POST", url, content=body, headers=headers, timeout=self.timeout
                ) as resp:
                    if resp.status_code != 200:
                        text = (await resp.aread()).decode("utf-8", "replace")
                        if resp.status_code in RETRY_STATUSES and attempt < len(self.retry_delays):
                            reason = f"HTTP {resp.status_code}"
                        else:
                            result.error = EngineHTTPError(
                                f"engine answered HTTP {resp.status_code}: {text[:300]}",
                                status=resp.status_code,
                                body=text,
                            )
                            return
                    else:
                        await self._consume(resp, result, on_delta, t0)
                        return
            except httpx.TransportError as exc:
                if result.responded:
                    result.cut = True
                    result.error = StreamError(f"stream broken: {exc!r}")
                    result.total_ms = (time.monotonic() - t0) * 1000
                    return
                if attempt < len(self.retry_delays):
                    reason = f"{type(exc).__name__}"
                else:
                    result.error = EngineUnreachable(f"engine unreachable: {exc!r}")
                    return
            delay = self.retry_delays[attempt]
            attempt += 1
            log.warning(
                "engine request failed before the first byte (%s); retry %d in %.1f s",
                reason,
                attempt,
                delay,
            )
            if on_retry is not None:
                await on_retry(attempt, delay, reason)
            await asyncio.sleep(delay)

    async def _consume(
        self, resp: httpx.Response, result: StepResult, on_delta: DeltaSink, t0: float
    ) -> None:
        """Read the stream to its end, an error event or ``[DONE]``
        (:class:`loki_shared.sse.SSEDecoder`: an ``error:`` field, ``event: error`` and
        ``data: {"error": ...}`` are the same error)."""
        decoder = SSEDecoder()
        async for data in resp.aiter_bytes():
            if not data:
                continue
            result.responded = True
            for event in decoder.feed(data):
                if await self._handle(event, result, on_delta, t0):
                    result.total_ms = (time.monotonic() - t0) * 1000
                    return
        for event in decoder.close():
            if await self._handle(event, result, on_delta, t0):
                break
        result.total_ms = (time.monotonic() - t0) * 1000
        if result.error is None and not result.acc.done:
            result.cut = True
            result.error = StreamError("the stream ended without data: [DONE]")

    async def _handle(
        self, event: StreamEvent, result: StepResult, on_delta: DeltaSink, t0: float
    ) -> bool:
        """Apply one decoded event; True when the stream is over (``[DONE]`` or an error)."""
        if event.kind == "done":
            result.acc.done = True
            return True
        if event.kind == "error":
            error = event.error or {}
            result.cut = True
            result.error = StreamError(
                f"engine error mid-stream: {error.get('message')}",
                body=json.dumps(error, ensure_ascii=False),
            )
            return True
        if event.kind == "invalid":
            log.warning("undecodable SSE data ignored: %.120r", event.data)
            return False
        deltas = result.acc.apply(event.chunk)
        if deltas:
            if result.ttft_ms is None:
                result.ttft_ms = (time.monotonic() - t0) * 1000
            await on_delta(deltas)
        return False
