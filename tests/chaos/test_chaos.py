"""Issue 22, the chaos run as a test: one round of every fault against the whole stack under
load, on the scripted fake engine (tool-call turns), and nothing lost, nothing duplicated,
every turn ended.

The real engine's round (plain turns, llama-server killed too) and the five rounds of the
full run are the bench's (``python -m bench --only chaos``, figures in BENCHMARKS.md): this
test keeps the CI cost to about two minutes and asserts the invariants only, never a time.
The defects the run found have targeted tests of their own
(``tests/gateway/test_gateway_sse_nats_restart.py``, ``tests/engine/test_lease.py``)."""

from __future__ import annotations

import time

import pytest

from bench import chaos_bench as chaos

pytestmark = pytest.mark.engine


def test_one_round_of_each_fault_loses_and_duplicates_nothing() -> None:
    windows, _ = chaos.run_stack(
        "fake", rounds=1, deadline=time.monotonic() + 600, settle_s=1.0, log=print
    )
    faults = [w.fault for w in windows]
    assert faults == chaos.FAULTS[:-1], faults
    rows = chaos.summarise(windows)
    for row in rows:
        assert row["lost"] == 0, row
        assert row["unreadable"] == 0, row
        assert row["missing"] == 0, row
        assert row["duplicated"] == 0, row
        assert row["no_end"] == 0, (row["no_end"], row["error_samples"])
        assert row["recovered"] == row["rounds"], row
    assert sum(r["completed"] for r in rows) > 0, rows


def test_lost_messages_counts_what_a_later_state_no_longer_has() -> None:
    stored = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert chaos.lost_messages(stored, [*stored, {"role": "user", "content": "c"}]) == 0
    assert chaos.lost_messages(stored, stored[:1]) == 1
    assert chaos.lost_messages(stored, [{"role": "user", "content": "x"}, stored[1]]) == 2
    assert chaos._holes([1, 2, 3]) == 0
    assert chaos._holes([1, 4]) == 2
