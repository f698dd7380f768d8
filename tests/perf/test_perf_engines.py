"""Issue 44 in the perf service: the records of several engines (``engine``, ``moved_from``,
``transfer``). A loss on a moved conversation is caused by ``engine_moved``; a restore that
held is no loss; the summary's ``by_engine`` (hit rate, losses by cause, moves in,
restores); the ``lokiassist_engine_*`` metrics; and the service over real NATS."""

from __future__ import annotations

import json

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from loki_perf.decode import CAUSES, ENGINE_MOVED_CAUSE, decode
from loki_perf.metrics import MOVE_TRANSFERS, PREFIX, PerfCollector, Totals, exported_names
from loki_perf.ring import Ring
from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import Placement
from loki_shared.perf_publish import publish_record

from .perf_helpers import PerfProc, record, request, wait_summary


def msgs(*contents: str) -> list[dict]:
    out = [{"role": "system", "content": "sys"}]
    for i, c in enumerate(contents):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": c})
    return out


class Feed:
    """Decoded records into a ring (and the metric totals), with increasing sequences."""

    def __init__(self, ring: Ring | None = None) -> None:
        self.ring = ring if ring is not None else Ring(loss_min_tokens=8)
        self.totals = Totals()
        self.seq = 0

    def add(self, messages, *, cache_n, prompt_n, predicted_n=10, conversation="a", **extra):
        self.seq += 1
        data = {
            "ts": float(self.seq),
            "conversation": conversation,
            "kind": extra.pop("kind", "main"),
            "model": "m",
            "slot": extra.pop("slot", 0),
            "timings": {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": predicted_n},
            "fingerprints": fingerprints(messages),
            "roles": [m["role"] for m in messages],
            **extra,
        }
        e = self.ring.add(decode(data, self.seq, 0.0))
        self.totals.add(e)
        return e


# --- the ring ---------------------------------------------------------------------------------
def test_a_move_that_recomputes_is_a_loss_caused_by_engine_moved():
    """The conversation's previous record ran on engine a; this one on b (``moved_from`` a,
    recomputed): the loss is ``engine_moved``, even though another conversation ran on b in
    between and the tools changed (the move is named first)."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a", tools_fingerprint="t1")
    f.add(msgs("other"), cache_n=0, prompt_n=50, conversation="b", engine="b")
    e = f.add(
        msgs("q1", "a1", "q2"),
        cache_n=4,
        prompt_n=130,
        engine="b",
        moved_from="a",
        transfer="recomputed",
        tools_fingerprint="t2",
    )
    assert e.loss is not None and e.loss.type == "loss"
    assert e.loss.cause == ENGINE_MOVED_CAUSE and e.loss.tokens == 120 - 4
    (view,) = f.ring.losses()
    assert (view["engine"], view["moved_from"], view["transfer"]) == ("b", "a", "recomputed")


def test_a_restore_that_held_is_no_loss_and_one_that_did_not_is():
    """``transfer`` restored with ``cache_n`` covering the previous total: no loss (the slot
    file brought the prefix); restored yet ``cache_n`` 0: a loss caused by ``engine_moved``,
    counted in ``restores_lost``."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    held = f.add(
        msgs("q1", "a1", "q2"),
        cache_n=119,
        prompt_n=15,
        engine="b",
        moved_from="a",
        transfer="restored",
    )
    assert held.loss is None
    lost = f.add(
        msgs("q1", "a1", "q2", "a2", "q3"),
        cache_n=0,
        prompt_n=160,
        engine="a",
        moved_from="b",
        transfer="restored",
    )
    assert lost.loss is not None and lost.loss.cause == ENGINE_MOVED_CAUSE
    by_engine = f.ring.summary()["detail"]["by_engine"]
    assert by_engine["b"]["restores"] == 1 and by_engine["b"]["restores_lost"] == 0
    assert by_engine["a"]["restores"] == 1 and by_engine["a"]["restores_lost"] == 1


def test_another_engine_than_the_previous_records_is_a_move_without_moved_from():
    """A record whose engine differs from the conversation's previous one (both known) was
    moved even when it does not say ``moved_from`` (a grant that did not know): its loss is
    ``engine_moved``; the previous record is looked up on any engine."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=130, engine="b")
    assert e.loss is not None and e.loss.cause == ENGINE_MOVED_CAUSE


def test_what_ran_in_between_counts_only_the_same_engine():
    """Another conversation on slot 0 of another engine did not evict this one's slot 0:
    a loss on the same engine names nothing in between (``none``), not ``conversation``."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    f.add(msgs("other"), cache_n=0, prompt_n=50, conversation="b", engine="b")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=130, engine="a")
    assert e.loss is not None and e.loss.cause == "none" and e.loss.between == []
    # without engines (one engine), the same records name the other conversation
    g = Feed()
    g.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20)
    g.add(msgs("other"), cache_n=0, prompt_n=50, conversation="b")
    e = g.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=130)
    assert e.loss is not None and e.loss.cause == "conversation"


