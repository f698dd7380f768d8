"""The headline long mode's windows (bench/headline_long_bench.py), pure arithmetic."""

from __future__ import annotations

from bench.headline_long_bench import windows


def test_requests_fall_in_the_window_of_the_turn_they_were_sent_in():
    turn_ts = [float(t) for t in range(0, 120)]  # turn i's user message at i s
    reqs = [
        {"ts": 0.5, "prompt_n": 10, "new": 10},  # turn 0
        {"ts": 49.9, "prompt_n": 30, "new": 20},  # turn 49: still the first window
        {"ts": 50.1, "prompt_n": 5, "new": 5},  # turn 50: the second
        {"ts": 119.5, "prompt_n": 8, "new": 4},  # turn 119: the third (partial)
        {"ts": -3.0, "prompt_n": 1, "new": 1},  # before the first turn: turn 0
    ]
    rows = windows(reqs, turn_ts, size=50)
    assert [r["turns"] for r in rows] == ["1–50", "51–100", "101–120"]
    assert [(r["requests"], r["prefilled"], r["new"]) for r in rows] == [
        (3, 41, 31),
        (1, 5, 5),
        (1, 8, 4),
    ]
    assert rows[0]["ratio"] == round(41 / 31, 4) and rows[2]["ratio"] == 2.0
