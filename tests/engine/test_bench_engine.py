"""The engine benchmark and the optimiser against the real supervisor and llama-server with the
bundled model on CPU (small depths, few tokens: two shared cores).

- a benchmark of the preset in service: pp and tg at two depths, repetitions with medians and
  spread, progress to its end, stored under the preset, model and engine build; run as side
  work of kind ``bench`` (one slot: slot 0 erased after it, CACHE_ISOLATE) and the
  conversation's next request finds its prompt cached again (``timings.cache_n``);
- refused on an external preset, with the reason;
- an optimiser search over two UBATCH values: refused while a turn holds the engine, each
  candidate launched (its ``--ubatch-size`` on the command line), the proposal the measured
  fastest row (whichever it is), the preset in service running again as it was after.

No GPU run was possible in this session (no device lent): see BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import time

from loki_shared import subjects
from loki_shared.lease import lease as engine_lease
from loki_shared.messages.engine import (
    BenchReply,
    BenchRequest,
    LeaseRequest,
    OptimiseReply,
    OptimiseRequest,
    PresetsReply,
    PresetsRequest,
)
from loki_supervisor.optimise import WATCH_S

from .conftest import request, wait_info

TOPIC = " ".join(
    f"Fact {i}: the lighthouse keeper logged wind {i % 7} at hour {i}." for i in range(30)
)


async def _turn(nc, messages: list[dict]) -> dict:
    """One ``main`` request of conversation ``c1`` under its lease; the engine's JSON."""
    async with engine_lease(nc, LeaseRequest(kind="main", conversation="c1", wait_s=60)) as held:
        lease = held.lease
        return await asyncio.to_thread(
            _chat_messages, lease.base_url, messages, lease.id_slot, lease.api_key
        )


def _chat_messages(base_url, messages, id_slot, api_key) -> dict:
    import httpx

    body: dict = {"messages": messages, "max_tokens": 4, "temperature": 0, "cache_prompt": True}
    if id_slot is not None:
        body["id_slot"] = id_slot
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    return r.json()


async def _until_done(nc, subject, req, reply_type, timeout: float):
    deadline = time.monotonic() + timeout
    reply = None
    while time.monotonic() < deadline:
        reply = await request(nc, subject, req, reply_type, 10)
        if reply.job is not None and reply.job.state != "running":
            return reply
        await asyncio.sleep(0.5)
    raise AssertionError(f"job still running after {timeout} s: {reply}")


async def test_benchmark_keeps_the_conversation_cache_and_is_refused_on_an_external_preset(
    engine_env, supervisor_factory, nc
):
    sup = supervisor_factory(engine_env)
    info = await wait_info(nc, lambda i: i.state == "ready", 180, sup)
    messages = [{"role": "user", "content": "Remember this. " + TOPIC}]
    first = await _turn(nc, messages)
    whole = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And the wind at hour 3?"},
    ]

    start = BenchRequest(action="start", depths=[0, 128], n_pp=32, n_tg=8, reps=2)
    started = await request(nc, subjects.ENGINE_BENCH, start, BenchReply)
    assert started.error is None and started.job.state == "running", started
    assert started.job.total == 8
    again = await request(nc, subjects.ENGINE_BENCH, start, BenchReply)
    assert again.error is not None and again.error.type == "conflict"  # one at a time
    done = await _until_done(
        nc, subjects.ENGINE_BENCH, BenchRequest(action="status"), BenchReply, 300
    )
    job = done.job
    assert job.state == "done", job
    assert job.done == job.total == 8
    run = job.run
    assert [(p.test, p.depth) for p in run.points] == [
        ("pp", 0),
        ("tg", 0),
        ("pp", 128),
        ("tg", 128),
    ]
    for p in run.points:
        assert len(p.tps) == 2 and all(v > 0 for v in p.tps), p
        assert p.low <= p.median <= p.high
    assert (run.preset_id, run.build) == ("env", info.build_info)
    assert run.model and run.reps == 2
    # one slot: the bench shared the conversation's slot; CACHE_ISOLATE erased it after
    assert run.id_slot is None and run.slot_erased, run
    assert [r.run_id for r in done.runs] == [run.run_id]  # stored for the preset in service

    # the conversation's next request finds its whole earlier prompt cached again
    second = await _turn(nc, messages)
    assert second["timings"]["cache_n"] >= whole - 1, (second["timings"], whole)

    # an external preset: refused, with the reason
    ext = {
        "id": "ext",
        "name": "ext",
        "external": True,
        "base_url": "http://127.0.0.1:9/v1",
        "api_model": "m",
    }
    await request(
        nc, subjects.ENGINE_PRESETS, PresetsRequest(action="save", preset=ext), PresetsReply
    )
    await request(
        nc, subjects.ENGINE_PRESETS, PresetsRequest(action="switch", preset_id="ext"), PresetsReply
    )
    await wait_info(nc, lambda i: i.external and i.preset_id == "ext", 60, sup)
    refused = await request(nc, subjects.ENGINE_BENCH, BenchRequest(action="start"), BenchReply)
    assert refused.error is not None and refused.error.type == "conflict"
    assert "external" in refused.error.message
    status = await request(nc, subjects.ENGINE_BENCH, BenchRequest(action="status"), BenchReply)
    assert status.runs == []  # the external preset has no runs of its own
    opt = await request(
        nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="start"), OptimiseReply
    )
    assert opt.error is not None and "external" in opt.error.message