def test_by_engine_hit_rates_moves_and_restores_and_eviction():
    """``by_engine``: per engine, the hit rate over its records, its losses by cause, moves
    in and restores; top-level ``moves`` and ``restores``; a record evicted from the ring
    leaves the figures; records without an engine are in no ``by_engine`` entry."""
    f = Feed(Ring(capacity=4, loss_min_tokens=8))
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    f.add(msgs("x"), cache_n=30, prompt_n=10, conversation="c")  # no engine: no pool
    f.add(
        msgs("q1", "a1", "q2"),
        cache_n=119,
        prompt_n=15,
        engine="b",
        moved_from="a",
        transfer="restored",
    )
    f.add(msgs("y"), cache_n=0, prompt_n=40, conversation="d", engine="b", kind="verify")
    detail = f.ring.summary()["detail"]
    a, b = detail["by_engine"]["a"], detail["by_engine"]["b"]
    assert set(detail["by_engine"]) == {"a", "b"}
    assert a["completions"] == 1 and a["hit_rate"] == 0.0 and a["moves_in"] == 0
    assert b["completions"] == 2 and b["moves_in"] == 1 and b["restores"] == 1
    assert b["hit_rate"] == 119 / (134 + 40) and b["losses"] == 0
    assert detail["moves"] == 1 and detail["restores"] == 1
    # two more records evict a's only record and c's (capacity 4)
    f.add(msgs("z"), cache_n=0, prompt_n=10, conversation="e", engine="b", kind="verify")
    f.add(msgs("w"), cache_n=0, prompt_n=10, conversation="g", engine="b", kind="verify")
    detail = f.ring.summary()["detail"]
    assert set(detail["by_engine"]) == {"b"} and detail["by_engine"]["b"]["completions"] == 4


def test_losses_by_engine_are_listed_by_cause():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=130, engine="b", moved_from="a")
    f.add(msgs("p1"), cache_n=0, prompt_n=100, predicted_n=20, conversation="b", engine="b")
    f.add(msgs("o"), cache_n=0, prompt_n=100, conversation="c", engine="b")
    f.add(msgs("p1", "r1", "p2"), cache_n=0, prompt_n=130, conversation="b", engine="b")
    by_cause = f.ring.summary()["detail"]["by_engine"]["b"]["losses_by_cause"]
    assert by_cause == {
        ENGINE_MOVED_CAUSE: {"count": 1, "tokens": 120},
        "conversation": {"count": 1, "tokens": 120},
    }


def test_a_record_without_engine_fields_decodes_as_before():
    """Records of today (no pool) decode with ``engine`` "" and no move; wrong types are
    dropped alone."""
    e = decode({"ts": 1.0, "kind": "main"}, 1, 0.0)
    assert (e.engine, e.moved_from, e.transfer, e.dropped) == ("", None, None, [])
    e = decode({"ts": 1.0, "kind": "main", "engine": 3, "transfer": "teleported"}, 2, 0.0)
    assert e.engine == "" and e.transfer is None
    assert set(e.dropped) == {"engine", "transfer"}


# --- the metrics ------------------------------------------------------------------------------
def scrape(f: Feed) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PerfCollector(lambda: f.totals, f.ring.summary))
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def moved_feed() -> Feed:
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20, engine="a")
    f.add(
        msgs("q1", "a1", "q2"), cache_n=0, prompt_n=130, engine="b", moved_from="a", transfer=None
    )
    f.add(
        msgs("q1", "a1", "q2", "a2", "q3"),
        cache_n=150,
        prompt_n=20,
        engine="a",
        moved_from="b",
        transfer="restored",
    )
    return f


def test_engine_metrics_carry_the_engine_label():
    f = moved_feed()
    samples = scrape(f)

    def values(name: str) -> dict[tuple, float]:
        return {
            tuple(v for k, v in sorted(s.labels.items())): s.value for s in samples[PREFIX + name]
        }

    assert values("engine_completions_total") == {("a",): 2, ("b",): 1}
    assert values("engine_prompt_tokens_total") == {("a",): 270, ("b",): 130}
    assert values("engine_prompt_tokens_cached_total") == {("a",): 150, ("b",): 0}
    moves = values("engine_moves_total")
    assert {k: v for k, v in moves.items() if v} == {("a", "restored"): 1, ("b", "none"): 1}
    assert set(moves) == {(e, t) for e in "ab" for t in MOVE_TRANSFERS}  # zero-filled
    losses = values("engine_cache_losses_total")
    assert {k: v for k, v in losses.items() if v} == {("engine_moved", "b"): 1}
    assert set(losses) == {(c, e) for e in "ab" for c in CAUSES}
    lost = values("engine_cache_lost_tokens_total")
    assert lost[("engine_moved", "b")] == 120
    hit = values("engine_cache_hit_ratio")
    assert hit == {("a",): 150 / 270, ("b",): 0.0}
    # the series of today: the same loss, by kind, model and cause
    by_cause = {
        s.labels["cause"]: s.value for s in samples[PREFIX + "cache_losses_total"] if s.value
    }
    assert by_cause == {"engine_moved": 1}
    for name in samples:
        assert name in exported_names() or name.removesuffix("_created") in exported_names()


