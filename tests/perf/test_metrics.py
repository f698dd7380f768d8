"""Prometheus metrics (loki_perf.metrics) and the Grafana dashboard that queries them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from loki_perf.decode import CAUSES, decode
from loki_perf.metrics import PREFIX, PerfCollector, Totals, exported_names
from loki_perf.ring import Ring
from loki_shared.fingerprint import fingerprints

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/loki-prompt-cache.json"


def feed(ring: Ring, totals: Totals) -> None:
    """Records exercising every metric: drafts, a loss, a full hit, a cut stream, TTFT."""
    m1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    m2 = m1 + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    rows = [
        {
            "conversation": "a",
            "kind": "main",
            "fingerprints": fingerprints(m1),
            "ttft_ms": 90,
            "timings": {
                "cache_n": 0,
                "prompt_n": 100,
                "predicted_n": 20,
                "prompt_ms": 200,
                "predicted_ms": 400,
                "draft_n": 8,
                "draft_n_accepted": 5,
            },
        },
        {
            "conversation": "b",
            "kind": "subagent",
            "fingerprints": fingerprints(m1),
            "cut": True,
            "timings": {"cache_n": 0, "prompt_n": 50, "predicted_n": 2},
        },
        {
            "conversation": "a",
            "kind": "main",
            "fingerprints": fingerprints(m2),
            "ttft_ms": 300,
            "timings": {
                "cache_n": 0,
                "prompt_n": 140,
                "predicted_n": 3,
                "prompt_ms": 100,
                "predicted_ms": 60,
            },
        },
        {"conversation": "c", "kind": "bench", "timings": {"cache_n": 99, "prompt_n": 1}},
        {"conversation": "d", "kind": "foreign", "usage": {"prompt_tokens": 9}},
    ]
    for i, row in enumerate(rows, 1):
        e = ring.add(decode({"ts": float(i), "model": "smol", **row}, i, 0.0))
        totals.add(e)


def scrape(ring: Ring, totals: Totals) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PerfCollector(lambda: totals, ring.summary, lambda: 2))
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_every_metric_the_dashboard_queries_is_exported():
    ring, totals = Ring(), Totals()
    feed(ring, totals)
    # a record of a pooled engine (issue 44): the Engines row's series exist only with a pool
    pooled = {"conversation": "p", "kind": "main", "model": "smol", "engine": "e1"}
    moved = {**pooled, "moved_from": "e0", "transfer": "restored"}
    timings = {"timings": {"cache_n": 0, "prompt_n": 10, "predicted_n": 1}}
    totals.add(ring.add(decode({"ts": 6.0, **moved, **timings}, 6, 0.0)))
    samples = scrape(ring, totals)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    exprs.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    queried = {n for e in exprs for n in re.findall(r"\blokiassist_[a-zA-Z0-9_]+", e)}
    assert len(queried) >= 15
    missing = sorted(n for n in queried if n not in samples)
    assert not missing, f"dashboard queries metrics the service does not export: {missing}"
    assert queried <= exported_names()


def test_dashboard_covers_the_required_views():
    dashboard = json.loads(DASHBOARD.read_text())
    text = json.dumps(dashboard)
    for needle in (
        "lokiassist_prompt_tokens_cached_total",
        "lokiassist_prompt_tokens_computed_total",
        "by (cause)",
        "lokiassist_ttft_seconds_bucket",
        "by (depth)",
        "lokiassist_draft_tokens_accepted_total",
        "by (kind)",
        "lokiassist_ttft_median_seconds",
    ):
        assert needle in text, needle
    for panel in dashboard["panels"]:
        if panel["type"] == "row":  # a row only groups the panels below it (Engines)
            continue
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


def test_dashboard_shows_the_side_jobs_with_zero_when_they_never_ran():
    """Issue 19: the side jobs (``subagent``, ``verify``, ``task``) each have their series in
    the dashboard, and every query selecting one kind (or cause) by name falls back to 0
    (``or vector(0)``): a kind that never ran shows 0, not "no data" (the live Prometheus
    test asks every query for data)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    named = [e for e in exprs if re.search(r'(kind|cause)="', e)]
    for kind in ("subagent", "verify", "task"):
        assert any(f'kind="{kind}"' in e for e in named), kind
        assert any(f'cause="{kind}"' in e for e in named), kind
    assert named and all(e.rstrip().endswith("or vector(0)") for e in named), named


def test_names_cannot_collide_with_grafana_loki_and_labels_are_fixed():
    ring, totals = Ring(), Totals()
    feed(ring, totals)
    samples = scrape(ring, totals)
    assert all(name.startswith(PREFIX) for name in samples)
    assert not any(name.startswith("loki_") for name in exported_names())
    for name, rows in samples.items():
        for s in rows:
            labels = set(s.labels) - {"le"}
            assert labels <= {"kind", "model", "cause", "depth"}, (name, labels)
            assert "conversation" not in s.labels
    by = {
        (s.labels.get("kind"), s.labels.get("cause")): s.value
        for s in samples["lokiassist_cache_losses_total"]
        if s.value
    }
    assert by == {("main", "subagent"): 1.0}  # the sub-agent ran in between
    total = {s.labels["kind"]: s.value for s in samples["lokiassist_completions_total"]}
    assert total == {"main": 2, "subagent": 1, "bench": 1, "foreign": 1}
    full = {
        s.labels["kind"]: s.value for s in samples["lokiassist_prompt_full_hits_total"] if s.value
    }
    assert full == {"bench": 1}
    cached = {s.labels["kind"]: s.value for s in samples["lokiassist_prompt_tokens_cached_total"]}
    assert cached["bench"] == 100  # a full hit counts its whole prompt as reused
    ttft = {
        s.labels.get("le"): s.value
        for s in samples["lokiassist_ttft_seconds_bucket"]
        if s.labels["kind"] == "main"
    }
    assert ttft["0.1"] == 1 and ttft["0.5"] == 2 and ttft["+Inf"] == 2
    assert samples["lokiassist_perf_rejected_records"][0].value == 2


