"""The headline's recomputation arithmetic on hand-made request sequences."""

from __future__ import annotations

import pytest

from bench import _common
from bench.headline_bench import (
    Request,
    after_compaction,
    classify,
    held_tokens,
    new_tokens,
    recomputation,
    script_session,
)

SYS = list(range(100, 140))  # a 40-token system prompt


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_strictly_extending_conversation_is_new_only_by_its_additions() -> None:
    u1, a1, u2, a2, u3 = (
        _seq(1000, 30),
        _seq(2000, 12),
        _seq(3000, 50),
        _seq(4000, 9),
        _seq(5000, 20),
    )
    p1 = SYS + u1
    p2 = p1 + a1 + u2
    p3 = p2 + a2 + u3
    new = new_tokens([Request("main", p1, a1), Request("main", p2, a2), Request("main", p3)])
    assert new == [70, 50, 20]
    # an engine that kept its cache prefilled exactly that: ratio 1.0
    assert recomputation(new, new)["ratio"] == 1.0
    # an engine that lost it after the second request: the whole third prompt again
    figures = recomputation([70, 50, len(p3)], new)
    assert figures["prefilled"] == 70 + 50 + len(p3)
    assert figures["extra"] == len(p3) - 20
    assert figures["ratio"] == pytest.approx((70 + 50 + len(p3)) / 140)


def test_a_clock_line_changes_only_its_own_tokens_but_the_engine_recomputes_all() -> None:
    u1, a1, u2 = _seq(1000, 200), _seq(2000, 20), _seq(3000, 10)
    clock1, clock2 = [7, 7, 1], [7, 7, 2]
    p1 = SYS[:10] + clock1 + SYS[10:] + u1
    p2 = SYS[:10] + clock2 + SYS[10:] + u1 + a1 + u2
    new = new_tokens([Request("main", p1, a1), Request("main", p2)])
    assert new[1] == 1 + 10  # the changed clock token and the new user message
    prefilled = [len(p1), len(p2) - 12]  # cache reused up to the clock only
    assert prefilled[1] / new[1] > 20  # the second request alone
    assert recomputation(prefilled, new)["ratio"] == pytest.approx((243 + 261) / (243 + 11))


def test_side_jobs_are_their_own_conversations() -> None:
    u1, a1, u2 = _seq(1000, 60), _seq(2000, 10), _seq(3000, 15)
    side = _seq(9000, 25)
    p1 = SYS + u1
    p2 = p1 + a1 + u2
    new = new_tokens([Request("main", p1, a1), Request("v1", side), Request("main", p2)])
    assert new == [100, 25, 15]
    # one slot: the side job evicted the conversation, which is prefilled again whole
    figures = recomputation([100, 25, len(p2)], new)
    assert figures["extra"] == len(p2) - 15


def test_compaction_summary_is_new_and_its_tail_is_not() -> None:
    old = _seq(1000, 300)
    tail = _seq(5000, 60)
    a1 = _seq(6000, 10)
    p1 = SYS + old + tail
    summary_req = _seq(8000, 5) + old + tail  # a transcript of the same content
    summary_out = _seq(7000, 40)
    p2 = SYS + summary_out + tail + a1 + _seq(6500, 12)
    new = new_tokens(
        [
            Request("main", p1, a1),
            Request("compact", summary_req, summary_out, reference="main"),
            Request("main", p2),
        ]
    )
    assert new[0] == len(p1)
    assert new[1] == 5  # only the summary demand: the transcript was in the conversation
    # p2 against p1 ⊕ a1: the system prompt and the tail are held, a1 is held only where it
    # follows the tail; the summary text (40) and the new user message (12) are new.
    assert new[2] == 40 + 12


def test_a_new_conversation_shares_the_template_opening_with_the_request_before() -> None:
    main = [1, 2, 3] + _seq(1000, 50)
    side = [1, 2, 3] + _seq(9000, 20)
    assert new_tokens([Request("main", main), Request("v1", side)]) == [53, 20]


def test_a_full_hit_still_counts_one_token() -> None:
    p = SYS + _seq(1000, 10)
    assert new_tokens([Request("main", p), Request("main", p)]) == [50, 1]


def test_short_chance_matches_are_not_held() -> None:
    a = _seq(1, 50)
    b = [1, 2, 3] + _seq(500, 40) + [10, 11, 12, 13]
    assert held_tokens(b, a) == 0
    assert held_tokens(b, a, min_block=3) == 7


def test_recomputation_refuses_mismatched_or_empty_input() -> None:
    with pytest.raises(ValueError):
        recomputation([1, 2], [1])
    with pytest.raises(ValueError):
        recomputation([], [])


def test_classify_by_tag_and_summary_shape() -> None:
    def ex(body: dict) -> _common.Exchange:
        return _common.Exchange(0.0, "/v1/chat/completions", body)

    assert classify(ex({"messages": [{"role": "system", "content": "[side:v1] x"}]})) == "v1"
    assert classify(ex({"messages": [{"role": "system", "content": "[side:bench] x"}]})) == "bench"
    assert classify(ex({"messages": [], "tool_choice": "none", "stream": False})) == "compact"
    assert classify(ex({"messages": [{"role": "system", "content": "x"}]})) == "compact"
    assert classify(ex({"messages": [], "stream": True})) == "main"


def test_scripted_session_has_the_required_mix() -> None:
    turns = script_session(30)
    assert len(turns) == 30
    kinds = {t.kind for t in turns}
    assert kinds == {"short", "long", "paste", "tool"}
    assert any("v1" in t.side for t in turns) and any("bench" in t.side for t in turns)
    # no compaction request by default: the window forces them; the button on demand
    assert sum(t.compact for t in turns) == 0
    assert sum(t.compact for t in script_session(30, explicit_compaction=True)) == 1
    assert script_session(30) == turns  # deterministic
    with pytest.raises(ValueError):
        script_session(3)


def test_the_first_main_request_after_a_summary_is_labelled() -> None:
    kinds = ["main", "compact", "v1", "main", "main", "compact", "main"]
    assert after_compaction(kinds) == [
        "main",
        "compact",
        "v1",
        "main-after-compact",
        "main",
        "compact",
        "main-after-compact",
    ]