def test_without_a_pool_no_engine_series_exists():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20)
    samples = scrape(f)
    assert not [n for n in samples if n.startswith(PREFIX + "engine_")]


def test_engine_counters_survive_the_checkpoint_and_labels_are_bounded():
    f = moved_feed()
    again = Totals.from_bytes(f.totals.to_bytes())
    assert again.dump() == f.totals.dump()
    assert again.counters["engine_moves"][("a", "restored")] == 1
    totals = Totals()
    for i in range(40):
        totals.add(decode({"ts": 1.0, "kind": "main", "engine": f"e{i}"}, i + 1, 0.0))
    engines = {k[0] for k in totals.counters["engine_completions"]}
    assert len(engines) == 33 and "other" in engines
    assert totals.counters["engine_completions"][("other",)] == 8


# --- the service over real NATS ---------------------------------------------------------------
async def test_the_service_attributes_moves_and_exports_them(perf_nats, nc, tmp_path):
    """Records as the chat builds them from a pooled lease's placement
    (:func:`loki_shared.perf_publish.build_record`): the summary's ``by_engine``, the
    losses list and ``/metrics`` name the engines, the move and the restore."""
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        at_a = Placement(engine="a", id_slot=0, reason="new")
        moved = Placement(engine="b", id_slot=1, reason="failover", moved_from="a")
        back = Placement(
            engine="a", id_slot=0, reason="affine", moved_from="b", transfer="restored"
        )
        assert await publish_record(nc, record("x", 1, cache_n=0, prompt_n=100, placement=at_a))
        assert await publish_record(nc, record("x", 2, cache_n=0, prompt_n=140, placement=moved))
        assert await publish_record(nc, record("x", 3, cache_n=160, prompt_n=20, placement=back))
        summary = await wait_summary(nc, 3)
        detail = summary["detail"]
        assert detail["moves"] == 2 and detail["restores"] == 1
        assert detail["by_engine"]["b"]["losses_by_cause"] == {
            ENGINE_MOVED_CAUSE: {"count": 1, "tokens": 110}
        }
        assert detail["by_engine"]["a"]["restores_lost"] == 0
        assert detail["losses_by_cause"] == {ENGINE_MOVED_CAUSE: {"count": 1, "tokens": 110}}
        losses = (await request(nc, subjects.PERF_LOSSES, {"limit": 5}))["losses"]
        assert [(x["engine"], x["moved_from"], x["cause"]) for x in losses] == [
            ("b", "a", ENGINE_MOVED_CAUSE)
        ]
        m = svc.scrape()
        key = PREFIX + "engine_moves_total"
        assert m[key + json.dumps({"engine": "a", "transfer": "restored"})] == 1
        assert m[key + json.dumps({"engine": "b", "transfer": "none"})] == 1
        lost = PREFIX + "engine_cache_lost_tokens_total"
        assert m[lost + json.dumps({"cause": ENGINE_MOVED_CAUSE, "engine": "b"})] == 110
        assert m[PREFIX + "engine_completions_total"] == 3
    finally:
        svc.stop()


# --- the dashboard ----------------------------------------------------------------------------
def test_the_dashboard_has_an_engines_row_with_every_engine_view():
    """A row "Engines": hit rate per engine, losses per engine by cause, moves and restores;
    every query of it answers 0 without a pool (``or on() vector(0)`` / ``or vector(0)``:
    the live Prometheus test asks each query for data on one engine)."""
    from pathlib import Path

    board = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/loki-prompt-cache.json"
    panels = json.loads(board.read_text())["panels"]
    (row,) = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Engines"]
    below = panels[row + 1 :]
    exprs = [t["expr"] for p in below for t in p["targets"]]
    text = "\n".join(exprs)
    for needle in (
        "lokiassist_engine_prompt_tokens_cached_total",
        "lokiassist_engine_cache_hit_ratio",
        "by (engine, cause) (increase(lokiassist_engine_cache_losses_total",
        'lokiassist_engine_moves_total{transfer="restored"}',
        'cause="engine_moved"',
    ):
        assert needle in text, needle
    assert all(e.rstrip().endswith("vector(0)") for e in exprs), exprs
    assert all(p["gridPos"]["y"] > panels[row]["gridPos"]["y"] for p in below)
