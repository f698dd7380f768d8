"""The PROJ_SNAPSHOT bench's session script: 30 turns, 8 page writes, 10 tracker values,
each a change the project block shows (so each one costs the key off a recomputation)."""

from __future__ import annotations

from bench.proj_snapshot_bench import PAGE_TURNS, TRACKER_TURNS, TURNS, change, initial_view
from loki_chat.project import diff, render


def test_the_session_has_30_turns_8_page_writes_and_10_tracker_values():
    assert TURNS == 30 and len(set(PAGE_TURNS)) == 8 and len(set(TRACKER_TURNS)) == 10
    view = initial_view()
    pages = trackers = 0
    for turn in range(1, TURNS + 1):
        new = change(view, turn)
        block = diff(view, new, "D")
        if turn in PAGE_TURNS:
            assert block is not None and "Memory index changes" in block
            pages += 1
        if turn in TRACKER_TURNS:
            assert block is not None and "Tracker values" in block
            trackers += 1
        if turn not in PAGE_TURNS and turn not in TRACKER_TURNS:
            assert block is None and render(new) == render(view)
        view = new
    assert (pages, trackers) == (8, 10)
