"""Loss rules, summary and CACHE_RAM advice of the ring (loki_perf.ring)."""

from __future__ import annotations

import random
import statistics

from loki_perf.decode import decode
from loki_perf.ring import Ring
from loki_shared.fingerprint import fingerprints


def msgs(*contents, system="sys"):
    out = [{"role": "system", "content": system}]
    for i, c in enumerate(contents):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": c})
    return out


class Feed:
    """Feeds decoded records into a ring with increasing sequence numbers."""

    def __init__(self, ring=None):
        self.ring = ring if ring is not None else Ring(loss_min_tokens=8)
        self.seq = 0

    def add(
        self, messages, *, cache_n, prompt_n, predicted_n=10, conversation="a", kind="main", **extra
    ):
        self.seq += 1
        data = {
            "ts": float(self.seq),
            "conversation": conversation,
            "kind": kind,
            "model": "m",
            "timings": {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": predicted_n},
            "fingerprints": fingerprints(messages),
            "roles": [m["role"] for m in messages],
            **extra,
        }
        return self.ring.add(decode(data, self.seq, 0.0))


def test_strict_extension_fully_reused_is_no_loss():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=119, prompt_n=15)
    assert e.loss is None and e.loss_tokens == 1  # the last generated token is never cached


def test_loss_is_previous_total_minus_cache_n_and_names_peer_conversation():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=20)
    f.add(msgs("other"), cache_n=5, prompt_n=50, conversation="b")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=5, prompt_n=130)
    assert e.loss is not None and e.loss.type == "loss"
    assert e.loss.tokens == 120 - 5 and e.loss.prev_total == 120
    assert e.loss.cause == "conversation"
    (view,) = f.ring.losses()
    assert view["between"] == [
        {"kind": "main", "cause": "conversation", "conversation": "b", "count": 1}
    ]


def test_cause_is_the_last_request_in_between_and_all_are_named():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100)
    f.add(msgs("x"), cache_n=0, prompt_n=30, conversation=None, kind="bench")
    f.add(msgs("x"), cache_n=0, prompt_n=30, conversation="a", kind="subagent")
    f.add(msgs("x"), cache_n=0, prompt_n=30, conversation="a", kind="subagent")
    f.add(msgs("y"), cache_n=0, prompt_n=30, conversation="v1client", kind="foreign")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=150)
    assert e.loss.cause == "foreign"
    assert [(b["kind"], b["count"]) for b in f.ring.losses(1)[0]["between"]] == [
        ("bench", 1),
        ("subagent", 2),
        ("foreign", 1),
    ]


def test_summary_in_between_is_named_summary():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100)
    f.add(msgs("sum"), cache_n=0, prompt_n=100, kind="compact")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=3, prompt_n=150)
    assert e.loss.cause == "summary"


def test_loss_with_nothing_in_between_has_cause_none():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=40, prompt_n=100)
    assert e.loss.cause == "none" and e.loss.between == []


def test_small_shortfall_up_to_threshold_is_not_a_loss():
    f = Feed(Ring(loss_min_tokens=8))
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=10)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=102, prompt_n=30)
    assert e.loss is None and e.loss_tokens == 8


def test_only_same_conversation_and_kind_are_compared():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, kind="main")
    # A verify request of the same conversation is not compared with the main request.
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=200, kind="verify")
    assert e.loss is None
    e2 = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=200, conversation="z")
    assert e2.loss is None  # first completion of conversation z


def test_never_after_a_cut_stream():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, cut=True)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=150)
    assert e.loss is None and e.loss_tokens is None


def test_unknown_cut_is_treated_as_cut():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, cut="maybe")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=150)
    assert e.loss is None


def test_external_preset_is_kept_but_never_flagged():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, preset="external")
    f.add(msgs("o"), cache_n=0, prompt_n=100, conversation="b", preset="external")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=150, preset="external")
    assert e.loss is None
    assert f.ring.summary()["completions"] == 3


def test_divergence_gives_first_differing_index_and_role():
    f = Feed()
    f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=100)
    # A volatile line slipped into the system prompt: message 0 differs.
    e = f.add(msgs("q1", "a1", "q2", "a2", "q3", system="sys at 12:01"), cache_n=2, prompt_n=200)
    assert e.loss.type == "divergence" and e.loss.cause == "divergence"
    assert (e.loss.index, e.loss.role) == (0, "system")
    f2 = Feed()
    f2.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=100)
    e = f2.add(msgs("q1", "a1 edited", "q2", "a2", "q3"), cache_n=40, prompt_n=100)
    assert (e.loss.index, e.loss.role) == (2, "assistant")


def test_truncated_prompt_is_a_divergence_without_role_and_identical_is_nothing():
    f = Feed()
    f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=100)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=99, prompt_n=1)  # same messages resent
    assert e.loss is None
    e = f.add(msgs("q1"), cache_n=30, prompt_n=1)
    assert e.loss.type == "divergence" and e.loss.index == 2 and e.loss.role is None


