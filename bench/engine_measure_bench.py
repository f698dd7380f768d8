"""The engine benchmark leaves the conversation's next turn at full cache reuse (issue 46).

One real engine supervisor (``python -m loki_supervisor`` launching llama-server with the
bundled model on CPU; one slot, CACHE_ISOLATE on, CACHE_RAM the engine default: the layout
where a benchmark shares the conversation's slot) and one scripted conversation through it.
Rounds, in the same run: a *control* turn that follows a turn directly, then a benchmark of
the preset in service (``loki.engine.bench``: pp and tg at two depths, two repetitions, under
``bench`` leases, slot 0 erased after it), then a turn *after the benchmark*. Each turn adds a
user message of the same size.

Figures: the prompt tokens each turn had to compute (``timings.prompt_n``) and its share of
the previous prompt served from cache (``cache_n`` / previous prompt tokens), and the main
request's wall time; the ratio of the turns after a benchmark to the control turns (medians).
Also the benchmark's own figures (pp and tg medians by depth).

Usage: ``python -m bench --only engine_measure [--quick]`` or ``python
bench/engine_measure_bench.py [--quick]`` (writes ``bench/results/engine_measure.json``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import nats

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common
from bench.side_slot_bench import completion, request, wait_ready
from loki_shared import subjects
from loki_shared.lease import lease as engine_lease
from loki_shared.messages.engine import BenchReply, BenchRequest, LeaseRequest

TIMEOUT_S = {"quick": 900, "full": 2400}
CTX = 4096
BENCH = BenchRequest(action="start", depths=[0, 256], n_pp=64, n_tg=16, reps=2)


def user_message(i: int) -> str:
    facts = " ".join(f"Entry {j} of day {i}: {j * 13 % 17} crates of pears." for j in range(8))
    return f"Day {i}. Summarise the ledger in one line. {facts}"


async def turn(nc, client: httpx.AsyncClient, messages: list[dict]) -> dict[str, Any]:
    """One main turn of conversation ``bench``: its figures; the answer appended."""
    async with engine_lease(
        nc, LeaseRequest(kind="main", conversation="bench", wait_s=120), timeout=130
    ) as held:
        data = await completion(client, held.lease, messages)
        usage = data.get("usage") or {}
        held.report(
            usage.get("prompt_tokens"),
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        )
    messages.append({"role": "assistant", "content": data["text"] or "ok"})
    t = data.get("timings") or {}
    return {"cache_n": t.get("cache_n"), "prompt_n": t.get("prompt_n"), "wall_s": data["_wall_s"]}


async def benchmark(nc) -> dict[str, Any]:
    """Run one benchmark of the preset in service to its end; its run (a dict)."""
    reply = await request(nc, subjects.ENGINE_BENCH, BENCH, BenchReply)
    if reply.error is not None:
        raise _common.BenchError(f"benchmark refused: {reply.error.message}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        reply = await request(nc, subjects.ENGINE_BENCH, BenchRequest(action="status"), BenchReply)
        job = reply.job
        if job is not None and job.state != "running":
            if job.state != "done" or job.run is None:
                raise _common.BenchError(f"benchmark {job.state}: {job.error}")
            return job.run.model_dump(mode="json")
        await asyncio.sleep(0.3)
    raise _common.BenchError("benchmark still running after 600 s")


async def conversation(nc, rounds: int) -> dict[str, Any]:
    messages: list[dict] = [{"role": "system", "content": "You are a brief assistant."}]
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    day = 0
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(after: str) -> None:
            nonlocal day
            before = rows[-1] if rows else None
            messages.append({"role": "user", "content": user_message(day)})
            day += 1
            row = await turn(nc, client, messages)
            row["after"] = after
            if before is not None and row["cache_n"] is not None:
                prev = (before["cache_n"] or 0) + (before["prompt_n"] or 0)
                row["restored_share"] = min(1.0, row["cache_n"] / max(1, prev))
            rows.append(row)

        await one("start")  # the conversation's first turn (cold)
        for _ in range(rounds):
            await one("turn")  # control: a turn right after a turn
            runs.append(await benchmark(nc))
            await one("benchmark")
    return {"turns": rows, "runs": runs}


def run_stack(rounds: int, root: Path) -> dict[str, Any]:
    """One supervisor with its own NATS and Redis; the conversation through it."""
    env = {
        "LOKI_SECRET_KEY": "bench-engine-measure-key",
        "LOKI_CTX": str(CTX),
        "LOKI_ENGINE_THREADS": "2",
        "LOKI_SIDE_SLOT": "off",
    }
    with _common.supervisor_alone(root / "stack", env) as (nats_url, sup):

        async def go() -> dict[str, Any]:
            nc = await nats.connect(nats_url)
            try:
                info = await wait_ready(nc, sup)
                out = await conversation(nc, rounds)
                out["engine"] = {
                    "total_slots": info.total_slots,
                    "argv": info.argv,
                    "build_info": info.build_info,
                }
                out["engine_build"] = _common.engine_build(info.base_url)
                return out
            finally:
                await nc.drain()

        return asyncio.run(go())


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def run(quick: bool) -> dict[str, Any]:
    rounds = 3 if quick else 6
    with tempfile.TemporaryDirectory(prefix="loki-engine-measure-") as tmp:
        out = run_stack(rounds, Path(tmp))
    control = [r for r in out["turns"] if r["after"] == "turn"]
    after = [r for r in out["turns"] if r["after"] == "benchmark"]
    pn_c, pn_b = _median(control, "prompt_n"), _median(after, "prompt_n")
    wall_c, wall_b = _median(control, "wall_s"), _median(after, "wall_s")
    share_b = _median(after, "restored_share")
    prompt_ratio = _common.ratio(pn_b, pn_c) if pn_b is not None and pn_c else None
    wall_ratio = _common.ratio(wall_b, wall_c) if wall_b and wall_c else None
    rows = [
        [
            name,
            len(rs),
            _median(rs, "prompt_n"),
            None
            if _median(rs, "restored_share") is None
            else round(_median(rs, "restored_share"), 3),  # type: ignore[arg-type]
            None if _median(rs, "wall_s") is None else round(_median(rs, "wall_s"), 3),  # type: ignore[arg-type]
        ]
        for name, rs in (("after a turn (control)", control), ("after a benchmark", after))
    ]
    speed_rows = []
    last = out["runs"][-1] if out["runs"] else None
    if last:
        for p in last["points"]:
            speed_rows.append(
                [
                    p["test"],
                    p["depth"],
                    p["n"],
                    round(p["median"], 1),
                    f"{p['low']:.1f}–{p['high']:.1f}",
                ]
            )
    erased = [bool(r.get("slot_erased")) for r in out["runs"]]
    targets = [
        _common.target(
            "turn after a benchmark / turn without: prompt tokens computed (medians)",
            prompt_ratio,
            "<=",
            1.05,
            issue="46",
        ),
        _common.target(
            "turn after a benchmark: previous prompt served from cache (median share)",
            share_b,
            ">=",
            0.95,
            issue="46",
        ),
    ]
    tables = [
        _common.table(
            "The conversation's next turn after a benchmark (same run, same machine)",
            [
                "turn",
                "turns",
                "prompt_n computed (median)",
                "previous prompt cached (median share)",
                "main request s (median)",
            ],
            rows,
            notes=f"CTX {CTX}, one slot, CACHE_ISOLATE on (slot 0 erased after each benchmark: "
            f"{sum(erased)} of {len(erased)}), CACHE_RAM engine default; bundled SmolLM2-135M on "
            f"CPU, 2 threads. Wall-time ratio after/without: "
            f"{'–' if wall_ratio is None else f'{wall_ratio:.3f}'} (informative: two shared "
            "cores).",
        ),
        _common.table(
            "The last benchmark's figures (llama-server timings, tokens/s)",
            ["test", "depth", "tokens", "median", "spread (min–max)"],
            speed_rows,
            notes=f"pp {BENCH.n_pp} / tg {BENCH.n_tg} at depths {BENCH.depths}, "
            f"{BENCH.reps} repetitions; CPU only: no GPU run was possible in this session "
            "(no device lent).",
        ),
    ]
    return _common.result(
        "Engine benchmark: the conversation keeps its cache",
        tables=tables,
        targets=targets,
        data={"rounds": rounds, **out, "wall_ratio": wall_ratio},
        notes="A benchmark runs as side work of kind bench: with one slot it shares the "
        "conversation's slot, which CACHE_ISOLATE erases after it; llama-server's host-RAM "
        "prompt cache gives the conversation its prompt back at its next request.",
        engine=out.get("engine_build"),
    )


def _show_tables(doc: dict[str, Any]) -> None:
    for table in doc["tables"]:
        for row in table["rows"]:
            print(row)


def main() -> None:
    _common.main_alone(
        "engine_measure", run, __doc__.splitlines()[0], "3 rounds instead of 6", show=_show_tables
    )


if __name__ == "__main__":
    main()
