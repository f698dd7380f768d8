"""Tolerant decoding of perf records (loki_perf.decode)."""

from __future__ import annotations

import json

import pytest

from loki_perf.decode import DEPTH_NAMES, RecordDecodeError, decode


def rec(**kw):
    base = {"ts": 1000.0, "conversation": "c1", "kind": "main", "model": "m"}
    base.update(kw)
    return json.dumps(base).encode()


LLAMA_TIMINGS = {
    "cache_n": 300,
    "prompt_n": 20,
    "predicted_n": 40,
    "draft_n": 10,
    "draft_n_accepted": 7,
    "prompt_ms": 100.0,
    "predicted_ms": 800.0,
}


def test_llama_final_chunk_figures_are_read():
    e = decode(
        rec(
            timings=LLAMA_TIMINGS,
            usage={
                "prompt_tokens": 320,
                "completion_tokens": 40,
                "prompt_tokens_details": {"cached_tokens": 300},
            },
        ),
        1,
        0.0,
    )
    assert (e.cache_n, e.prompt_n, e.predicted_n) == (300, 20, 40)
    assert (e.draft_n, e.draft_n_accepted) == (10, 7)
    assert (e.prompt_tokens, e.completion_tokens, e.cached_tokens) == (320, 40, 300)
    assert e.depth == 320 and e.total == 360
    assert e.pp_tps == pytest.approx(200.0) and e.tg_tps == pytest.approx(50.0)
    assert DEPTH_NAMES[e.bucket] == "1k"
    assert not e.full_hit and e.recomputed == 20 and e.eff_cached == 300
    assert e.dropped == []


def test_absent_figures_stay_unknown_not_zero():
    e = decode(rec(), 1, 0.0)
    assert e.cache_n is None and e.prompt_n is None and e.cached is None
    assert e.computed is None and e.depth is None and e.total is None
    assert e.generated is None and e.pp_tps is None and e.recomputed is None


def test_prompt_size_without_cache_figures_keeps_prefill_count_only():
    # The engine said nothing of its cache: only "prefill N tok" can be shown.
    e = decode(rec(usage={"prompt_tokens": 50, "completion_tokens": 3}), 1, 0.0)
    assert e.cached is None and e.computed is None and e.depth == 50 and e.generated == 3


def test_wrong_type_counter_is_dropped_alone():
    t = dict(LLAMA_TIMINGS, cache_n="300", draft_n=True, prompt_ms=-5, predicted_ms=float("nan"))
    e = decode(rec(timings=t), 7, 0.0)
    assert e.cache_n is None and e.draft_n is None and e.prompt_ms is None
    assert e.predicted_ms is None
    assert e.prompt_n == 20 and e.predicted_n == 40 and e.draft_n_accepted == 7
    assert set(e.dropped) == {
        "timings.cache_n",
        "timings.draft_n",
        "timings.prompt_ms",
        "timings.predicted_ms",
    }
    assert e.conversation == "c1" and e.kind == "main"


def test_wrong_type_containers_and_fields_do_not_cost_the_record():
    e = decode(
        rec(
            timings=[1, 2],
            usage="x",
            slot="0",
            fingerprints=[1, 2],
            cut="yes",
            ttft_ms="fast",
            kind="weird",
            roles=["user", 3],
        ),
        3,
        42.0,
    )
    assert e.seq == 3 and e.conversation == "c1"
    assert e.kind == "unknown" and e.slot is None and e.fingerprints is None
    assert e.cut is None  # unknown: treated as cut by the loss rules
    assert e.roles == ["user", None]
    assert {"timings", "usage", "slot", "fingerprints", "cut", "ttft_ms", "kind"} <= set(e.dropped)


def test_integral_float_counts_accepted_fractional_dropped():
    e = decode(rec(timings={"cache_n": 12.0, "prompt_n": 3.5}), 1, 0.0)
    assert e.cache_n == 12 and e.prompt_n is None and "timings.prompt_n" in e.dropped


def test_full_hit_reads_n_minus_one_cached_and_one_computed():
    # llama.cpp re-evaluates the last prompt token of a fully cached prompt.
    e = decode(rec(timings={"cache_n": 499, "prompt_n": 1, "predicted_n": 5}), 1, 0.0)
    assert e.full_hit
    assert e.eff_cached == 500 and e.recomputed == 0 and e.depth == 500


def test_usage_fills_what_timings_lacks_external_api():
    e = decode(
        rec(
            preset="external",
            usage={
                "prompt_tokens": 1000,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 896},
            },
        ),
        1,
        0.0,
    )
    assert e.external and e.cached == 896 and e.computed == 104 and e.generated == 9


def test_missing_ts_uses_fallback_and_non_object_is_refused():
    e = decode(json.dumps({"kind": "bench"}).encode(), 5, 123.5)
    assert e.ts == 123.5 and e.conversation is None
    with pytest.raises(RecordDecodeError):
        decode(b"[1,2]", 1, 0.0)
    with pytest.raises(RecordDecodeError):
        decode(b"not json", 1, 0.0)


def test_depth_buckets_go_up_to_128k():
    assert DEPTH_NAMES[-2] == "128k"
    e = decode(rec(timings={"cache_n": 131071, "prompt_n": 1}), 1, 0.0)
    assert DEPTH_NAMES[e.bucket] == "128k"
    e = decode(rec(timings={"cache_n": 131072, "prompt_n": 10}), 1, 0.0)
    assert DEPTH_NAMES[e.bucket] == "over_128k"
