"""The headline's recomputation arithmetic on hand-made request sequences."""

from __future__ import annotations

import pytest

from bench import _common
from bench.headline_bench import (
    Request,
    after_compaction,
    classify,
    compaction_paths,
    exact_floor,
    exact_prefill,
    held_tokens,
    loki_configs,
    new_tokens,
    prewarm_on,
    recomputation,
    recomputed_share,
    script_session,
    summary_retries,
    ttft_after_compaction,
    turn_timeline,
)
from loki_chat.compaction.summary_client import RETRY_SAMPLING

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
    assert classify(ex({"messages": [], "stream": True, "max_tokens": 24})) == "main"
    assert classify(ex({"messages": [], "stream": True, "max_tokens": 1})) == "prewarm"


def test_summary_retries_are_the_compact_requests_with_the_retry_sampling() -> None:
    def ex(body: dict) -> _common.Exchange:
        return _common.Exchange(0.0, "/v1/chat/completions", body)

    first = {"messages": [{"role": "system", "content": "x"}], "temperature": 0.2}
    again = {**first, **RETRY_SAMPLING}
    turn = {"messages": [], "stream": True, "repeat_penalty": RETRY_SAMPLING["repeat_penalty"]}
    assert summary_retries([ex(first), ex(again), ex(first), ex(turn)]) == 1
    assert summary_retries([ex(first)]) == 0


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


def _compaction_session(tail_first: bool) -> tuple[list[Request], int, int]:
    """A conversation compacted once by a continuation summary, then one more turn: the
    requests, the summary's and the tail's lengths."""
    old, tail, a1 = _seq(1000, 300), _seq(5000, 60), _seq(6000, 10)
    demand, summary, user = _seq(8000, 5), _seq(7000, 40), _seq(6500, 12)
    p1 = SYS + old + tail
    cont = p1 + a1 + demand  # the continuation summary request
    after = SYS + (tail + summary if tail_first else summary + tail) + user
    reqs = [
        Request("main", p1, a1),
        Request("compact", cont, summary, reference="main"),
        Request("main", after),
    ]
    return reqs, len(summary), len(tail)


def test_exact_floor_counts_the_tail_behind_a_new_summary() -> None:
    reqs, n_summary, n_tail = _compaction_session(tail_first=False)
    new = new_tokens(reqs)
    exact = exact_prefill(reqs)
    assert new == [400, 5, n_summary + 12]
    # an exact-attention cache holds only the system prompt before the new summary: the
    # tail (not new) is recomputed; the continuation demand extends the conversation
    assert exact == [400, 5, n_summary + n_tail + 12]
    floor = exact_floor(new, exact)
    assert floor["forced"] == n_tail
    assert floor["per_request"] == [0, 0, n_tail]
    assert floor["floor"] == pytest.approx((sum(new) + n_tail) / sum(new))
    # an engine at that floor is within 0 of it; one that loses the cache is above
    assert recomputation(exact, new)["ratio"] == pytest.approx(floor["floor"])


def test_exact_floor_of_tail_first_counts_the_moved_tail_too() -> None:
    reqs, n_summary, n_tail = _compaction_session(tail_first=True)
    new, exact = new_tokens(reqs), exact_prefill(reqs)
    # the tail moved right after the system prompt: its text is held but its place
    # changed, so exact attention recomputes it; only KV shifting (--cache-reuse) avoids it
    assert exact[2] == n_tail + n_summary + 12
    assert exact_floor(new, exact)["forced"] == n_tail


def test_exact_floor_of_a_cache_keeping_conversation_is_one() -> None:
    u1, a1, u2 = _seq(1000, 30), _seq(2000, 12), _seq(3000, 50)
    reqs = [Request("main", SYS + u1, a1), Request("main", SYS + u1 + a1 + u2)]
    assert exact_prefill(reqs) == new_tokens(reqs) == [70, 50]
    assert exact_floor([70, 50], [70, 50])["floor"] == 1.0
    # the ideal cache keeps every earlier request: a side job in between costs nothing more
    side = Request("v1", _seq(9000, 25))
    assert exact_prefill([reqs[0], side, reqs[1]]) == [70, 25, 50]
    with pytest.raises(ValueError):
        exact_floor([1], [1, 2])
    with pytest.raises(ValueError):
        exact_floor([], [])


def test_a_clock_line_floor_is_the_whole_suffix() -> None:
    u1, a1, u2 = _seq(1000, 200), _seq(2000, 20), _seq(3000, 10)
    p1 = SYS[:10] + [7, 7, 1] + SYS[10:] + u1
    p2 = SYS[:10] + [7, 7, 2] + SYS[10:] + u1 + a1 + u2
    reqs = [Request("main", p1, a1), Request("main", p2)]
    assert exact_prefill(reqs)[1] == len(p2) - 12  # everything after the clock's change
    assert new_tokens(reqs)[1] == 11


def _ev(seq: int, ts: float, delta: dict | None = None, **extra: object) -> dict:
    return {"seq": seq, "ts": ts, "choices": [{"index": 0, "delta": delta or {}}], **extra}


def _user(seq: int, ts: float) -> dict:
    return _ev(seq, ts, {"role": "user", "content": "hi"}, loki={"event": "user"})


