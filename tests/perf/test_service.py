"""The perf service over real NATS/JetStream, run as ``python -m loki_perf``."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from loki_perf.decode import CAUSES
from loki_shared import subjects
from loki_shared.nats import make_broker
from loki_shared.perf_publish import publish_record

from .perf_helpers import PerfProc, record, request, reset_stream, wait_summary

COMPLETIONS = "lokiassist_completions_total"


async def test_restart_rebuilds_ring_loses_nothing_and_counts_once(perf_nats, nc, tmp_path):
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        # Conversation a, then b on the same engine, then a again: b evicted a.
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=100, slot=0))
        assert await publish_record(nc, record("b", 1, cache_n=10, prompt_n=90, slot=0))
        assert await publish_record(nc, record("a", 2, cache_n=10, prompt_n=130, slot=0))
        s = await wait_summary(nc, 3)
        assert s["prompt_n"] == 320 and s["cache_n"] == 20
        assert s["detail"]["losses_by_cause"] == {"conversation": {"count": 1, "tokens": 100}}
        m = svc.scrape()
        assert m[COMPLETIONS] == 3
        assert m["lokiassist_cache_lost_tokens_total"] == 100
        assert svc.lines() == []  # no [perf] line without LOKI_PERF_LOG
        await asyncio.sleep(0.8)  # let a checkpoint be written
        assert svc.stop() == 0  # SIGTERM: clean exit
    finally:
        svc.stop()

    # Published while the service is down, through a FastStream broker this time.
    broker = make_broker(perf_nats, "test-publisher")
    await broker.start()
    try:
        assert await publish_record(broker, record("b", 2, cache_n=10, prompt_n=150))
        assert await publish_record(broker, record("c", 1, cache_n=0, prompt_n=40, kind="bench"))
    finally:
        await broker.stop()

    svc = PerfProc(perf_nats, tmp_path / "home", log=True)
    try:
        s = await wait_summary(nc, 5)
        assert s["prompt_n"] == 510 and s["cache_n"] == 30
        # Rebuilding re-derives the same losses: b's return after a is attributed to a.
        losses = (await request(nc, subjects.PERF_LOSSES, {"limit": 10}))["losses"]
        assert [(x["conversation"], x["cause"]) for x in losses] == [
            ("b", "conversation"),
            ("a", "conversation"),
        ]
        assert losses[0]["between"][0]["conversation"] == "a"
        m = svc.scrape()
        assert m[COMPLETIONS] == 5  # not 3 + 5: the rebuilt records are not counted twice
        assert m["lokiassist_prompt_tokens_computed_total"] == 510
        assert svc.lines() == []  # the rebuilt ring is not logged again
        assert await publish_record(nc, record("c", 2, cache_n=40, prompt_n=30, kind="bench"))
        await wait_summary(nc, 6)
        lines = svc.lines()
        assert len(lines) == 1 and "kind=bench" in lines[0] and "conv=c" in lines[0], lines
        assert "prefill=30 new/40 cached" in lines[0]
        await asyncio.sleep(0.8)
    finally:
        svc.kill()  # SIGKILL: no final checkpoint

    # The stream forgets its old records (as when more than 5000 arrive): the counters still
    # carry them, from the checkpoint, and count only what came after it.
    await nc.jetstream().purge_stream(subjects.STREAM_PERF)
    assert await publish_record(nc, record("a", 3, cache_n=200, prompt_n=20))
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        await wait_summary(nc, 1)  # the ring holds what the stream holds
        m = svc.scrape()
        assert m[COMPLETIONS] == 7
        assert m["lokiassist_prompt_tokens_computed_total"] == 510 + 30 + 20
    finally:
        svc.stop()


async def test_bad_payloads_are_refused_alone_and_wrong_types_dropped(perf_nats, nc, tmp_path):
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        js = nc.jetstream()
        await js.publish(subjects.PERF_RECORD, b"not json", stream=subjects.STREAM_PERF)
        raw = {
            "ts": 1.0,
            "kind": "main",
            "conversation": "x",
            "timings": {"cache_n": "lots", "prompt_n": 12, "predicted_n": 3},
        }
        await js.publish(
            subjects.PERF_RECORD, json.dumps(raw).encode(), stream=subjects.STREAM_PERF
        )
        assert await publish_record(nc, record("y", 1, cache_n=5, prompt_n=7))
        s = await wait_summary(nc, 2)
        # The record with an unreadable cache_n is kept; its unknown cache is not a 0.
        assert s["detail"]["unknown_cache_figures"] == 1
        assert s["prompt_n"] == 7 and s["cache_n"] == 5
        m = svc.scrape()
        assert m["lokiassist_perf_rejected_records"] == 1
        assert m["lokiassist_completions_cache_unknown_total"] == 1
        assert m["lokiassist_generated_tokens_total"] == 13
        bad = await request(nc, subjects.PERF_LOSSES, {"limit": 0})
        assert bad["error"]["type"] == "invalid_request"
    finally:
        svc.stop()


async def test_cacheram_advice_is_served_for_the_supervisor(perf_nats, nc, tmp_path):
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=1000))
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=900, kind="subagent"))
        assert await publish_record(nc, record("a", 2, cache_n=300, prompt_n=800))
        await wait_summary(nc, 3)
        adv = await request(nc, subjects.PERF_CACHERAM, {})
        assert adv["advise"] is True and adv["count"] == 1
        ev = adv["events"][0]
        assert (ev["conversation"], ev["cached_tokens"], ev["prompt_tokens"]) == ("a", 300, 1100)
        assert ev["between"][0]["kind"] == "subagent"
        again = await request(nc, subjects.PERF_CACHERAM, {"since_seq": adv["last_seq"]})
        assert again["advise"] is False
    finally:
        svc.stop()


async def test_publish_creates_the_stream_and_never_raises(perf_nats, nc):
    js = nc.jetstream()
    assert await publish_record(js, record("a", 1, cache_n=0, prompt_n=5))
    info = await js.stream_info(subjects.STREAM_PERF)
    assert info.config.max_msgs == subjects.STREAM_PERF_MAX_MSGS
    assert info.config.subjects == [subjects.PERF_RECORD]
    assert info.state.messages == 1
    with pytest.raises(TypeError):
        await publish_record(object(), record("a", 1, cache_n=0, prompt_n=5))
    closed = await nats.connect(perf_nats)
    await closed.close()
    assert await publish_record(closed, record("a", 1, cache_n=0, prompt_n=5)) is False
    not_started = make_broker(perf_nats, "never-started")
    assert await publish_record(not_started, record("a", 1, cache_n=0, prompt_n=5)) is False


async def test_a_purged_stream_is_rebuilt_at_once(perf_nats, nc, tmp_path):
    assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=5))
    await nc.jetstream().purge_stream(subjects.STREAM_PERF)  # last_seq stays 1, no message
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        s = await wait_summary(nc, 0)
        assert s["detail"]["rebuilding"] is False
    finally:
        svc.stop()


async def test_losses_on_an_unstable_prefix_template_are_labelled_template(perf_nats, nc, tmp_path):
    """Issue 16: records flagged ``prefix_unstable`` (the chat service's, when the lease's
    template probe says ``stable_prefix`` False) put their losses under cause ``template``,
    in the summary, the losses list and the Prometheus label."""
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=100, slot=0))
        assert await publish_record(nc, record("b", 1, cache_n=10, prompt_n=90, slot=0))
        unstable = record("a", 2, cache_n=10, prompt_n=130, slot=0, prefix_unstable=True)
        assert await publish_record(nc, unstable)
        s = await wait_summary(nc, 3)
        assert s["detail"]["losses_by_cause"] == {"template": {"count": 1, "tokens": 100}}
        [loss] = (await request(nc, subjects.PERF_LOSSES, {"limit": 10}))["losses"]
        assert loss["cause"] == "template" and loss["between"][0]["conversation"] == "b"
        m = svc.scrape()
        key = 'lokiassist_cache_losses_total{"cause": "template", "kind": "main", "model": "smol"}'
        assert m[key] == 1
        conv = 'lokiassist_cache_losses_total{"cause": "conversation", "kind": "main", '
        assert m[conv + '"model": "smol"}'] == 0
    finally:
        svc.stop()


def _label_values(scraped: dict[str, float], label: str) -> set[str]:
    out = set()
    for key in scraped:
        if key.startswith("lokiassist_") and "{" in key:
            labels = json.loads(key[key.index("{") :])
            if label in labels:
                out.add(labels[label])
    return out


async def test_a_flood_of_client_chosen_names_never_reaches_the_labels(perf_nats, nc, tmp_path):
    """Issue 38 §6: every label a client can influence, flooded (the upstream's model names
    on external records, the kind): label values stay in the bounded set Loki controls, the
    engine's own model keeps its label, and after a restart no flooded name holds a slot."""
    await reset_stream(nc)
    js = nc.jetstream()

    async def raw(**data):
        body = json.dumps({"ts": 1.0, "conversation": "x", **data}).encode()
        await js.publish(subjects.PERF_RECORD, body, stream=subjects.STREAM_PERF)

    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        for i in range(40):
            await raw(kind="foreign", model=f"upstream-{i}", preset="external")
        for i in range(20):
            await raw(kind=f"client-kind-{i}", model="smol")
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=50))  # model smol
        await wait_summary(nc, 61)
        m = svc.scrape()
        models = _label_values(m, "model")
        assert "smol" in models and "other" in models
        assert len(models - {"smol", "other"}) == 16 and models <= {"smol", "other"} | {
            f"upstream-{i}" for i in range(40)
        }
        assert _label_values(m, "kind") == {"foreign", "unknown", "main"}
        assert _label_values(m, "cause") <= set(CAUSES)
        assert m[COMPLETIONS + '{"kind": "main", "model": "smol"}'] == 1
        await asyncio.sleep(0.8)  # a checkpoint
        assert svc.stop() == 0
    finally:
        svc.stop()
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        await raw(kind="foreign", model="preset-api-model", preset="external")
        assert await publish_record(nc, record("a", 2, cache_n=50, prompt_n=10))
        await wait_summary(nc, 63)
        m = svc.scrape()
        assert m[COMPLETIONS + '{"kind": "foreign", "model": "preset-api-model"}'] == 1
        assert m[COMPLETIONS + '{"kind": "main", "model": "smol"}'] == 2
        assert m[COMPLETIONS + '{"kind": "foreign", "model": "other"}'] == 24  # kept, not reset
    finally:
        svc.stop()