async def test_optimiser_proposes_the_measured_fastest_of_two_ubatch_values_and_yields_to_a_turn(
    engine_env, supervisor_factory, nc
):
    sup = supervisor_factory(engine_env)
    await wait_info(nc, lambda i: i.state == "ready", 180, sup)
    start = OptimiseRequest(
        action="start",
        candidates=[{"ubatch": 32}, {"ubatch": 256}],
        depths=[0],
        n_pp=64,
        n_tg=8,
        reps=2,
    )
    # never while a turn runs
    async with engine_lease(nc, LeaseRequest(kind="main", conversation="c1", wait_s=30)):
        busy = await request(nc, subjects.ENGINE_OPTIMISE, start, OptimiseReply)
    assert busy.error is not None and busy.error.type == "conflict"
    assert "turn" in busy.error.message

    started = await request(nc, subjects.ENGINE_OPTIMISE, start, OptimiseReply, 30)
    assert started.error is None and started.job.state == "running", started
    done = await _until_done(
        nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="status"), OptimiseReply, 400
    )
    assert done.job.state == "done", done.job
    result = done.result
    table = result.table
    assert [row.settings for row in table] == [{}, {"ubatch": 32}, {"ubatch": 256}]
    assert all(row.verdict == "measured" and row.pp and row.tg for row in table), table
    scores = [row.score for row in table]
    assert result.best == scores.index(max(scores))
    assert result.diff == table[result.best].settings  # {} when the preset itself won
    log = sup.log()
    assert "--ubatch-size 32" in log and "--ubatch-size 256" in log  # each one launched
    # the preset in service runs again as it was; nothing applied
    info = await wait_info(nc, lambda i: i.state == "ready", 120, sup)
    assert "--ubatch-size" not in info.argv and info.preset_id == "env"
    presets = await request(
        nc, subjects.ENGINE_PRESETS, PresetsRequest(action="get", preset_id="env"), PresetsReply
    )
    assert presets.preset["ubatch"] is None
    kept = await request(
        nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="status"), OptimiseReply
    )
    assert kept.result.search_id == result.search_id  # the table is kept

    # a turn that asks for the engine during a search stops it; the preset comes back first
    # a search long enough that the turn comes while it measures (three candidates to launch)
    again = OptimiseRequest(
        action="start",
        candidates=[{"ubatch": 64}, {"ubatch": 128}, {"ubatch": 256}],
        depths=[0],
        n_pp=32,
        n_tg=4,
        reps=2,
    )
    started = await request(nc, subjects.ENGINE_OPTIMISE, again, OptimiseReply, 30)
    assert started.job.state == "running"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until a candidate is being launched or measured
        now = await request(
            nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="status"), OptimiseReply
        )
        if now.job.step.startswith(("candidate", "row 1", "row 2")):
            break
        await asyncio.sleep(0.1)
    async with engine_lease(nc, LeaseRequest(kind="main", conversation="c1", wait_s=300)) as held:
        assert held.lease.base_url
        # held past a few of the watcher's looks (a lease granted between two of them and
        # released at once could pass unseen, and the search would end "done")
        await asyncio.sleep(4 * WATCH_S)
    stopped = await _until_done(
        nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="status"), OptimiseReply, 120
    )
    assert stopped.job.state == "cancelled"
    assert stopped.job.step == "stopped: a turn asked for the engine"
    info = await wait_info(nc, lambda i: i.state == "ready", 120, sup)
    assert "--ubatch-size" not in info.argv

    # and cancel stops it too
    one = OptimiseRequest(
        action="start", candidates=[{"ubatch": 64}], depths=[0], n_pp=32, n_tg=4, reps=1
    )
    started = await request(nc, subjects.ENGINE_OPTIMISE, one, OptimiseReply, 30)
    assert started.job.state == "running"
    cancelled = await request(
        nc, subjects.ENGINE_OPTIMISE, OptimiseRequest(action="cancel"), OptimiseReply, 300
    )
    assert cancelled.job.state == "cancelled" and cancelled.job.step == "cancelled"
    info = await wait_info(nc, lambda i: i.state == "ready", 120, sup)
    assert "--ubatch-size" not in info.argv
