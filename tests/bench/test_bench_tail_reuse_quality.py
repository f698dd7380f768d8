"""The tail-reuse quality bench's arithmetic (no engine): divergence, teacher forcing past the
first different token, per-position agreement and |Δ logprob|, the summary over conversations.
The real-engine run is ``python -m bench --only tail_reuse_quality``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import tail_reuse_quality_bench as q


def step(token: int, probs: dict[int, float]) -> q.Step:
    """A position whose distribution is ``probs`` (probabilities); greedy picks ``token``."""
    top = {t: math.log(p) for t, p in probs.items()}
    return q.Step(token, top[token], top)


def run(*steps: q.Step) -> q.Run:
    return q.Run(list(steps), {})


def test_first_divergence() -> None:
    assert q.first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert q.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert q.first_divergence([7], [8]) == 0


def test_compare_counts_every_position_and_the_reference_token() -> None:
    ref = run(step(1, {1: 0.9, 2: 0.1}), step(2, {2: 0.6, 3: 0.4}), step(4, {4: 0.5, 5: 0.5}))
    cand = [
        step(1, {1: 0.9, 2: 0.1}),  # same choice, same logprob
        step(3, {3: 0.7, 2: 0.3}),  # another choice: ref token 2 at log 0.3
        step(5, {5: 0.8, 6: 0.2}),  # ref token 4 outside the candidate's top: its last listed
    ]
    out = q.compare(ref, cand)
    assert out["positions"] == 3
    assert out["top1_agreement"] == pytest.approx(1 / 3)
    expected = [0.0, abs(math.log(0.3) - math.log(0.6)), abs(math.log(0.2) - math.log(0.5))]
    assert out["mean_abs_dlogprob"] == pytest.approx(sum(expected) / 3)
    assert out["max_abs_dlogprob"] == pytest.approx(max(expected))
    assert out["outside_top"] == 1
    tie = q.compare(run(step(1, {1: 0.5, 2: 0.5})), [step(2, {2: 0.5, 1: 0.5})])
    assert tie["top1_agreement"] == 1.0  # a tie of logprobs is agreement
    with pytest.raises(ValueError):
        q.compare(ref, cand[:2])  # a position missing is an error, never a shorter mean


def test_forced_reads_the_candidate_on_the_references_prefix(monkeypatch) -> None:
    ref = run(step(1, {1: 1.0}), step(2, {2: 1.0}), step(3, {3: 1.0}), step(4, {4: 1.0}))
    own = run(step(1, {1: 1.0}), step(9, {9: 0.6, 2: 0.4}), step(8, {8: 1.0}), step(7, {7: 1.0}))
    asked: list[list[int]] = []

    def fake_complete(http: Any, prompt: list[int], n: int, cache: bool) -> q.Run:
        assert n == 1 and cache  # one position, from the candidate's own cache
        asked.append(prompt)
        return run(step(50 + len(prompt), {50 + len(prompt): 1.0}))

    monkeypatch.setattr(q, "complete", fake_complete)
    steps = q.forced(None, [100, 101], ref, own)  # type: ignore[arg-type]
    # its own greedy steps up to and including the first different token, then forced
    assert [s.id for s in steps[:2]] == [1, 9]
    assert asked == [[100, 101, 1, 2], [100, 101, 1, 2, 3]]
    assert len(steps) == 4
    same = q.forced(None, [100], ref, ref)  # type: ignore[arg-type]
    assert same == ref.steps and len(asked) == 2  # nothing diverged: no request


def test_summarise_weights_positions_and_counts_identical() -> None:
    rows = [
        {"x": {"positions": 32, "top1_agreement": 1.0, "mean_abs_dlogprob": 0.0,
               "max_abs_dlogprob": 0.0, "outside_top": 0, "first_divergence": 32}},
        {"x": {"positions": 32, "top1_agreement": 0.5, "mean_abs_dlogprob": 0.2,
               "max_abs_dlogprob": 1.5, "outside_top": 2, "first_divergence": 4}},
    ]  # fmt: skip
    out = q.summarise(rows, "x")
    assert out["top1_agreement"] == pytest.approx(0.75)
    assert out["mean_abs_dlogprob"] == pytest.approx(0.1)
    assert out["max_abs_dlogprob"] == 1.5 and out["outside_top"] == 2
    assert out["identical"] == 1 and out["first_divergence_median"] == 18
    good = {**out, "top1_agreement": 0.999, "mean_abs_dlogprob": 0.001}
    text = q.meaning(good, out, good)
    assert "LOKI_COMPACT_TAIL_REUSE" in text and "adds nothing measurable" in text
    assert "1 of 2 replies" in text and "75.0% of positions" in text
    text = q.meaning(out, out, good)  # the shift far from its control
    assert "moves the model's next-token distribution" in text
