"""Prometheus metrics derived from the records, restart-safe.

Every name starts with ``lokiassist_`` so it cannot collide with Grafana Loki's own ``loki_*``
metrics on a shared Prometheus. Counters and histograms carry the labels ``kind`` and ``model``
only (``cause`` is added on the two loss counters, from the fixed set
:data:`loki_perf.decode.CAUSES`). Every label value comes from a bounded set Loki controls:
``kind`` from :data:`loki_perf.decode.KINDS` (anything else reads ``unknown``), ``cause`` from
``CAUSES``, ``model`` from the lease's model (a local engine's always its own label; external
ones at most :data:`_MAX_MODELS`, then ``other``, counted afresh at each start); gauges
computed from the ring carry ``depth`` (fixed bucket names) or nothing.

Several engines (issue 44): the ``lokiassist_engine_*`` counters carry the label ``engine``
(the pooled engine's id, set by the supervisor from ``LOKI_ENGINE_URLS``; at most
:data:`_MAX_ENGINES` a process, then ``other``), with ``cause`` on the loss counters and
``transfer`` (``restored``, ``recomputed``, ``none``) on the moves; only records that name an
engine count there, so without a pool no such series exists and every other series is as
before.

Counters are *derived from the records*: :class:`Totals` is a pure function of a checkpoint
(totals up to stream sequence ``seq``, kept in a JetStream key-value bucket) plus the records
after ``seq`` in the stream. A perf service restarted loads the checkpoint, rebuilds its ring
from the whole stream and adds to the totals only the records after the checkpoint, so the
counters come back to exactly the values they had — nothing rebuilt is counted twice and
Prometheus sees no reset. (Records published while the service was down and already evicted
from the 5000-message stream before it came back cannot be counted; see docs/behaviour.md (perf).)

The registry is scraped from a thread (prometheus-client's HTTP server), so :class:`Totals`
guards its state with a lock.
"""

from __future__ import annotations

import json
import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .decode import CAUSES, Entry

PREFIX = "lokiassist_"
_MAX_MODELS = 16
_MAX_ENGINES = 32

