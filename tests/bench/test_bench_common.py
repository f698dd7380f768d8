"""The harness's arithmetic: medians, spreads, percentiles, ratios, targets, tables."""

from __future__ import annotations

import json

import pytest

from bench import _common


def test_spread_of_odd_and_even_samples() -> None:
    s = _common.spread([5, 1, 3])
    assert (s["n"], s["median"], s["min"], s["max"]) == (3, 3, 1, 5)
    assert (s["q1"], s["q3"], s["iqr"]) == (2, 4, 2)
    s = _common.spread([4, 1, 3, 2])
    assert s["median"] == 2.5
    assert s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(3.25)
    assert s["iqr"] == pytest.approx(1.5)


def test_spread_of_one_sample_and_of_none() -> None:
    assert _common.spread([7])["iqr"] == 0 and _common.spread([7])["median"] == 7
    with pytest.raises(ValueError):
        _common.spread([])


def test_percentile_interpolates_between_order_statistics() -> None:
    values = list(range(1, 101))  # 1..100
    assert _common.percentile(values, 50) == pytest.approx(50.5)
    assert _common.percentile(values, 99) == pytest.approx(99.01)
    assert _common.percentile(values, 0) == 1 and _common.percentile(values, 100) == 100
    with pytest.raises(ValueError):
        _common.percentile(values, 101)
    with pytest.raises(ValueError):
        _common.percentile([], 50)


def test_ratio_refuses_a_zero_baseline() -> None:
    assert _common.ratio(3, 2) == 1.5
    with pytest.raises(ValueError):
        _common.ratio(1, 0)


def test_paired_ratios_are_taken_pair_by_pair() -> None:
    # pair-wise ratios 2, 1, 4 -> median 2 (the ratio of medians would be 3/2 = 1.5)
    out = _common.paired_ratios([2, 3, 4], [1, 3, 1])
    assert out["ratio"]["median"] == 2
    assert out["ratio"]["min"] == 1 and out["ratio"]["max"] == 4
    assert out["value"]["median"] == 3 and out["baseline"]["median"] == 1
    with pytest.raises(ValueError):
        _common.paired_ratios([1, 2], [1])


def test_interleaved_alternates_baseline_and_candidate() -> None:
    calls: list[str] = []
    out = _common.interleaved(
        lambda: calls.append("c"), lambda: calls.append("b"), times=3, warmup=1
    )
    assert calls == ["b", "c"] * 4
    assert out["ratio"]["n"] == 3


def test_target_comparisons() -> None:
    t = _common.target("ratio", 1.04, "<=", 1.05)
    assert t["met"] is True and t["target"] == "≤ 1.05"
    assert _common.target("ratio", 1.06, "<=", 1.05)["met"] is False
    assert _common.target("rate", 500, ">=", 500, "blocks/s")["target"] == "≥ 500 blocks/s"
    assert _common.target("x", None, "<", 1)["met"] is None
    with pytest.raises(ValueError):
        _common.target("x", 1, "==", 1)


def test_table_checks_row_width() -> None:
    assert _common.table("t", ["a", "b"], [[1, 2]])["rows"] == [[1, 2]]
    with pytest.raises(ValueError):
        _common.table("t", ["a", "b"], [[1]])


def test_write_result_is_sorted_json(tmp_path) -> None:
    path = _common.write_result("x", {"b": 1, "a": [1.5]}, tmp_path)
    assert path == tmp_path / "x.json"
    assert json.loads(path.read_text()) == {"a": [1.5], "b": 1}
    assert not list(tmp_path.glob("*.tmp"))


def test_machine_facts_and_commit() -> None:
    facts = _common.machine_facts()
    assert facts["cores"] >= 1 and facts["python"].count(".") == 2
    assert facts["ram_bytes"] is None or facts["ram_bytes"] > 0
    commit = _common.git_commit()
    assert commit["commit"] is None or len(commit["commit"]) == 40


def test_tree_rss_counts_children() -> None:
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", ("import time; b = bytearray(30_000_000); time.sleep(60)")]
    )
    try:
        import time

        deadline = time.monotonic() + 30
        while _common.rss_bytes(child.pid) < 30_000_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        import os

        assert child.pid in _common.process_tree(os.getpid())
        assert _common.rss_bytes(child.pid) >= 30_000_000
        assert _common.tree_rss_bytes(os.getpid()) >= (
            _common.rss_bytes(os.getpid()) + _common.rss_bytes(child.pid)
        )
    finally:
        child.kill()
        child.wait()
    assert _common.rss_bytes(child.pid) == 0


def test_pinned_binds_the_processes_started_inside_and_restores() -> None:
    import os
    import subprocess
    import sys

    before = os.sched_getaffinity(0)
    first = {min(before)}
    with _common.pinned(first):
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert out.strip() == str(sorted(first))
    assert os.sched_getaffinity(0) == before
    split = _common.split_cores()
    if len(before) >= 2:
        engine, other = split
        assert engine | other == before and not engine & other and len(other) == 1
    else:
        assert split is None