def test_full_hit_counts_as_full_reuse_in_loss_and_hit_rate():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, predicted_n=0)
    e = f.add(msgs("q1", "x"), cache_n=99, prompt_n=1, predicted_n=5)
    assert e.full_hit and e.loss_tokens == 0
    s = f.ring.summary()
    assert s["detail"]["full_hits"] == 1
    assert s["detail"]["by_kind"]["main"]["recomputed"] == 100  # the first prompt only
    assert s["detail"]["hit_rate"] == 100 / 200


def test_other_slot_is_not_named_in_between():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, slot=0)
    f.add(msgs("s"), cache_n=0, prompt_n=100, kind="subagent", slot=1)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=0, prompt_n=200, slot=0)
    assert e.loss.cause == "none"


def test_cache_ram_advice_when_conversation_comes_back_under_half_cached():
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=1000)
    f.add(msgs("t"), cache_n=0, prompt_n=800, kind="task", conversation="a")
    e = f.add(
        msgs("q1", "a1", "q2"),
        cache_n=400,
        prompt_n=700,
        usage={"prompt_tokens": 1100, "prompt_tokens_details": {"cached_tokens": 400}},
    )
    assert e.advice is not None and e.advice["cached_tokens"] == 400
    assert e.advice["prompt_tokens"] == 1100
    adv = f.ring.advice()
    assert adv["advise"] and adv["count"] == 1
    assert f.ring.advice(since_seq=e.seq)["advise"] is False
    # Nothing in between: a low cache is not a CACHE_RAM matter.
    g = Feed()
    g.add(msgs("q1"), cache_n=0, prompt_n=1000)
    e = g.add(msgs("q1", "a1", "q2"), cache_n=10, prompt_n=1100)
    assert e.advice is None
    # Over half cached after a side job: no advice.
    h = Feed()
    h.add(msgs("q1"), cache_n=0, prompt_n=1000)
    h.add(msgs("t"), cache_n=0, prompt_n=800, kind="task", conversation="a")
    e = h.add(msgs("q1", "a1", "q2"), cache_n=900, prompt_n=200)
    assert e.advice is None


def test_summary_fields_and_speeds_by_depth():
    f = Feed()
    f.add(
        msgs("q1"),
        cache_n=0,
        prompt_n=100,
        predicted_n=10,
        timings={
            "cache_n": 0,
            "prompt_n": 100,
            "predicted_n": 10,
            "prompt_ms": 500,
            "predicted_ms": 1000,
            "draft_n": 10,
            "draft_n_accepted": 6,
        },
        ttft_ms=120,
    )
    f.add(
        msgs("q1"),
        cache_n=5000,
        prompt_n=100,
        conversation="b",
        timings={
            "cache_n": 5000,
            "prompt_n": 100,
            "predicted_n": 10,
            "prompt_ms": 1000,
            "predicted_ms": 500,
        },
        ttft_ms=200,
    )
    f.add(msgs("n"), cache_n=0, prompt_n=0, conversation="c", timings=None)
    s = f.ring.summary()
    assert s["completions"] == 3 and s["prompt_n"] == 200 and s["cache_n"] == 5000
    d = s["detail"]
    assert d["unknown_cache_figures"] == 1
    assert d["draft"] == {"draft_n": 10, "draft_n_accepted": 6, "acceptance": 0.6}
    depths = {r["depth"]: r for r in d["speeds_by_depth"]}
    assert depths["1k"]["prompt_tps_median"] == 200.0 and depths["1k"]["gen_tps_median"] == 10.0
    assert depths["8k"]["prompt_tps_median"] == 100.0
    assert d["ttft_ms_median"] == 160.0
    assert d["recomputed_per_turn"] == 100.0


def brute_force(entries):
    known = [e for e in entries if e.cached is not None and e.computed is not None]
    return {
        "completions": len(entries),
        "prompt_n": sum(e.computed for e in known),
        "cache_n": sum(e.cached for e in known),
        "losses": sum(1 for e in entries if e.loss and e.loss.type == "loss"),
        "pp": {
            b: statistics.median([e.pp_tps for e in entries if e.bucket == b and e.pp_tps])
            for b in {e.bucket for e in entries if e.pp_tps}
        },
    }


def test_incremental_aggregates_match_a_full_recount_after_eviction():
    rnd = random.Random(7)
    f = Feed(Ring(capacity=300))
    history = {c: msgs("start") for c in "abcd"}
    for _ in range(1000):
        conv = rnd.choice("abcd")
        history[conv] = history[conv] + [{"role": "user", "content": str(rnd.random())}]
        kind = rnd.choice(["main", "main", "subagent", "bench"])
        pn = rnd.randint(1, 3000)
        f.add(
            history[conv],
            cache_n=rnd.randint(0, 20000),
            prompt_n=pn,
            conversation=conv,
            kind=kind,
            timings={
                "cache_n": rnd.randint(0, 20000),
                "prompt_n": pn,
                "predicted_n": 5,
                "prompt_ms": rnd.randint(1, 900),
            },
        )
    ring = f.ring
    assert len(ring) == 300
    s = ring.summary()
    want = brute_force(list(ring.entries))
    assert s["completions"] == want["completions"]
    assert s["prompt_n"] == want["prompt_n"] and s["cache_n"] == want["cache_n"]
    assert sum(k["losses"] for k in s["detail"]["by_kind"].values()) == want["losses"]
    from loki_perf.decode import DEPTH_NAMES

    got = {r["depth"]: r["prompt_tps_median"] for r in s["detail"]["speeds_by_depth"]}
    assert got == {DEPTH_NAMES[b]: v for b, v in want["pp"].items()}
    assert len(ring.losses(5000)) == sum(1 for e in ring.entries if e.loss)