#: name (without ``_total``) -> help. Labels: kind, model.
COUNTERS: dict[str, str] = {
    "completions": "Completions recorded (one per request to the engine).",
    "completions_cache_unknown": "Completions whose engine said nothing of its prompt cache.",
    "prompt_tokens": "Prompt tokens of completions with known cache figures (cache_n + prompt_n).",
    "prompt_tokens_cached": (
        "Prompt tokens reused from the prompt cache (cache_n; +1 on a full hit)."
    ),
    "prompt_tokens_computed": "Prompt tokens the engine prefilled (prompt_n; 0 on a full hit).",
    "prompt_full_hits": "Completions whose whole prompt was cached (cache_n = N-1, prompt_n = 1).",
    "generated_tokens": "Tokens generated (predicted_n, else usage.completion_tokens).",
    "draft_tokens": "Speculative draft tokens proposed (draft_n).",
    "draft_tokens_accepted": "Speculative draft tokens accepted (draft_n_accepted).",
    "cut_streams": "Completions whose stream was cut before the final chunk.",
}
#: Labels: kind, model, cause.
LOSS_COUNTERS: dict[str, str] = {
    "cache_losses": "Completions flagged with a prompt-cache loss or divergence, by cause.",
    "cache_lost_tokens": (
        "Prompt tokens the slot held and the next request did not reuse, by cause."
    ),
}
#: Counters of the pooled engines (issue 44): name -> (help, labels).
ENGINE_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "engine_completions": ("Completions run on each pooled engine.", ("engine",)),
    "engine_prompt_tokens": (
        "Prompt tokens of completions with known cache figures, by pooled engine.",
        ("engine",),
    ),
    "engine_prompt_tokens_cached": (
        "Prompt tokens reused from the prompt cache (+1 on a full hit), by pooled engine.",
        ("engine",),
    ),
    "engine_cache_losses": (
        "Completions flagged with a prompt-cache loss or divergence, by pooled engine and cause.",
        ("engine", "cause"),
    ),
    "engine_cache_lost_tokens": (
        "Prompt tokens the slot held and the next request did not reuse, by pooled engine and "
        "cause.",
        ("engine", "cause"),
    ),
    "engine_moves": (
        "Grants of a conversation to an engine other than the one holding its prefix, by the "
        "engine it went to and what was done to the slot (restored from a slot file, "
        "recomputed, none said).",
        ("engine", "transfer"),
    ),
}
#: The ``transfer`` label values of ``engine_moves`` (zero-filled for every engine).
MOVE_TRANSFERS = ("restored", "recomputed", "none")
#: name -> (help, bucket upper bounds). Labels: kind, model.
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft_seconds": (
        "Time from sending the request to the first delta of any type.",
        (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
    ),
    "prompt_tokens_per_second": (
        "Prompt processing speed (prompt_n / prompt_ms).",
        (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
    ),
    "generation_tokens_per_second": (
        "Generation speed (predicted_n / predicted_ms).",
        (1, 2.5, 5, 10, 20, 40, 80, 160, 320),
    ),
}
#: Event counters exported as 0 for every (kind, model) that has completions, before the first
#: event: Prometheus's advice for series known in advance, so a dashboard panel or a rate over
#: them shows 0 rather than "no data". The value: which completions the count is out of
#: ("all", or "known": those with cache figures, since a loss or a full hit cannot be told
#: without them). Loss counters get one series per cause of :data:`loki_perf.decode.CAUSES`.
ZERO_FILLED: dict[str, str] = {
    "completions_cache_unknown": "all",
    "cut_streams": "all",
    "prompt_full_hits": "known",
    "cache_losses": "known",
    "cache_lost_tokens": "known",
}
#: Gauges computed from the ring (not counters: they move both ways).
GAUGES: dict[str, str] = {
    "perf_ring_records": "Records in the perf ring.",
    "prompt_speed_median_tokens_per_second": "Median prompt speed over the ring by context depth.",
    "generation_speed_median_tokens_per_second": "Median generation speed over the ring by depth.",
    "ttft_median_seconds": "Median time to first token over the ring by context depth.",
    "cache_hit_ratio": "Prompt-cache hit ratio over the ring, by kind.",
    "engine_cache_hit_ratio": "Prompt-cache hit ratio over the ring, by pooled engine.",
    "cache_ram_advice_events": "CACHE_RAM advice events in the ring.",
    "perf_rejected_records": "Records refused since start (payload not a JSON object).",
    "bench_tokens_per_second": (
        "Median speed of the newest engine benchmark of each preset, model and build, by test "
        "(pp: prompt processing, tg: generation) and context depth."
    ),
    "bench_spread_tokens_per_second": (
        "Spread (max - min over the repetitions) of the same benchmark points."
    ),
}
#: Labels of the benchmark gauges.
BENCH_LABELS = ["preset", "model", "build", "test", "depth"]


def exported_names() -> set[str]:
    """Every sample name the service exports (``_total``, ``_bucket``/``_sum``/``_count``)."""
    names = {f"{PREFIX}{n}_total" for n in (*COUNTERS, *LOSS_COUNTERS, *ENGINE_COUNTERS)}
    for n in HISTOGRAMS:
        names |= {f"{PREFIX}{n}_bucket", f"{PREFIX}{n}_sum", f"{PREFIX}{n}_count"}
    names |= {f"{PREFIX}{n}" for n in GAUGES}
    return names