def _end(seq: int, ts: float, cache_n: int = 0, prompt_n: int = 0) -> dict:
    timings = {"cache_n": cache_n, "prompt_n": prompt_n}
    return _ev(seq, ts, timings=timings, loki={"event": "turn_end"})


def _mark(seq: int, ts: float, trigger: str, path: str = "continuation") -> dict:
    return _ev(seq, ts, loki={"event": "compaction", "trigger": trigger, "path": path})


def test_turn_timeline_times_the_first_token_and_places_compactions() -> None:
    text = {"role": "assistant", "content": "ok"}
    events = [
        _user(1, 100.0),
        _ev(2, 100.2, {"role": "assistant"}),  # a role-only delta is no token
        _ev(3, 100.5, text),
        _end(4, 101.0, 10, 50),
        _user(5, 110.0),
        _ev(6, 110.4, {"content": "a"}),
        _mark(7, 111.0, "end"),  # after this turn's first token: the next turn's
        _end(8, 111.5),
        _user(9, 120.0),
        _ev(10, 121.0, {"reasoning_content": "r"}),
        _end(11, 121.5),
        _user(12, 130.0),
        _mark(13, 131.0, "start"),  # before this turn's first token: its own
        _ev(14, 133.0, {"tool_calls": [{"index": 0}]}),
        _end(15, 134.0),
        _user(16, 140.0),
        _mark(17, 140.1, "start", path="refused"),
        _ev(18, 140.6, {"content": "b"}),
    ]
    turns = turn_timeline(events)
    assert [t.ttft_s for t in turns] == pytest.approx([0.5, 0.4, 1.0, 3.0, 0.6])
    assert [[c["trigger"] for c in t.compactions] for t in turns] == [
        [],
        [],
        ["end"],
        ["start"],
        ["start"],
    ]
    assert turns[0].timings == {"cache_n": 10, "prompt_n": 50}
    figures = ttft_after_compaction(turns)
    # ordinary: turns 2 and 5 (the first is cold; a refused compaction is none)
    assert figures["ordinary_n"] == 2
    assert figures["ordinary_median_s"] == pytest.approx(0.5)
    assert [a["turn"] for a in figures["after"]] == [3, 4]
    assert [a["ratio"] for a in figures["after"]] == pytest.approx([2.0, 6.0])
    assert figures["worst_ratio"] == pytest.approx(6.0)
    assert figures["median_ratio"] == pytest.approx(4.0)
    assert compaction_paths(turns) == {"continuation": 2, "refused": 1}
    # the turn-start compaction ran inside turn 4: 2 s of its TTFT came after the summary
    assert [a["after_summary_s"] for a in figures["after"]] == pytest.approx([None, 2.0])
    assert figures["after"][1]["after_summary_ratio"] == pytest.approx(4.0)


def test_ttft_without_ordinary_turns_has_no_ratio() -> None:
    turns = turn_timeline([_user(1, 0.0), _mark(2, 0.1, "start"), _ev(3, 1.0, {"content": "x"})])
    figures = ttft_after_compaction(turns)
    assert figures["ordinary_median_s"] is None
    assert figures["after"][0]["ratio"] is None and figures["worst_ratio"] is None


def test_recomputed_share_of_a_completion() -> None:
    assert recomputed_share({"cache_n": 1900, "prompt_n": 100}) == pytest.approx(0.05)
    assert recomputed_share({"prompt_n": 40}) == 1.0
    assert recomputed_share(None) is None
    assert recomputed_share({"cache_n": 3}) is None


def test_prewarm_is_on_by_default_and_off_only_for_the_reference() -> None:
    assert prewarm_on({}) is True  # the chat service's default
    assert prewarm_on({"LOKI_PREWARM": "false"}) is False
    assert prewarm_on({"LOKI_PREWARM": "true"}) is True
    configs = {c.name: c for c in loki_configs(quick=False)}
    assert not prewarm_on(configs["loki-best"].keys)
    assert prewarm_on(configs["loki-reuse"].keys) and prewarm_on(configs["loki-default"].keys)


def test_ttft_after_compaction_against_ordinary_turns_of_the_same_kind() -> None:
    # turns: short 0.2 (cold first), paste 1.5, short 0.3, paste 1.3, [compaction] paste 1.4,
    # short 0.4: all ordinary turns' median 0.85, the pastes' 1.4
    events, seq = [], 0
    times = [0.2, 1.5, 0.3, 1.3, 1.4, 0.4]
    for i, ttft in enumerate(times):
        t0 = 100.0 * (i + 1)
        events.append(_user(seq := seq + 1, t0))
        if i == 4:
            events.append(_mark(seq := seq + 1, t0 + 0.01, "start"))
        events.append(_ev(seq := seq + 1, t0 + ttft, {"content": "x"}))
    kinds = ["short", "paste", "short", "paste", "paste", "short"]
    figures = ttft_after_compaction(turn_timeline(events), kinds)
    [after] = figures["after"]
    assert after["kind"] == "paste" and after["same_kind_n"] == 2
    assert after["same_kind_median_s"] == pytest.approx(1.4)
    assert after["same_kind_ratio"] == pytest.approx(1.0)
    assert after["ratio"] == pytest.approx(1.4 / 0.85)
    assert figures["worst_same_kind_ratio"] == pytest.approx(1.0)
    # without the kinds: no same-kind figure
    assert ttft_after_compaction(turn_timeline(events))["worst_same_kind_ratio"] is None
