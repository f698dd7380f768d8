"""The engine benchmark's and optimiser's rules without an engine: the requests a benchmark
sends (exact depths, fresh tokens, the lease's slot), medians and spread, the plan's bounds,
the candidates the engine's ``--help`` allows, the memory check, the scoring that picks the
proposal, and the refusals (external preset, a turn running or waiting, a job running)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loki_shared.errors import Conflict
from loki_shared.messages.engine import (
    BenchRequest,
    LeaseRequest,
    OptimiseCandidate,
    OptimiseRequest,
    Preset,
)
from loki_shared.sealing import Sealer
from loki_supervisor import bench, optimise
from loki_supervisor.engine_process import Props
from loki_supervisor.errors import InvalidRequest
from loki_supervisor.facts import GgufFacts, GpuFacts, HostMemory, parse_help
from loki_supervisor.plan import CacheRam, Facts, LaunchPlan
from loki_supervisor.service import Supervisor
from loki_supervisor.settings import Settings

HELP = """\
-c,    --ctx-size N                     size of the prompt context (env: LLAMA_ARG_CTX_SIZE)
-b,    --batch-size N                   logical maximum batch size (default: 2048)
-ub,   --ubatch-size N                  physical maximum batch size (default: 512)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto')
-ctk,  --cache-type-k TYPE              KV cache data type for K
-ctv,  --cache-type-v TYPE              KV cache data type for V
"""


async def test_measure_sends_exact_depths_fresh_tokens_and_the_slot():
    sent: list[dict] = []

    async def send(body: dict) -> dict:
        sent.append(body)
        n = len(body["prompt"])
        return {"timings": {"prompt_per_second": 100.0 + n, "predicted_per_second": 10.0 + n}}

    seen: list[tuple[int, int]] = []
    plan = bench.BenchPlan(depths=(0, 64), n_pp=16, n_tg=4, reps=2)
    points = await bench.measure(send, plan, 1, lambda d, t, s: seen.append((d, t)))
    assert all(b["id_slot"] == 1 and b["cache_prompt"] for b in sent)
    # depth 0: pp, tg, pp, tg; depth 64: the depth prefilled, then pp, tg, pp, tg
    assert [len(b["prompt"]) for b in sent] == [16, 1, 16, 1, 64, 80, 65, 80, 65]
    assert [b["n_predict"] for b in sent] == [1, 4, 1, 4, 1, 1, 4, 1, 4]
    depth = sent[4]["prompt"]
    assert all(b["prompt"][:64] == depth for b in sent[5:])
    assert sent[5]["prompt"][64:] != sent[7]["prompt"][64:]  # each repetition's new tokens
    assert [(p.test, p.depth, p.n) for p in points] == [
        ("pp", 0, 16),
        ("tg", 0, 4),
        ("pp", 64, 16),
        ("tg", 64, 4),
    ]
    assert points[2].tps == [180.0, 180.0] and points[2].median == 180.0
    assert seen[-1] == (plan.steps, plan.steps) and plan.steps == 8


async def test_measure_without_timings_fails():
    async def send(body: dict) -> dict:
        return {"content": ""}

    with pytest.raises(bench.BenchError, match="timings.prompt_per_second"):
        await bench.measure(send, bench.BenchPlan(depths=(0,), reps=1), None)


def test_spread_and_plan_bounds():
    assert bench.spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert bench.spread([]) == (None, None, None)
    with pytest.raises(ValueError, match="exceeds"):
        bench.BenchPlan(depths=(2000,), n_pp=128).check(2048)
    with pytest.raises(ValueError, match="at least 1"):
        bench.BenchPlan(reps=0).check(2048)
    bench.BenchPlan(depths=(0, 1024), n_pp=128).check(2048)


def test_default_candidates_follow_the_engine_help():
    help_ = parse_help(HELP)
    preset = Preset(id="p", ubatch=None, extra_args="-t 2")
    cands = optimise.default_candidates(preset, help_, gpu_present=False)
    assert {"ubatch": 128} in cands and {"ubatch": 256} in cands and {"ubatch": 1024} in cands
    args = [c["extra_args"] for c in cands if "extra_args" in c]
    assert "-t 2 --batch-size 4096" in args
    assert "-t 2 --flash-attn on" in args and "-t 2 --flash-attn off" in args
    assert "-t 2 --cache-type-k q8_0 --cache-type-v q8_0" in args
    assert not any("ngl" in c or "draft_max" in c for c in cands)  # no GPU, no draft model
    # an engine whose help lists none of them: nothing to try
    assert optimise.default_candidates(preset, parse_help(""), gpu_present=None) == []
    # a draft model: its settings; a GPU with imposed layers: auto placement
    drafted = Preset(id="p", draft_model="/d.gguf", ngl="20")
    more = optimise.default_candidates(drafted, parse_help(""), gpu_present=True)
    assert more == [{"ngl": "auto"}, {"draft_max": 4}, {"draft_max": 8}, {"draft_max": 16}]


def test_candidate_preset_changes_only_launch_fields():
    base = Preset(id="p", ubatch=512, system_prompt="s")
    assert optimise.candidate_preset(base, {"ubatch": 64}).ubatch == 64
    with pytest.raises(InvalidRequest, match="only"):
        optimise.candidate_preset(base, {"system_prompt": "x"})


def _plan(**kw) -> LaunchPlan:
    base = dict(
        args=["-c", "4096"],
        notes=[],
        slots=1,
        slot_ctx=4096,
        side_slot=False,
        side_slot_refusal=None,
        placement="cpu",
        cache_ram=CacheRam(None, None),
        slot_save_path=None,
        shared_window=False,
    )
    base.update(kw)
    return LaunchPlan(**base)


def test_memory_check_refuses_what_does_not_fit():
    gguf = GgufFacts(
        architecture="llama",
        file_size=1 << 30,
        block_count=32,
        embedding_length=4096,
        head_count=32,
        head_count_kv=(8,) * 32,
    )
    small = Facts(
        gguf=gguf, gpu=GpuFacts(known=True), host=HostMemory(4 << 30, 1 << 30), help=parse_help("")
    )
    big = Facts(
        gguf=gguf,
        gpu=GpuFacts(known=True),
        host=HostMemory(64 << 30, 60 << 30),
        help=parse_help(""),
    )
    assert "above 90%" in (optimise.memory_refusal(_plan(), small, 4096) or "")
    assert optimise.memory_refusal(_plan(), big, 4096) is None
    # split placement: not refused (unknown share)
    assert optimise.memory_refusal(_plan(placement="split"), small, 4096) is None
    # a plan that gives up SIDE_SLOT is refused
    assert "SIDE_SLOT" in (
        optimise.plan_refusal(_plan(side_slot=True), _plan(side_slot=False, side_slot_refusal="x"))
        or ""
    )


def test_score_picks_the_fastest_measured_row():
    table = [
        OptimiseCandidate(settings={}, verdict="measured", pp=100, tg=10),
        OptimiseCandidate(settings={"ubatch": 64}, verdict="measured", pp=80, tg=10),
        OptimiseCandidate(settings={"ubatch": 256}, verdict="measured", pp=150, tg=11),
        OptimiseCandidate(settings={"ubatch": 999}, verdict="refused", reason="x"),
    ]
    assert optimise.score_rows(table) == 2
    assert table[0].score == 1.0 and table[2].score == round((1.5 + 1.1) / 2, 4)
    assert table[3].score is None
    table[0].verdict = "failed"
    assert optimise.score_rows(table) is None  # no baseline, no proposal


@pytest.fixture
async def sup(tmp_path: Path):
    settings = Settings(home=tmp_path, ctx=2048, engine_port=1)
    s = Supervisor(settings, redis=None, sealer=Sealer(b"k" * 32), publish_state=_noop)
    s.runner.state = "ready"
    s.runner.base_url = "http://127.0.0.1:1"
    s.runner.props = Props(total_slots=1, slot_n_ctx=[2048], build_info="b9000-x", model="m")
    yield s
    await s.runner._client.aclose()


async def _noop(_event) -> None:
    return None


async def test_benchmark_and_search_refused_on_an_external_preset(sup):
    sup.runner.external = True
    with pytest.raises(Conflict, match="external"):
        await sup.bench.handle(BenchRequest(action="start"))
    with pytest.raises(Conflict, match="external"):
        await sup.optimiser.handle(OptimiseRequest(action="start"))


async def test_search_refused_while_a_turn_runs_or_waits(sup):
    lease = await sup.lease(LeaseRequest(kind="main", conversation="c", wait_s=1))
    with pytest.raises(Conflict, match="a turn is running or waiting"):
        await sup.optimiser.handle(OptimiseRequest(action="start"))
    assert sup.leases.kind_active(optimise.TURN_KINDS)
    sup.leases.release(lease.lease_id)
    assert not sup.leases.kind_active(optimise.TURN_KINDS)
    # a side job's lease is not a turn
    await sup.lease(LeaseRequest(kind="verify", wait_s=1))
    assert not sup.leases.kind_active(optimise.TURN_KINDS)


async def test_benchmark_plan_refused_when_it_does_not_fit_the_slot(sup):
    with pytest.raises(InvalidRequest, match="exceeds"):
        await sup.bench.handle(BenchRequest(action="start", depths=[4000]))
    assert not sup.bench.running