class Totals:
    """Cumulative counters and histograms, fed one decoded record at a time.

    ``seq`` is the stream sequence of the last record counted. The state round-trips through
    :meth:`dump` / :meth:`load` (JSON) for the checkpoint.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seq = 0
        self.counters: dict[str, dict[tuple[str, ...], float]] = {
            n: {} for n in (*COUNTERS, *LOSS_COUNTERS, *ENGINE_COUNTERS)
        }
        # name -> labels -> [bucket counts (non-cumulative, + overflow), sum]
        self.hists: dict[str, dict[tuple[str, ...], list[Any]]] = {n: {} for n in HISTOGRAMS}
        #: external models given a label of their own since this process started (at most
        #: :data:`_MAX_MODELS`; never restored from a checkpoint, so no name can hold a slot
        #: across a restart)
        self.models: set[str] = set()
        #: engines given a label of their own since this process started (at most
        #: :data:`_MAX_ENGINES`, then ``other``; a checkpoint's labels are kept as they are)
        self.engines: set[str] = set()

    def _model(self, e: Entry) -> str:
        """The ``model`` label of ``e``: a local engine's model always keeps its own (the
        lease's model, set by the supervisor from the preset; the engine's model can never be
        folded away); an external preset's model has one of :data:`_MAX_MODELS` slots, then
        ``other``. Records carry the lease's model, never a name a client or an upstream
        chose (:mod:`loki_gateway.routes.v1.exchange`)."""
        if not e.external:
            return e.model
        if e.model in self.models:
            return e.model
        if len(self.models) >= _MAX_MODELS:
            return "other"
        self.models.add(e.model)
        return e.model

    def _engine(self, e: Entry) -> str:
        """The ``engine`` label of ``e`` (non-empty ``e.engine``): its id, one of
        :data:`_MAX_ENGINES` slots a process, then ``other``."""
        if e.engine in self.engines:
            return e.engine
        if len(self.engines) >= _MAX_ENGINES:
            return "other"
        self.engines.add(e.engine)
        return e.engine

    def _add_engine(self, e: Entry) -> None:
        """Count ``e`` in the ``engine_*`` counters (it names an engine)."""
        eng = (self._engine(e),)
        self._inc("engine_completions", eng)
        if e.depth is not None and e.eff_cached is not None and e.cached is not None:
            self._inc("engine_prompt_tokens", eng, e.depth)
            self._inc("engine_prompt_tokens_cached", eng, e.eff_cached)
        if e.loss is not None:
            self._inc("engine_cache_losses", (*eng, e.loss.cause))
            self._inc("engine_cache_lost_tokens", (*eng, e.loss.cause), e.loss.tokens or 0)
        if e.moved_from is not None:
            self._inc("engine_moves", (*eng, e.transfer or "none"))

    def _inc(self, name: str, labels: tuple[str, ...], value: float = 1) -> None:
        d = self.counters[name]
        d[labels] = d.get(labels, 0) + value

    def _observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        bounds = HISTOGRAMS[name][1]
        d = self.hists[name]
        h = d.get(labels)
        if h is None:
            h = d[labels] = [[0] * (len(bounds) + 1), 0.0]
        i = bisect_left(bounds, value)  # first bucket with value <= le (len: +Inf)
        h[0][i] += 1
        h[1] += value

    def add(self, e: Entry) -> None:
        """Count ``e`` (its stream sequence becomes :attr:`seq`)."""
        with self.lock:
            self.seq = e.seq
            lab = (e.kind, self._model(e))
            self._inc("completions", lab)
            if e.cached is None or e.computed is None:
                self._inc("completions_cache_unknown", lab)
            else:
                # set whenever cached and computed are
                assert e.depth is not None and e.eff_cached is not None
                assert e.recomputed is not None
                self._inc("prompt_tokens", lab, e.depth)
                self._inc("prompt_tokens_cached", lab, e.eff_cached)
                self._inc("prompt_tokens_computed", lab, e.recomputed)
                if e.full_hit:
                    self._inc("prompt_full_hits", lab)
            if e.generated is not None:
                self._inc("generated_tokens", lab, e.generated)
            if e.draft_n is not None:
                self._inc("draft_tokens", lab, e.draft_n)
            if e.draft_n_accepted is not None:
                self._inc("draft_tokens_accepted", lab, e.draft_n_accepted)
            if e.cut is not False:
                self._inc("cut_streams", lab)
            if e.loss is not None:
                lab3 = (*lab, e.loss.cause)
                self._inc("cache_losses", lab3)
                self._inc("cache_lost_tokens", lab3, e.loss.tokens or 0)
            if e.engine:
                self._add_engine(e)
            if e.ttft_ms is not None:
                self._observe("ttft_seconds", lab, e.ttft_ms / 1000.0)
            if e.pp_tps is not None:
                self._observe("prompt_tokens_per_second", lab, e.pp_tps)
            if e.tg_tps is not None:
                self._observe("generation_tokens_per_second", lab, e.tg_tps)

    def dump(self) -> dict[str, Any]:
        """JSON-able state (for the checkpoint)."""
        with self.lock:
            return {
                "v": 1,
                "seq": self.seq,
                "counters": {n: [[*k, v] for k, v in d.items()] for n, d in self.counters.items()},
                "hists": {
                    n: [[*k, list(h[0]), h[1]] for k, h in d.items()] for n, d in self.hists.items()
                },
            }

    @classmethod
    def load(cls, data: dict[str, Any]) -> Totals:
        """Rebuild from :meth:`dump`'s output.

        Raises:
            ValueError: the data is not a version-1 dump.
        """
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("not a version-1 totals dump")
        t = cls()
        t.seq = int(data["seq"])
        for n, rows in data.get("counters", {}).items():
            if n in t.counters:
                if n in ENGINE_COUNTERS:
                    width = len(ENGINE_COUNTERS[n][1])
                else:
                    width = 3 if n in LOSS_COUNTERS else 2
                for row in rows:
                    t.counters[n][tuple(row[:width])] = float(row[width])
        for n, rows in data.get("hists", {}).items():
            if n in t.hists:
                size = len(HISTOGRAMS[n][1]) + 1
                for row in rows:
                    counts = [int(c) for c in row[2]]
                    if len(counts) != size:
                        raise ValueError(f"histogram {n} has {len(counts)} buckets, not {size}")
                    t.hists[n][(row[0], row[1])] = [counts, float(row[3])]
        return t

    def to_bytes(self) -> bytes:
        return json.dumps(self.dump(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Totals:
        return cls.load(json.loads(raw))


def _zero_fill(counters: dict[str, dict[tuple[str, ...], float]]) -> None:
    """Add the 0 series of :data:`ZERO_FILLED` to a copy of the counters (in place)."""
    out_of = {"all": set(counters["completions"]), "known": set(counters["prompt_tokens"])}
    for name, base in ZERO_FILLED.items():
        d = counters[name]
        for lab in out_of[base]:
            if name in LOSS_COUNTERS:
                for cause in CAUSES:
                    d.setdefault((*lab, cause), 0.0)
            else:
                d.setdefault(lab, 0.0)
    # the pooled engines: each cause and each transfer at 0 once an engine has completions
    for (engine,) in counters["engine_completions"]:
        for name in ("engine_cache_losses", "engine_cache_lost_tokens"):
            for cause in CAUSES:
                counters[name].setdefault((engine, cause), 0.0)
        for transfer in MOVE_TRANSFERS:
            counters["engine_moves"].setdefault((engine, transfer), 0.0)


def _le(b: float) -> str:
    return "+Inf" if math.isinf(b) else repr(float(b))


class PerfCollector(Collector):
    """prometheus-client collector reading :class:`Totals` and a ring summary.

    Args:
        totals_ref: callable returning the current :class:`Totals`.
        ring_summary: callable returning :meth:`loki_perf.ring.Ring.summary`'s dict; the
            service makes it run on its event loop (the scrape runs in another thread).
        rejected: callable returning the count of refused payloads.
        bench_runs: callable returning the newest benchmark run of each preset, model and
            build (``BenchRun`` dumps: the supervisor's ``loki.engine.bench`` ``latest``);
            an empty list when unknown.
    """

    def __init__(self, totals_ref, ring_summary, rejected=lambda: 0, bench_runs=list) -> None:
        self._totals_ref = totals_ref
        self._ring_summary = ring_summary
        self._rejected = rejected
        self._bench_runs = bench_runs

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        totals: Totals = self._totals_ref()
        with totals.lock:
            counters = {n: dict(d) for n, d in totals.counters.items()}
            hists = {
                n: {k: (list(h[0]), h[1]) for k, h in d.items()} for n, d in totals.hists.items()
            }
        _zero_fill(counters)
        for n, help_ in COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + n, help_, labels=["kind", "model"])
            for lab, v in sorted(counters[n].items()):
                fam.add_metric(list(lab), v)
            yield fam
        for n, help_ in LOSS_COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + n, help_, labels=["kind", "model", "cause"])
            for lab, v in sorted(counters[n].items()):
                fam.add_metric(list(lab), v)
            yield fam
        for n, (help_, labels) in ENGINE_COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + n, help_, labels=list(labels))
            for lab, v in sorted(counters[n].items()):
                fam.add_metric(list(lab), v)
            yield fam
        for n, (help_, bounds) in HISTOGRAMS.items():
            hist = HistogramMetricFamily(PREFIX + n, help_, labels=["kind", "model"])
            for lab, (counts, total) in sorted(hists[n].items()):
                cum, buckets = 0, []
                for b, c in zip((*bounds, math.inf), counts):
                    cum += c
                    buckets.append((_le(b), cum))
                hist.add_metric(list(lab), buckets, total)
            yield hist
        summary = self._ring_summary()["detail"]
        yield GaugeMetricFamily(
            PREFIX + "perf_ring_records", GAUGES["perf_ring_records"], value=summary["ring"]
        )
        pp = GaugeMetricFamily(
            PREFIX + "prompt_speed_median_tokens_per_second",
            GAUGES["prompt_speed_median_tokens_per_second"],
            labels=["depth"],
        )
        tg = GaugeMetricFamily(
            PREFIX + "generation_speed_median_tokens_per_second",
            GAUGES["generation_speed_median_tokens_per_second"],
            labels=["depth"],
        )
        for row in summary["speeds_by_depth"]:
            if row["prompt_tps_median"] is not None:
                pp.add_metric([row["depth"]], row["prompt_tps_median"])
            if row["gen_tps_median"] is not None:
                tg.add_metric([row["depth"]], row["gen_tps_median"])
        ttft = GaugeMetricFamily(
            PREFIX + "ttft_median_seconds", GAUGES["ttft_median_seconds"], labels=["depth"]
        )
        for row in summary["speeds_by_depth"]:
            if row["ttft_ms_median"] is not None:
                ttft.add_metric([row["depth"]], row["ttft_ms_median"] / 1000.0)
        yield pp
        yield tg
        yield ttft
        hit = GaugeMetricFamily(
            PREFIX + "cache_hit_ratio", GAUGES["cache_hit_ratio"], labels=["kind"]
        )
        for kind, row in sorted(summary["by_kind"].items()):
            if row["hit_rate"] is not None:
                hit.add_metric([kind], row["hit_rate"])
        yield hit
        engine_hit = GaugeMetricFamily(
            PREFIX + "engine_cache_hit_ratio", GAUGES["engine_cache_hit_ratio"], labels=["engine"]
        )
        for engine, row in sorted(summary.get("by_engine", {}).items())[:_MAX_ENGINES]:
            if row["hit_rate"] is not None:
                engine_hit.add_metric([engine], row["hit_rate"])
        yield engine_hit
        yield GaugeMetricFamily(
            PREFIX + "cache_ram_advice_events",
            GAUGES["cache_ram_advice_events"],
            value=summary["cache_ram"]["count"],
        )
        yield GaugeMetricFamily(
            PREFIX + "perf_rejected_records",
            GAUGES["perf_rejected_records"],
            value=self._rejected(),
        )
        yield from bench_families(self._bench_runs())


def bench_families(runs: list[dict[str, Any]]) -> Iterator[Metric]:
    """The benchmark gauges of ``runs`` (``BenchRun`` dumps): one sample per point."""
    speed = GaugeMetricFamily(
        PREFIX + "bench_tokens_per_second", GAUGES["bench_tokens_per_second"], labels=BENCH_LABELS
    )
    spread = GaugeMetricFamily(
        PREFIX + "bench_spread_tokens_per_second",
        GAUGES["bench_spread_tokens_per_second"],
        labels=BENCH_LABELS,
    )
    for run in runs:
        for p in run.get("points", []):
            if p.get("median") is None:
                continue
            labels = [
                str(run.get("preset_id", "")),
                str(run.get("model", "")),
                str(run.get("build", "")),
                str(p["test"]),
                str(p["depth"]),
            ]
            speed.add_metric(labels, float(p["median"]))
            if p.get("low") is not None and p.get("high") is not None:
                spread.add_metric(labels, float(p["high"]) - float(p["low"]))
    yield speed
    yield spread
