"""With the real llama-server (one slot): losses between alternating conversations are
attributed to each other; a conversation that strictly extends its prompt loses nothing.

The requests go straight to the engine with httpx (streamed, as the chat service sends them)
and each completion is published with :mod:`loki_shared.perf_publish`, as every publisher does.

The engine runs with ``--cache-ram 0``: with llama-server's host-RAM prompt cache (8 GiB by
default) the tiny conversations of this test would be saved and restored whole when they come
back, and nothing would be lost — which is exactly what CACHE_RAM is for, but not what this
test must show.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from loki_shared import servers, subjects
from loki_shared.perf_publish import CompletionClock, build_record, publish_record

from .perf_helpers import PerfProc, request, wait_summary

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine_no_cache_ram(tmp_path_factory):
    """The real llama-server with the bundled model, one slot, no host-RAM prompt cache."""
    server = servers.start_llama(extra=["--cache-ram", "0"])
    yield server.url
    server.process.stop()


async def complete(
    client: httpx.AsyncClient, messages: list[dict]
) -> tuple[str, dict, CompletionClock]:
    """One streamed completion; returns the reply text, the final chunk and the clock."""
    body = {
        "messages": messages,
        "stream": True,
        "max_tokens": 12,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    clock = CompletionClock()
    text, final = "", {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta:
                    clock.delta()
                text += delta.get("content") or ""
                if choice.get("finish_reason"):
                    final.setdefault("choices", [{"finish_reason": choice["finish_reason"]}])
            if "timings" in chunk:
                final["timings"] = chunk["timings"]
            if chunk.get("usage"):
                final["usage"] = chunk["usage"]
    return text, final, clock


async def turn(client, nc, conv: str, history: list[dict], question: str) -> dict:
    history.append({"role": "user", "content": question})
    text, final, clock = await complete(client, history)
    rec = build_record(
        kind="main", conversation=conv, model="smollm2", messages=history, final=final, clock=clock
    )
    assert await publish_record(nc, rec)
    history.append({"role": "assistant", "content": text})
    return final


async def test_alternating_conversations_lose_to_each_other_extending_one_does_not(
    engine_no_cache_ram, perf_nats, nc, tmp_path
):
    svc = PerfProc(perf_nats, tmp_path / "home")
    try:
        # No keep-alive: a slow turn may outlive the engine's idle-connection timeout.
        async with httpx.AsyncClient(
            base_url=engine_no_cache_ram,
            timeout=300,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as client:
            a = [{"role": "system", "content": "You answer about gardens. " * 12}]
            b = [{"role": "system", "content": "You answer about oceans and ships. " * 12}]
            for i in range(2):
                await turn(client, nc, "conv-a", a, f"Garden question {i}: what grows?")
                await turn(client, nc, "conv-b", b, f"Ocean question {i}: what floats?")
            c = [{"role": "system", "content": "You answer about mountains. " * 12}]
            finals = [
                await turn(client, nc, "conv-c", c, f"Mountain question {i}?") for i in range(3)
            ]
        summary = await wait_summary(nc, 7)
        losses = (await request(nc, subjects.PERF_LOSSES, {"limit": 100}))["losses"]
        by_conv = {}
        for loss in losses:
            by_conv.setdefault(loss["conversation"], []).append(loss)
        # a's second turn found the slot holding b, b's second turn found it holding a.
        assert len(by_conv.get("conv-a", [])) == 1, losses
        assert len(by_conv.get("conv-b", [])) == 1, losses
        for me, peer in (("conv-a", "conv-b"), ("conv-b", "conv-a")):
            for loss in by_conv[me]:
                assert loss["type"] == "loss" and loss["cause"] == "conversation"
                assert [x["conversation"] for x in loss["between"]] == [peer]
                assert loss["tokens"] > 50  # most of the previous total was recomputed
        # c strictly extends its own prompt, nothing ran in between: no loss, cache reused.
        assert "conv-c" not in by_conv, by_conv["conv-c"]
        for before, after in itertools.pairwise(finals):
            # everything the previous request sent is reused, and more (its reply)
            assert after["timings"]["cache_n"] > before["usage"]["prompt_tokens"], finals
        assert summary["cache_n"] > 0 and summary["prompt_n"] > 0
        assert summary["detail"]["losses_by_cause"]["conversation"]["count"] == 2
        metrics = svc.scrape()
        assert metrics["lokiassist_cache_losses_total"] == 2
        assert metrics["lokiassist_ttft_seconds_count"] == 7
    finally:
        svc.stop()
