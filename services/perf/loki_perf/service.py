"""The perf service's NATS wiring: ring rebuild, live consumption, request/reply, metrics.

Start-up order (:meth:`PerfService.start`):

1. connect the FastStream broker (request/reply subscribers on ``loki.perf.summary``,
   ``loki.perf.losses``, ``loki.perf.cacheram``, queue group ``perf``);
2. make sure the ``LOKI_PERF`` stream exists (:func:`loki_shared.perf_publish.ensure_perf_stream`)
   and read its state (the last sequence to reach before the ring is "rebuilt");
3. load the metrics checkpoint from the ``LOKI_PERF_TOTALS`` key-value bucket;
4. subscribe with a JetStream *ordered consumer* from the first message of the stream: the
   stored records (at most 5000) rebuild the ring, and the same consumer then delivers the
   live ones, so nothing published while the service was down is lost and nothing is read
   twice (records are also de-duplicated by stream sequence);
5. serve ``/metrics`` (prometheus-client) and checkpoint the totals every few seconds.

Every instance reads every record (no queue group on the records); any instance may answer a
request, since each holds the whole ring.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
from nats.js.api import DeliverPolicy, KeyValueConfig
from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from loki_shared import lifecycle, perf_checkpoint, subjects
from loki_shared.errors import InvalidRequest
from loki_shared.messages.engine import BenchReply, BenchRequest
from loki_shared.messages.perf import (
    CacheRamAdviceReply,
    CacheRamAdviceRequest,
    LossesReply,
    LossesRequest,
    PerfSummary,
    SummaryRequest,
)
from loki_shared.nats import broker_client, make_broker, stop_broker
from loki_shared.perf_publish import ensure_perf_stream
from loki_shared.serve import serve

from .decode import DEPTH_NAMES, Entry, RecordDecodeError, decode
from .errors import MetricsPortInUse, StreamUnavailable
from .metrics import PerfCollector, Totals
from .ring import Ring
from .settings import Settings

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

CHECKPOINT_KEY = perf_checkpoint.CHECKPOINT_KEY
#: Seconds a scrape waits for the supervisor's benchmark runs.
BENCH_ASK_S = 1.0


def perf_line(e: Entry) -> str:
    """The ``[perf]`` stderr line of one record (only written when ``LOKI_PERF_LOG`` is set)."""
    parts = [f"[perf] seq={e.seq} kind={e.kind}"]
    if e.conversation:
        parts.append(f"conv={e.conversation}")
    if e.model:
        parts.append(f"model={e.model}")
    if e.slot is not None:
        parts.append(f"slot={e.slot}")
    if e.external:
        parts.append("external")
    if e.cached is not None and e.computed is not None:
        parts.append(f"prefill={e.recomputed} new/{e.eff_cached} cached")
        if e.full_hit:
            parts.append("full_hit")
    elif e.depth is not None:
        parts.append(f"prefill={e.depth} tok")
    if e.generated is not None:
        parts.append(f"gen={e.generated}")
    if e.ttft_ms is not None:
        parts.append(f"ttft={e.ttft_ms:.0f}ms")
    if e.pp_tps is not None:
        parts.append(f"pp={e.pp_tps:.1f}tok/s")
    if e.tg_tps is not None:
        parts.append(f"tg={e.tg_tps:.1f}tok/s")
    if e.bucket is not None:
        parts.append(f"depth={DEPTH_NAMES[e.bucket]}")
    if e.draft_n:
        parts.append(f"draft={e.draft_n_accepted}/{e.draft_n}")
    if e.cut is not False:
        parts.append("cut")
    if e.loss is not None:
        parts.append(f"{e.loss.type}={e.loss.tokens} cause={e.loss.cause}")
        if e.loss.index is not None:
            parts.append(f"at={e.loss.index}:{e.loss.role}")
    if e.advice is not None:
        parts.append("cache_ram_advice")
    if e.dropped:
        parts.append("dropped=" + ",".join(e.dropped))
    return " ".join(parts)


class PerfService:
    """One perf service instance (see the module docstring for its life cycle).

    Args:
        settings: the service settings.
        log: the service logger.
    """

    def __init__(self, settings: Settings, log: logging.Logger | None = None) -> None:
        self.settings = settings
        self.log = log or logging.getLogger("loki.perf")
        self.broker = make_broker(settings.nats_url, "perf", login=settings.nats_options())
        self.ring = Ring(
            capacity=subjects.STREAM_PERF_MAX_MSGS,
            loss_min_tokens=settings.perf_loss_min_tokens,
        )
        self.totals = Totals()
        self.rejected = 0
        self.ready = asyncio.Event()
        self._target_seq = 0
        self._last_seen = 0
        self._stream_id = ""
        self._saved_seq = -1
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._sub = None
        self._tasks: list[asyncio.Task] = []
        self._http: tuple[WSGIServer, threading.Thread] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics_port: int | None = None
        self._register()

    # --- request/reply -------------------------------------------------------------------------
    def _register(self) -> None:
        """Answer the perf subjects with :func:`loki_shared.serve.serve` (queue group
        ``perf``)."""
        for subject, handler in (
            (subjects.PERF_SUMMARY, self._on_summary),
            (subjects.PERF_LOSSES, self._on_losses),
            (subjects.PERF_CACHERAM, self._on_cacheram),
        ):
            serve(self.broker, subject, handler, queue=subjects.QUEUE_PERF)

    async def _on_summary(self, _: SummaryRequest) -> PerfSummary:
        s = self.ring.summary()
        s["detail"]["rebuilding"] = not self.ready.is_set()
        return PerfSummary(**s)

    async def _on_losses(self, req: LossesRequest) -> LossesReply:
        if not 1 <= req.limit <= subjects.STREAM_PERF_MAX_MSGS:
            raise InvalidRequest(f"limit must be 1..{subjects.STREAM_PERF_MAX_MSGS}")
        return LossesReply(losses=self.ring.losses(req.limit))

    async def _on_cacheram(self, req: CacheRamAdviceRequest) -> CacheRamAdviceReply:
        return CacheRamAdviceReply(**self.ring.advice(req.since_seq))

    # --- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, rebuild the ring from the stream and consume live; serve ``/metrics``.

        Raises:
            StreamUnavailable: the stream cannot be created or read.
            MetricsPortInUse: the metrics port is taken.
        """
        self._loop = asyncio.get_running_loop()
        await self.broker.start()
        js = self._js = self.broker.config.connection_state.stream
        try:
            try:
                await ensure_perf_stream(js)
            except nats.js.errors.BadRequestError as exc:
                # Declared elsewhere with another configuration: use it as it is.
                self.log.warning("stream %s: %s", subjects.STREAM_PERF, exc)
            info = await js.stream_info(subjects.STREAM_PERF)
        except (nats.errors.Error, OSError) as exc:
            raise StreamUnavailable(f"stream {subjects.STREAM_PERF}: {exc}") from exc
        self._stream_id = perf_checkpoint.stream_identity(info)
        # An empty stream (new, or purged: last_seq stays) has nothing to rebuild.
        self._target_seq = info.state.last_seq if info.state.messages else 0
        await self._load_checkpoint(info.state.last_seq)
        if self._target_seq == 0:
            self.ready.set()
        self._sub = await js.subscribe(
            subjects.PERF_RECORD,
            stream=subjects.STREAM_PERF,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=self._on_record,
        )
        self._start_metrics()
        self._tasks.append(asyncio.create_task(self._checkpoint_loop()))
        self.log.info(
            "perf started: stream %s holds up to seq %d, checkpoint at seq %d, metrics on %s",
            subjects.STREAM_PERF,
            self._target_seq,
            self.totals.seq,
            self.metrics_port if self.metrics_port is not None else "(off)",
        )

    async def stop(self, steps: lifecycle.Steps | None = None) -> None:
        """Stop consuming, write a last checkpoint, close ``/metrics`` and the broker, each
        step bounded by ``steps`` (default: a budget of ``LOKI_STOP_TIMEOUT_S``). The
        checkpoint is an optimisation (the stream rebuilds the counters): with NATS gone it is
        skipped with one line."""
        steps = steps or lifecycle.Steps(self.settings.stop_timeout_s, self.log)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=0.5)
        nc = broker_client(self.broker)
        connected = nc is not None and nc.is_connected
        if self._sub is not None and connected:
            await steps.run("stop the record consumer", self._sub.unsubscribe, 1.0)
        if self._kv is not None and self.totals.seq != self._saved_seq:
            if connected:
                await steps.run("write the metrics checkpoint", self._save_checkpoint, 2.0)
            else:
                self.log.info("metrics checkpoint not written: NATS is gone (the stream rebuilds)")
        if self._http is not None:
            server, thread = self._http
            await steps.run("close /metrics", asyncio.to_thread(_close_http, server, thread), 2.0)
            self._http = None
        await stop_broker(self.broker, steps)

    # --- records -------------------------------------------------------------------------------
    async def _on_record(self, msg) -> None:
        md = msg.metadata
        seq = md.sequence.stream
        if seq <= self._last_seen:
            return
        self._last_seen = seq
        try:
            e = decode(msg.data, seq, md.timestamp.timestamp() if md.timestamp else 0.0)
        except RecordDecodeError as exc:
            self.rejected += 1
            self.log.warning("%s", exc)
        else:
            try:
                self.ring.add(e)
                if seq > self.totals.seq:
                    self.totals.add(e)
            except Exception:  # one bad record is counted as rejected, never stops the ring
                self.rejected += 1
                self.log.exception("record %d could not be accounted", seq)
            else:
                if self.settings.perf_log and seq > self._target_seq:
                    # Live records only: a restart does not print the rebuilt ring again.
                    print(perf_line(e), file=sys.stderr, flush=True)
        if seq >= self._target_seq and not self.ready.is_set():
            self.ready.set()
            self.log.info("ring rebuilt: %d records up to seq %d", len(self.ring), seq)

    # --- checkpoint ----------------------------------------------------------------------------
    async def _load_checkpoint(self, last_seq: int) -> None:
        assert self._js is not None, "called after start() connected"
        try:
            self._kv = await self._js.create_key_value(
                config=KeyValueConfig(bucket=subjects.KV_PERF_TOTALS, history=1)
            )
            entry = await self._kv.get(CHECKPOINT_KEY)
        except nats.js.errors.KeyNotFoundError:
            return
        except (nats.errors.Error, OSError) as exc:
            self.log.warning("metrics checkpoint unavailable, counting from the ring: %s", exc)
            return
        try:
            stream_id, data = perf_checkpoint.decode(entry.value or b"")
            totals = Totals.load(data)
        except (ValueError, KeyError, TypeError) as exc:
            self.log.warning("metrics checkpoint unreadable, counting from the ring: %s", exc)
            return
        if stream_id != self._stream_id or totals.seq > last_seq:
            self.log.warning("metrics checkpoint is for another stream: counting from the ring")
            return
        self.totals = totals
        self._saved_seq = totals.seq

    async def _save_checkpoint(self) -> None:
        if self._kv is None or self.totals.seq == self._saved_seq:
            return
        seq = self.totals.seq
        await self._kv.put(
            CHECKPOINT_KEY, perf_checkpoint.encode(self._stream_id, self.totals.dump())
        )
        self._saved_seq = seq

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.perf_checkpoint_s)
            try:
                await self._save_checkpoint()
            except (nats.errors.Error, OSError) as exc:
                self.log.warning("metrics checkpoint not written: %s", exc)

    # --- /metrics ------------------------------------------------------------------------------
    def _ring_summary_threadsafe(self) -> dict[str, Any]:
        """The ring summary computed on the event loop (called from the scrape thread)."""

        async def compute() -> dict[str, Any]:
            return self.ring.summary()

        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(compute(), self._loop).result(timeout=5)

    def _bench_runs_threadsafe(self) -> list[dict[str, Any]]:
        """The newest benchmark runs, asked of the supervisor (``loki.engine.bench``
        ``latest``) on the event loop from the scrape thread; [] when it does not answer
        within :data:`BENCH_ASK_S`."""

        async def ask() -> list[dict[str, Any]]:
            nc = broker_client(self.broker)
            if nc is None or not nc.is_connected:
                return []
            msg = await nc.request(
                subjects.ENGINE_BENCH,
                BenchRequest(action="latest").model_dump_json().encode(),
                timeout=BENCH_ASK_S,
            )
            reply = BenchReply.model_validate_json(msg.data)
            return [r.model_dump(mode="json") for r in reply.runs]

        assert self._loop is not None
        try:
            return asyncio.run_coroutine_threadsafe(ask(), self._loop).result(
                timeout=BENCH_ASK_S + 1
            )
        except Exception:  # noqa: BLE001 - no supervisor, no benchmark gauges this scrape
            return []

    def _start_metrics(self) -> None:
        port = self.settings.perf_metrics_port
        if not port:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(
            PerfCollector(
                lambda: self.totals,
                self._ring_summary_threadsafe,
                lambda: self.rejected,
                self._bench_runs_threadsafe,
            )
        )
        try:
            self._http = start_http_server(port, self.settings.perf_metrics_host, registry)
        except OSError as exc:
            raise MetricsPortInUse(f"/metrics port {port}: {exc}") from exc
        self.metrics_port = self._http[0].server_port


def _close_http(server: Any, thread: Any) -> None:
    """Stop prometheus-client's ``/metrics`` server thread (blocking)."""
    server.shutdown()
    server.server_close()
    thread.join(timeout=2)
