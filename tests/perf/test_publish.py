"""Building a perf record (loki_shared.perf_publish.build_record) — no network."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from loki_shared.fingerprint import fingerprints
from loki_shared.perf_publish import CompletionClock, build_record


def test_record_carries_figures_fingerprints_and_roles_but_no_text():
    messages = [
        {"role": "system", "content": "SECRET-SYSTEM"},
        {"role": "user", "content": "SECRET-QUESTION"},
    ]
    final = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
        "timings": {"cache_n": 4, "prompt_n": "odd", "predicted_n": 7},
        "usage": {"prompt_tokens": 20, "completion_tokens": 7},
    }
    rec = build_record(
        kind="main",
        conversation="c",
        model="m",
        messages=messages,
        final=final,
        slot=0,
        cut=False,
        ts=12.5,
        ttft_ms=3.0,
        total_ms=9.0,
    )
    assert rec.fingerprints == fingerprints(messages) and rec.roles == ["system", "user"]
    assert rec.timings == final["timings"]  # passed through undecoded, even the odd value
    assert rec.usage == final["usage"] and rec.finish_reason == "length"
    assert (rec.ts, rec.slot, rec.ttft_ms, rec.total_ms) == (12.5, 0, 3.0, 9.0)
    assert "SECRET" not in rec.model_dump_json()


def test_clock_measures_first_delta_and_total():
    clock = CompletionClock()
    time.sleep(0.01)
    clock.delta()
    time.sleep(0.01)
    clock.delta()
    rec = build_record(kind="bench", messages=[], clock=clock)
    assert 5 <= rec.ttft_ms < rec.total_ms
    assert rec.timings is None and rec.usage is None  # unknown stays absent
    assert build_record(kind="bench", messages=[], clock=CompletionClock()).ttft_ms is None


def test_kind_must_be_a_request_kind():
    with pytest.raises(ValidationError):
        build_record(kind="chat", messages=[])
