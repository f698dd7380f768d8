"""PREWARM against the REAL llama-server (bundled SmolLM2, one slot, no RAM prompt cache): after
a compaction the slot holds something else (the transcript summary request ran there); the
first turn after it computes the whole compacted prompt, unless the prewarm request
(:func:`loki_chat.prewarm.run_prewarm`, leased from a fake supervisor that points at the real
engine) put the prefix back first — then it computes little more than the new message. The
same after an engine kill, through the whole chat service (``loki_chat.restart_prewarm``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from loki_chat.bus import ChatBus
from loki_chat.compaction import decide as D
from loki_chat.conversation import Conversation
from loki_chat.engine import EngineClient
from loki_chat.leases import EngineLeases
from loki_chat.prewarm import PrewarmJob, run_prewarm
from loki_shared import servers, subjects
from loki_shared.messages.engine import EngineState
from loki_shared.messages.perf import PerfRecord
from tests.builders import U
from tests.chat.helpers import chat_settings
from tests.fakes.fake_supervisor import FakeSupervisor

from .test_compaction_tail_reuse_real_engine import conversation, send

SUMMARY = "Goals: eight questions on buffers and caches. Decisions: none. State: answered."


def compacted(cid: str) -> Conversation:
    """The probe's conversation after a compaction (the policy's own cut and summary
    message; the summary text fixed)."""
    conv = conversation(cid)
    cut = D.plan_cut(list(conv.messages))
    assert cut is not None
    conv.messages[:] = [D.summary_message(cut, SUMMARY), *cut.tail]
    return conv


async def evict(url: str) -> None:
    """What a transcript summary request does to the one slot: another prompt."""
    text = " ".join(f"line {i} of the transcript to summarise." for i in range(150))
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            url + "/v1/chat/completions",
            json={
                "messages": [
                    {"role": "system", "content": "Summarise."},
                    {"role": "user", "content": text},
                ],
                "max_tokens": 1,
            },
            timeout=600,
        )
    assert resp.status_code == 200


async def test_real_engine_first_turn_after_compaction_is_small_with_prewarm(
    broker, nats_url, nc, tmp_path
):
    server = servers.start_llama(ctx=4096, extra=["--cache-ram", "0"])
    sup = await FakeSupervisor(nc, server.url, n_ctx=4096, model="smollm2").start()
    settings = chat_settings(
        nats_url, "redis://127.0.0.1:1/0", tmp_path / "h", system_prompt="You are helpful."
    )
    records: list[PerfRecord] = []
    try:
        figures: dict[str, dict[str, Any]] = {}
        for name in ("cold", "prewarmed"):
            conv = compacted(f"pw-{name}")
            await send(server.url, settings, conversation(conv.id), False)  # the turn before
            await evict(server.url)
            if name == "prewarmed":
                async with httpx.AsyncClient() as http:
                    outcome = await run_prewarm(
                        PrewarmJob(conv.id, list(conv.messages), None),
                        settings=settings,
                        leases=EngineLeases(ChatBus(broker), settings),
                        engine=EngineClient(http, [0.1], 600.0),
                        publish=records.append,
                    )
                assert outcome == "done"
            conv.messages.append(U("Next question: which buffer holds the stream?"))
            figures[name] = await send(server.url, settings, conv, False)
        cold, warm = figures["cold"], figures["prewarmed"]
        print("first turn after compaction, cold:", cold, "prewarmed:", warm)
        assert cold["prompt_n"] > 300, cold
        assert warm["prompt_n"] < 0.25 * cold["prompt_n"], (cold, warm)
        [record] = records
        assert record.kind == "prewarm" and record.conversation == "pw-prewarmed"
        assert sup.held() == 0
    finally:
        await sup.stop()
        server.process.stop()


LONG = " ".join(f"Fact {i}: buffer number {i} holds {i * 7} bytes." for i in range(110))


async def test_real_engine_first_turn_after_an_engine_kill_is_small_with_prewarm(
    chat_runner, client, nc
):
    """The whole chat service: a turn of ~1,500 tokens, llama-server killed (``kill -9``)
    and started again (empty slot), the supervisor's ``ready`` event; with PREWARM the
    restart prewarm puts the prefix back, so the next turn computes little more than its new
    message; without, the whole prompt."""
    server = servers.start_llama(ctx=4096, extra=["--cache-ram", "0"])
    sup = await FakeSupervisor(nc, server.url, n_ctx=4096, model="smollm2").start()
    figures: dict[str, dict[str, Any]] = {}
    try:
        for name in ("cold", "prewarmed"):
            service = await chat_runner.start(
                tools=False,
                system_prompt="You are helpful.",
                prewarm=name == "prewarmed",
                max_tokens=8,
                temperature=0.0,
            )
            cid, end = await client.turn(LONG + "\nWhich buffer holds 70 bytes?", timeout=300)
            assert end.finish_reason in ("stop", "length"), end
            assert server.process.proc is not None
            server.process.proc.kill()  # kill -9: the slot is gone with the process
            server.process.stop()
            server = servers.start_llama(ctx=4096, extra=["--cache-ram", "0"])
            sup.base_url = server.url
            event = EngineState(state="ready", ts=time.time(), base_url=server.url)
            await nc.publish(subjects.ENGINE_STATE, event.model_dump_json().encode())
            await nc.flush()
            for _ in range(100):  # the event's handling (the off case: nothing, ever)
                if service.restart_prewarm.last is not None:
                    break
                await asyncio.sleep(0.05)
            task = service.restart_prewarm.task
            if name == "prewarmed":
                assert service.restart_prewarm.last == "sent"
                assert task is not None and await asyncio.wait_for(task, 300) == "done"
            else:
                assert task is None and service.restart_prewarm.last is None
            _, end = await client.turn("And which holds 77?", cid, timeout=300)
            figures[name] = dict(end.timings or {})
            await chat_runner.stop(service)
        cold, warm = figures["cold"], figures["prewarmed"]
        print("first turn after an engine kill, cold:", cold, "prewarmed:", warm)
        assert cold["prompt_n"] > 1000, cold
        assert warm["prompt_n"] < 0.1 * cold["prompt_n"], (cold, warm)
        assert sup.held() == 0
    finally:
        await sup.stop()
        server.process.stop()
