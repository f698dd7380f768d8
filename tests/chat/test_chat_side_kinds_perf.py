"""Issue 19: the side jobs' perf records (kinds ``subagent`` and ``verify``) reach the perf
service: ``loki.perf.summary`` (``GET /api/perf/summary``) lists them per kind and
``/metrics`` counts them, next to the main turn's."""

from __future__ import annotations

import json

from loki_shared.perf_publish import ensure_perf_stream
from tests.fakes.fake_engine import text_reply, tool_reply
from tests.perf.perf_helpers import PerfProc, reset_stream, wait_summary


async def test_subagent_and_verify_completions_appear_in_the_summary_and_metrics(
    chat_runner, supervisor, client, fake_engine, nc, nats_url, tmp_path
):
    await reset_stream(nc)  # only this test's records in the stream
    await ensure_perf_stream(nc.jetstream())
    svc = await chat_runner.start(verify=True)
    svc.toolbox.add(svc.subagent_tool())
    fake_engine.push(
        tool_reply([("c1", "subagent", '{"task": "find it"}')]),
        text_reply("found"),
        text_reply("It is found."),
        text_reply(json.dumps({"verdict": "pass", "reason": "answers"})),
    )
    cid, end = await client.turn("delegate")
    assert end.finish_reason == "stop"
    perf = PerfProc(nats_url, tmp_path / "perf-home")
    try:
        summary = await wait_summary(nc, 4)
        by_kind = summary["detail"]["by_kind"]
        assert {k: v["completions"] for k, v in by_kind.items()} == {
            "main": 2,
            "subagent": 1,
            "verify": 1,
        }
        metrics = perf.scrape()
        for kind, n in (("main", 2), ("subagent", 1), ("verify", 1)):
            key = "lokiassist_completions_total" + json.dumps({"kind": kind, "model": "fake-model"})
            assert metrics[key] == n, (kind, metrics)
    finally:
        perf.stop()