async def test_metrics_carry_the_supervisors_newest_benchmark_runs(perf_nats, nc, tmp_path):
    """At each scrape the perf service asks ``loki.engine.bench`` ``latest`` and exports the
    runs as gauges; without an answer the scrape still succeeds, without them."""
    from loki_shared.messages.engine import BenchPoint, BenchReply, BenchRequest, BenchRun

    asked: list[str] = []

    async def answer(msg) -> None:
        asked.append(BenchRequest.model_validate_json(msg.data).action)
        run = BenchRun(
            preset_id="env",
            model="smol",
            build="b1-x",
            points=[BenchPoint(test="tg", depth=512, n=16, median=40.0, low=39.0, high=41.0)],
        )
        await msg.respond(BenchReply(runs=[run]).model_dump_json().encode())

    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        before = await asyncio.to_thread(svc.scrape)
        assert "lokiassist_bench_tokens_per_second" not in before  # no supervisor: none
        sub = await nc.subscribe(subjects.ENGINE_BENCH, cb=answer)
        await nc.flush()
        m = await asyncio.to_thread(svc.scrape)
        await sub.unsubscribe()
        labels = '{"build": "b1-x", "depth": "512", "model": "smol", "preset": "env", "test": "tg"}'
        assert m["lokiassist_bench_tokens_per_second" + labels] == 40.0
        assert m["lokiassist_bench_spread_tokens_per_second" + labels] == 2.0
        assert asked == ["latest"]
    finally:
        svc.stop()
