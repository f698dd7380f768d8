"""The engines bench's harness (bench/engines_bench.py, issue 44): its arithmetic, and a
small session through the real supervisor and real llama-servers (2 conversations × 2
turns), so the full run is known to drive what it measures."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import engines_bench as eb
from loki_shared import servers

TINY = eb.Plan(convs=2, turns=2, side_every=2, words=30, max_tokens=4)


def _row(conv: int, turn: int, kind: str = "main", **kw: object) -> eb.Row:
    row = eb.Row(conv, turn, kind)
    for key, value in kw.items():
        setattr(row, key, value)
    return row


def test_recompute_ratio_sums_tokens_not_requests() -> None:
    rows = [
        _row(0, 0, prompt_n=100, cache_n=0),
        _row(0, 1, prompt_n=20, cache_n=180),
        _row(1, 0, prompt_n=None, cache_n=None),  # no timings: left out
    ]
    assert eb.recompute_ratio(rows) == round(120 / 300, 4)
    assert eb.recompute_ratio([]) is None


def test_summary_separates_side_work_and_counts_placements() -> None:
    rows = [
        _row(0, 0, prompt_n=100, cache_n=0, engine="e1", reason="new", prompt_ms=10.0),
        _row(0, 1, prompt_n=20, cache_n=100, engine="e1", reason="affine", prompt_ms=2.0),
        _row(0, 1, "task", prompt_n=50, cache_n=0, engine="e2", reason="apart"),
        _row(1, 0, prompt_n=90, cache_n=10, engine="e2", reason="new", prompt_ms=9.0),
        _row(
            1, 1, prompt_n=110, cache_n=0, engine="e1", reason="overloaded", moved_from="e2",
            transfer="recomputed", prompt_ms=11.0,
        ),
        _row(1, 1, "task", error="LeaseError: busy"),
    ]  # fmt: skip
    s = eb.summarize(rows)
    assert s["main_turns"] == 4 and s["side_requests"] == 1 and s["failed"] == 1
    assert s["main_prompt_n"] == 320 and s["main_cache_n"] == 110
    assert s["main_ratio"] == round(320 / 430, 4)
    assert s["side_ratio"] == 1.0
    assert s["reasons"] == {"new": 2, "affine": 1, "apart": 1, "overloaded": 1}
    assert s["moves"] == 1 and s["transfers"] == {"recomputed": 1}
    assert s["main_per_engine"] == {"e1": 3, "e2": 1}
    assert s["side_apart"] == 1  # the task of conversation 0 ran beside e1
    assert s["prompt_ms_median"] == 9.5
    assert s["errors"] == ["LeaseError: busy"]


def test_user_messages_are_deterministic_and_distinct() -> None:
    assert eb.user_text(3, 5, 40) == eb.user_text(3, 5, 40)
    assert eb.user_text(3, 5, 40) != eb.user_text(3, 6, 40)
    assert eb.side_text(0, 2, 40) != eb.user_text(0, 2, 40)


def test_report_says_not_run_instead_of_figures() -> None:
    parts = {
        "baseline": eb.not_run("no engine"),
        "affine": eb.not_run("pool mode absent"),
    }
    doc = eb.report(TINY, parts, [], 1.0, None)
    session, move, kill = doc["tables"]
    assert session["rows"][1][1] == "not run: pool mode absent"
    assert move["rows"][0][1].startswith("not run")
    assert kill["rows"][0][0].startswith("not run")
    assert all(t["value"] is None and t["met"] is None for t in doc["targets"])


@pytest.fixture
def run_root() -> Iterator[tuple[eb.Infra, Path]]:
    try:
        servers.find_llama_server()
        servers.find_bundled_model()
    except servers.ServerNotFound as exc:
        pytest.fail(f"the real engine is needed: {exc}")
    with tempfile.TemporaryDirectory(prefix="loki-engines-test-") as tmp:
        with eb.infra(Path(tmp)) as ifr:
            yield ifr, ifr.slot_dir


def test_session_through_one_followed_engine(run_root: tuple[eb.Infra, Path]) -> None:
    """The driver end to end without a pool: every request leased, completed with the
    engine's timings, released; the second turn of each conversation reuses its prompt."""
    ifr, slot_dir = run_root
    engine = eb.start_engine("e0", 3, slot_dir, eb.engine_flags())
    try:
        out = eb.run_session(
            ifr, "legacy", {"LOKI_ENGINE_URL": engine.url}, [engine], TINY, pool=False
        )
    finally:
        engine.stop()
    rows = out["rows"]
    main = [r for r in rows if r["kind"] == "main"]
    side = [r for r in rows if r["kind"] == "task"]
    assert len(main) == 4 and len(side) == 2  # a side task after turn 1 of each
    assert all(r["error"] is None and r["prompt_n"] is not None for r in rows)
    assert all(r["engine"] is None for r in rows)  # no pool: Lease.placement is None
    for conv in (0, 1):
        first, second = (r for r in main if r["conv"] == conv)
        assert second["cache_n"] >= first["prompt_n"] // 2, (first, second)
    s = out["summary"]
    assert s["failed"] == 0 and 0 < s["main_ratio"] < 1


def test_session_through_a_pool_of_two_engines(run_root: tuple[eb.Infra, Path]) -> None:
    """The driver through pool mode (``LOKI_ENGINE_URLS``, affine): every grant names its
    engine and slot; a conversation's second turn goes back to its slot and reuses its
    prompt; a side task runs on the other engine; the two conversations start apart."""
    ifr, slot_dir = run_root
    pair = [eb.start_engine(f"e{i + 1}", 2, slot_dir, eb.engine_flags()) for i in range(2)]
    try:
        out = eb.run_session(
            ifr, "pool", eb.pool_env(pair, "affine", slot_dir), pair, TINY, pool=True
        )
    finally:
        for e in pair:
            e.stop()
    rows = out["rows"]
    assert all(r["error"] is None for r in rows), rows
    assert all(r["engine"] in ("e1", "e2") and r["id_slot"] is not None for r in rows)
    main = [r for r in rows if r["kind"] == "main"]
    assert {r["engine"] for r in main if r["turn"] == 0} == {"e1", "e2"}  # least loaded
    for conv in (0, 1):
        first, second = (r for r in main if r["conv"] == conv)
        assert first["reason"] == "new" and second["reason"] == "affine"
        assert (second["engine"], second["id_slot"]) == (first["engine"], first["id_slot"])
        assert second["cache_n"] >= first["prompt_n"] // 2, (first, second)
        task = next(r for r in rows if r["kind"] == "task" and r["conv"] == conv)
        assert task["reason"] == "apart" and task["engine"] != second["engine"]
    assert out["routing"] == "affine"
    assert sorted(e["id"] for e in out["engines"]) == ["e1", "e2"]
