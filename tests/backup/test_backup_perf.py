"""Perf totals survive a backup: the perf service on a restored NATS exports exactly the
counters it had, including records counted before they left the 5000-record stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from loki_shared import subjects
from loki_shared.backup import jetstream_part
from loki_shared.perf_publish import publish_record
from tests.conftest import start_nats
from tests.perf.perf_helpers import PerfProc, record, wait_summary


def totals(scrape: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in scrape.items() if "_total" in k or "_bucket" in k or "_count" in k}


async def test_restored_perf_service_exports_the_same_counters(tmp_path: Path):
    a, b = start_nats(tmp_path / "a"), start_nats(tmp_path / "b")
    nc = await nats.connect(a.url)
    nc_b = await nats.connect(b.url)
    svc = None
    try:
        svc = PerfProc(a.url, tmp_path / "home")
        for turn, (cache_n, prompt_n) in enumerate([(0, 100), (90, 30), (120, 20)], 1):
            assert await publish_record(nc, record("a", turn, cache_n=cache_n, prompt_n=prompt_n))
        await wait_summary(nc, 3)
        await asyncio.sleep(0.8)  # a checkpoint holds the three records
        svc.stop()
        # Two more while the service is down (after its checkpoint)...
        assert await publish_record(nc, record("b", 1, cache_n=0, prompt_n=50))
        assert await publish_record(nc, record("a", 4, cache_n=140, prompt_n=10))
        # ...and the first two pushed out of the stream, as the 5000-record limit does.
        await nc.jetstream().purge_stream(subjects.STREAM_PERF, seq=3)
        svc = PerfProc(a.url, tmp_path / "home")
        await wait_summary(nc, 3)  # the ring holds what the stream holds
        await asyncio.sleep(0.5)
        before = totals(svc.scrape())
        assert before["lokiassist_completions_total"] == 5  # 3 checkpointed + 2 new
        assert before["lokiassist_prompt_tokens_total"] == 100 + 120 + 140 + 50 + 150

        copies = await jetstream_part.snapshot(nc.jetstream())  # while it runs
        svc.stop()
        svc = None
        await jetstream_part.load(nc_b.jetstream(), copies)

        svc = PerfProc(b.url, tmp_path / "home-b")
        await wait_summary(nc_b, 3)
        await asyncio.sleep(0.5)
        assert totals(svc.scrape()) == before
    finally:
        if svc is not None:
            svc.stop()
        await nc.close()
        await nc_b.close()
        a.process.stop()
        b.process.stop()