def test_chained_prefix_matches_a_linear_scan_on_fingerprints():
    from loki_perf.ring import chained_prefix
    from loki_shared.fingerprint import common_prefix

    rnd = random.Random(3)
    for _ in range(300):
        base = [
            {"role": "user", "content": str(rnd.randint(0, 3))} for _ in range(rnd.randint(0, 12))
        ]
        other = list(base[: rnd.randint(0, len(base))])
        other += [
            {"role": "user", "content": str(rnd.randint(0, 3))} for _ in range(rnd.randint(0, 6))
        ]
        a, b = fingerprints(base), fingerprints(other)
        assert chained_prefix(a, b) == common_prefix(a, b)


def test_side_jobs_starting_new_prompts_are_not_divergences():
    f = Feed()
    f.add(msgs("task one"), cache_n=0, prompt_n=100, kind="subagent")
    e = f.add(msgs("task two"), cache_n=3, prompt_n=100, kind="subagent")
    assert e.loss is None
    # ...but a sub-agent that extends its own prompt and loses its cache is a loss.
    f.add(msgs("x"), cache_n=0, prompt_n=50, conversation="b")
    e = f.add(msgs("task two", "a", "more"), cache_n=3, prompt_n=200, kind="subagent")
    assert e.loss.type == "loss" and e.loss.cause == "conversation"


def test_only_the_latest_record_of_a_conversation_keeps_its_fingerprints():
    f = Feed(Ring(capacity=50))
    history = msgs("q")
    for i in range(60):
        history = history + [{"role": "user", "content": str(i)}]
        f.add(history, cache_n=0, prompt_n=10, conversation="a" if i % 2 else "b")
    kept = [e for e in f.ring.entries if e.fingerprints is not None]
    assert [e.conversation for e in kept] == ["b", "a"]  # one per (conversation, kind)
    # ...and comparisons still work against the latest one.
    e = f.add(
        history + [{"role": "user", "content": "more"}], cache_n=0, prompt_n=500, conversation="a"
    )
    assert e.loss is not None and e.loss.type == "loss"


def test_a_loss_after_the_tools_changed_is_caused_by_tools():
    """Issue 42: the tools are part of the prompt prefix; when the conversation's tools
    changed since its previous request (both records say their ``tools_fingerprint``), a loss
    is attributed to ``tools``, whatever ran in between; the same tools, or a record that does
    not say, leaves the cause as before."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, tools_fingerprint="aa")
    e = f.add(msgs("q1", "a1", "q2"), cache_n=119, prompt_n=15, tools_fingerprint="aa")
    assert e.loss is None
    f.add(msgs("other"), cache_n=0, prompt_n=50, conversation="b", tools_fingerprint="aa")
    e = f.add(msgs("q1", "a1", "q2", "a2", "q3"), cache_n=5, prompt_n=300, tools_fingerprint="bb")
    assert e.loss.type == "loss" and e.loss.cause == "tools" and e.loss.between[0][1] == "b"
    assert f.ring.summary()["detail"]["losses_by_cause"]["tools"]["count"] == 1
    g = Feed()  # one record does not say: as before
    g.add(msgs("q1"), cache_n=0, prompt_n=100)
    e = g.add(msgs("q1", "a1", "q2"), cache_n=40, prompt_n=100, tools_fingerprint="bb")
    assert e.loss.cause == "none"


def test_a_loss_on_an_unstable_prefix_template_is_caused_by_the_template():
    """Issue 16: a record whose lease's template probe says ``stable_prefix`` False is
    attributed to ``template`` whatever ran in between; without the flag, as before."""
    f = Feed()
    f.add(msgs("q1"), cache_n=0, prompt_n=100, prefix_unstable=True)
    e = f.add(msgs("q1", "a1", "q2"), cache_n=40, prompt_n=100, prefix_unstable=True)
    assert e.loss.type == "loss" and e.loss.cause == "template" and e.loss.between == []
    f.add(msgs("other"), cache_n=0, prompt_n=50, conversation="b", prefix_unstable=True)
    e = f.add(msgs("q1", "a1", "q2", "a2", "q3"), cache_n=5, prompt_n=300, prefix_unstable=True)
    assert e.loss.cause == "template" and e.loss.between[0][1] == "b"
    summary = f.ring.summary()["detail"]["losses_by_cause"]
    assert set(summary) == {"template"} and summary["template"]["count"] == 2
    # a non-bool flag is not a verdict
    g = Feed()
    g.add(msgs("q1"), cache_n=0, prompt_n=100)
    e = g.add(msgs("q1", "a1", "q2"), cache_n=40, prompt_n=100, prefix_unstable="yes")
    assert e.loss.cause == "none"
