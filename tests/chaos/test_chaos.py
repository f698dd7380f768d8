"""Issue 22, the chaos run as a test: one round of every fault against the whole stack under
load — the real engine (plain turns, llama-server killed too) and the scripted fake engine
(tool-call turns) — and nothing lost, nothing duplicated.

The figures of the longer run are in BENCHMARKS.md (``python -m bench --only chaos``); this
test asserts the invariants only, never a time."""

from __future__ import annotations

import time

import pytest

from bench import chaos_bench as chaos

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("engine", ["real", "fake"])
def test_one_round_of_each_fault_loses_and_duplicates_nothing(engine: str) -> None:
    windows, _ = chaos.run_stack(
        engine, rounds=1, deadline=time.monotonic() + 1800, settle_s=2.0, log=print
    )
    faults = [w.fault for w in windows]
    expected = chaos.FAULTS if engine == "real" else chaos.FAULTS[:-1]
    assert faults == expected, faults
    rows = chaos.summarise(windows)
    for row in rows:
        assert row["lost"] == 0, row
        assert row["missing"] == 0, row
        assert row["duplicated"] == 0, row
        assert row["no_end"] == 0, row
        assert row["recovered"] == row["rounds"], row
    assert sum(r["completed"] for r in rows) > 0, rows


def test_lost_messages_counts_what_a_later_state_no_longer_has() -> None:
    stored = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert chaos.lost_messages(stored, [*stored, {"role": "user", "content": "c"}]) == 0
    assert chaos.lost_messages(stored, stored[:1]) == 1
    assert chaos.lost_messages(stored, [{"role": "user", "content": "x"}, stored[1]]) == 2
    assert chaos._holes([1, 2, 3]) == 0
    assert chaos._holes([1, 4]) == 2