def test_unknown_figures_are_not_counted_as_zero():
    ring, totals = Ring(), Totals()
    feed(ring, totals)
    samples = scrape(ring, totals)
    unknown = {
        s.labels["kind"]: s.value
        for s in samples["lokiassist_completions_cache_unknown_total"]
        if s.value
    }
    assert unknown == {"foreign": 1}
    prompt = {s.labels["kind"] for s in samples["lokiassist_prompt_tokens_total"]}
    assert "foreign" not in prompt


def test_event_counters_start_at_zero_for_every_kind_seen():
    """Counters of events (cut streams, unknown figures, full hits, losses by cause) are
    exported as 0 before their first event, for every (kind, model) with completions — with
    cache figures for those that need them — so a dashboard shows 0, not "no data"."""
    ring, totals = Ring(), Totals()
    feed(ring, totals)
    samples = scrape(ring, totals)
    kinds = {"main", "subagent", "bench", "foreign"}

    def by_kind(name: str) -> dict[str, float]:
        return {s.labels["kind"]: s.value for s in samples[name]}

    assert by_kind("lokiassist_cut_streams_total") == {
        "main": 0,
        "subagent": 1,
        "bench": 0,
        "foreign": 0,
    }
    assert set(by_kind("lokiassist_completions_cache_unknown_total")) == kinds
    # Full hits and losses cannot be told without cache figures: no series for "foreign".
    assert by_kind("lokiassist_prompt_full_hits_total") == {"main": 0, "subagent": 0, "bench": 1}
    for name in ("lokiassist_cache_losses_total", "lokiassist_cache_lost_tokens_total"):
        rows = samples[name]
        assert {(s.labels["kind"], s.labels["cause"]) for s in rows} == {
            (k, c) for k in ("main", "subagent", "bench") for c in CAUSES
        }
    # Token counts keep no series where nothing was measured (drafts: one main completion).
    assert set(by_kind("lokiassist_draft_tokens_total")) == {"main"}
    assert "foreign" not in by_kind("lokiassist_prompt_tokens_total")


def test_checkpoint_round_trip_is_exact():
    ring, totals = Ring(), Totals()
    feed(ring, totals)
    again = Totals.from_bytes(totals.to_bytes())
    assert again.dump() == totals.dump() and again.seq == 5
    assert generate_latest(_reg(ring, again)) == generate_latest(_reg(ring, totals))


def _reg(ring, totals):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PerfCollector(lambda: totals, ring.summary))
    return registry


def test_model_label_values_are_bounded():
    """Issue 38 §6: external models have at most 16 labels of their own; the local engine's
    model keeps its own label however many came before it; a kind Loki does not know reads
    ``unknown``; a restart (checkpoint round trip) gives no name a slot it held before."""
    totals = Totals()
    seq = 0

    def add(**data):
        nonlocal seq
        seq += 1
        totals.add(decode({"ts": 1.0, **data}, seq, 0.0))

    for i in range(40):
        add(kind="foreign", model=f"squatter-{i}", preset="external")
        add(kind=f"client-kind-{i}", model="smol")
    add(kind="main", model="smol")
    add(kind="main", model="engine-2.gguf")  # another local preset's model: its own label too
    models = {k[1] for k in totals.counters["completions"]}
    assert models == {"smol", "engine-2.gguf", "other"} | {f"squatter-{i}" for i in range(16)}
    assert {k[0] for k in totals.counters["completions"]} == {"foreign", "unknown", "main"}
    # after a restart the 16 squatters hold no slot: a new external model gets its label,
    # the counters loaded keep theirs (nothing counted is lost)
    totals = Totals.load(totals.dump())
    add(kind="foreign", model="preset-api-model", preset="external")
    add(kind="main", model="smol")
    completions = totals.counters["completions"]
    assert completions[("foreign", "preset-api-model")] == 1
    assert completions[("main", "smol")] == 2 and completions[("foreign", "other")] == 24


def test_bench_runs_become_gauges() -> None:
    """The newest benchmark run of each preset, model and build: one gauge sample per point
    (median) and its spread; a point without a median is left out."""
    run = {
        "preset_id": "env",
        "model": "smol",
        "build": "b1-x",
        "points": [
            {"test": "pp", "depth": 0, "n": 64, "median": 500.0, "low": 480.0, "high": 530.0},
            {"test": "tg", "depth": 512, "n": 16, "median": 40.0, "low": 39.0, "high": 41.5},
            {"test": "tg", "depth": 1024, "n": 16, "median": None, "low": None, "high": None},
        ],
    }
    registry = CollectorRegistry(auto_describe=False)
    ring = Ring(capacity=10)
    registry.register(PerfCollector(lambda: Totals(), ring.summary, lambda: 0, lambda: [run]))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, s.labels.get("test"), s.labels.get("depth")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(PREFIX + "bench")
    }
    speed, spread = PREFIX + "bench_tokens_per_second", PREFIX + "bench_spread_tokens_per_second"
    assert samples == {
        (speed, "pp", "0"): 500.0,
        (speed, "tg", "512"): 40.0,
        (spread, "pp", "0"): 50.0,
        (spread, "tg", "512"): 2.5,
    }
    assert {speed, spread} <= exported_names()
    labels = next(
        s.labels
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == speed
    )
    assert labels == {"preset": "env", "model": "smol", "build": "b1-x", "test": "pp", "depth": "0"}
