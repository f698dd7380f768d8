"""SIDE_SLOT: a conversation interleaved with side jobs keeps its prompt cache in its own slot.

Runs, in the same run and on the same machine, one scripted conversation through the real
engine supervisor (``python -m loki_supervisor`` launching llama-server with the bundled
model on CPU) under three launch configurations:

- ``one slot, CACHE_RAM 0``: the side job takes the conversation's slot and the engine keeps
  no host-RAM copy: the conversation's prompt is recomputed (lost);
- ``one slot, CACHE_RAM default``: same slot sharing, but llama-server copies the
  conversation's state to host RAM and back (restored by copy, while it fits);
- ``SIDE_SLOT on``: two slots of CTX each (``-np 2 --no-kv-unified -c 2×CTX``); side jobs are
  routed to slot 1 by the lease, the conversation keeps slot 0.

Each turn leases ``main``, streams the whole conversation with the lease's ``id_slot``, reads
``timings.cache_n``/``prompt_n`` and the time to its first token, releases; between turns a
real side job of the chat service runs, alternately (issue 19): the verifier
(:func:`loki_chat.verify.run_verify` on the turn's request and answer) and a sub-agent
(:func:`loki_chat.subagent.run_subagent` with a task and a long context), each through its
own leases (kinds ``verify`` / ``subagent``), the last released with ``job_done``
(CACHE_ISOLATE erases slot 0 after it when there is one slot). The figures: for turns that
follow a side job, the share of the conversation's previous tokens served from cache
(``cache_n / (cache_n + prompt_n)``), the prompt tokens recomputed, and the main turn's time
to first token.

Usage: ``python -m bench --only side_slot [--quick]`` or ``python bench/side_slot_bench.py
[--quick]`` (writes ``bench/results/side_slot.json``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
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
from loki_shared import subjects
from loki_shared.lease import LeaseError
from loki_shared.lease import lease as engine_lease
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
)

TIMEOUT_S = {"quick": 900, "full": 2400}
CTX = 4096

CONFIGS = [
    ("one slot, CACHE_RAM 0", {"LOKI_SIDE_SLOT": "off", "LOKI_CACHE_RAM": "0"}),
    ("one slot, CACHE_RAM default", {"LOKI_SIDE_SLOT": "off"}),
    ("SIDE_SLOT on", {"LOKI_SIDE_SLOT": "on", "LOKI_CACHE_RAM": "0"}),
]

TOPICS = [
    "the tides",
    "bread baking",
    "old bridges",
    "mountain weather",
    "river fish",
    "city gardens",
    "paper maps",
    "wind mills",
    "glass making",
    "night trains",
]


def user_message(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    facts = " ".join(
        f"Note {j} about {topic}: it matters for reason {j * 7 % 11}." for j in range(8)
    )
    return f"Turn {i}. Tell me one short thing about {topic}. Context: {facts}"


def side_context(i: int) -> str:
    items = ", ".join(f"item {k} weighs {(k * 37 + i) % 101} grams" for k in range(40))
    return f"The inventory of job {i}: {items}."


class _Leases:
    """The chat service's lease seam (:class:`loki_chat.leases.EngineLeases`) on a bare NATS
    connection, recording every side lease's release reply."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.held: list[Any] = []

    def lease(self, cid: str, kind: str = "main", stop: asyncio.Event | None = None) -> Any:
        held = engine_lease(
            self.nc, LeaseRequest(kind=kind, conversation=cid, wait_s=120), timeout=130, stop=stop
        )
        self.held.append(held)
        return held


class _Bus:
    def publish_perf(self, record: Any) -> None:
        """Perf records are not collected here (the bench reads the engine's timings)."""


async def side_job(nc, http: httpx.AsyncClient, i: int, request: str, answer: str) -> dict:
    """One real side job of the chat service after turn ``i``: the verifier on even turns, a
    sub-agent on odd ones. Returns its kind, slot and whether slot 0 was erased after it."""
    from types import SimpleNamespace

    from loki_chat.engine import EngineClient
    from loki_chat.settings import Settings
    from loki_chat.subagent import run_subagent
    from loki_chat.tools import ToolBox
    from loki_chat.tools.box import CallContext
    from loki_chat.verify import run_verify

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        temperature=0.0,
        max_tokens=8,
        verify_max_tokens=16,
        subagent_step_budget=1,
    )
    engine = EngineClient(http, [0.8, 1.6, 3.2])
    leases = _Leases(nc)
    stop = asyncio.Event()
    if i % 2 == 0:
        kind = "verify"
        outcome = await run_verify(
            settings=settings,
            engine=engine,
            lease=lambda: leases.lease("bench", "verify", stop),
            conversation="bench",
            request=request + " " + side_context(i),
            answer=answer,
            stop=stop,
            publish_perf=_Bus().publish_perf,
        )
        if outcome.verdict is None:
            raise _common.BenchError("the verifier was stopped")
    else:
        kind = "subagent"
        shared = SimpleNamespace(
            settings=settings, toolbox=ToolBox(), engine=engine, leases=leases, bus=_Bus()
        )
        shared.tokens = None

        async def emit(*_a: Any, **_k: Any) -> None:
            return None

        call = CallContext(f"c{i}", "bench", stop, emit)
        text = await run_subagent(
            shared, {"task": "Is this inventory consistent?", "context": side_context(i)}, call
        )
        if text.startswith(("Error", "Stopped")):
            raise _common.BenchError(f"sub-agent: {text}")
    last = leases.held[-1]
    rel = last.release_reply
    if not (last.released and rel is not None):
        raise _common.BenchError(f"the {kind} job's last lease was not released")
    return {"kind": kind, "slot": last.lease.id_slot, "erased": bool(rel.slot_erased)}


async def request(nc, subject: str, msg, reply_type, timeout: float = 30.0):
    r = await nc.request(subject, msg.model_dump_json().encode(), timeout=timeout)
    return reply_type.model_validate_json(r.data)


async def wait_ready(nc, proc: subprocess.Popen, timeout: float = 300.0) -> EngineInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _common.BenchError(f"supervisor exited with {proc.returncode}")
        try:
            info = await request(nc, subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2)
            if info.state == "ready":
                return info
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        await asyncio.sleep(0.3)
    raise _common.BenchError("engine not ready in time")


async def completion(client: httpx.AsyncClient, lease: Lease, messages: list[dict]) -> dict:
    """One streamed main request: its text, ``usage``, ``timings``, ``_wall_s`` and
    ``_ttft_s`` (to the first delta of any type)."""
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "cache_prompt": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if lease.id_slot is not None:
        body["id_slot"] = lease.id_slot
    headers = {"Authorization": f"Bearer {lease.api_key}"} if lease.api_key else {}
    t0 = time.perf_counter()
    ttft = None
    text = ""
    data: dict[str, Any] = {}
    url = f"{lease.base_url}/v1/chat/completions"
    async with client.stream("POST", url, json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if ttft is None and any(delta.get(k) for k in ("content", "reasoning_content")):
                    ttft = time.perf_counter() - t0
                text += delta.get("content") or ""
            for key in ("usage", "timings"):
                if chunk.get(key):
                    data[key] = chunk[key]
    data["_wall_s"] = time.perf_counter() - t0
    data["_ttft_s"] = ttft if ttft is not None else data["_wall_s"]
    data["text"] = text
    return data


async def conversation(nc, turns: int) -> dict[str, Any]:
    """Run the scripted conversation; return per-turn figures."""
    messages: list[dict] = [{"role": "system", "content": "You are a brief assistant."}]
    rows = []
    async with httpx.AsyncClient(timeout=600) as client:
        for i in range(turns):
            messages.append({"role": "user", "content": user_message(i)})
            main = LeaseRequest(kind="main", conversation="bench", wait_s=120)
            try:
                async with engine_lease(nc, main) as held:
                    lease = held.lease
                    data = await completion(client, lease, messages)
                    usage = data.get("usage") or {}
                    held.report(
                        usage.get("prompt_tokens"),
                        (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                    )
            except LeaseError as exc:
                raise _common.BenchError(f"lease: {exc}") from exc
            t = data.get("timings") or {}
            rows.append(
                {
                    "turn": i,
                    "slot": lease.id_slot,
                    "cache_n": t.get("cache_n"),
                    "prompt_n": t.get("prompt_n"),
                    "wall_s": data["_wall_s"],
                    "ttft_s": data["_ttft_s"],
                    "after_side_job": i > 0,
                }
            )
            answer = data["text"] or "ok"
            messages.append({"role": "assistant", "content": answer})
            if i == turns - 1:
                break
            try:
                side = await side_job(nc, client, i, user_message(i), answer)
            except LeaseError as exc:
                raise _common.BenchError(f"side lease: {exc}") from exc
            rows[-1]["side_job"] = side["kind"]
            rows[-1]["side_slot"] = side["slot"]
            rows[-1]["slot_erased_after"] = side["erased"]
    return {"turns": rows}


def run_config(name: str, extra_env: dict[str, str], turns: int, root: Path) -> dict[str, Any]:
    """One supervisor (own NATS and Redis) with ``extra_env``; the conversation through it."""
    home = root / name.replace(" ", "_").replace(",", "")
    env = {
        "LOKI_SECRET_KEY": "bench-side-slot-key",
        "LOKI_CTX": str(CTX),
        "LOKI_ENGINE_THREADS": "2",
        **extra_env,
    }
    with _common.supervisor_alone(home, env) as (nats_url, sup):

        async def go() -> dict[str, Any]:
            nc = await nats.connect(nats_url)
            try:
                info = await wait_ready(nc, sup)
                out = await conversation(nc, turns)
                out["engine"] = {
                    "total_slots": info.total_slots,
                    "slot_n_ctx": info.slot_n_ctx,
                    "side_slot": info.side_slot,
                    "argv": info.argv,
                    "build_info": info.build_info,
                    "base_url": info.base_url,
                }
                out["engine_build"] = _common.engine_build(info.base_url)
                return out
            finally:
                await nc.drain()

        return asyncio.run(go())


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Figures over the turns that follow a side job: share of the previous turn's prompt
    (a strict prefix of this one) served from cache (``cache_n / previous prompt tokens``,
    capped at 1: the previous reply may be cached too), tokens recomputed, wall time of the
    main request."""
    after = []
    for prev, row in zip(rows, rows[1:]):
        if row["after_side_job"] and row["cache_n"] is not None and prev["cache_n"] is not None:
            row["restored_share"] = min(
                1.0, row["cache_n"] / max(1, prev["cache_n"] + prev["prompt_n"])
            )
            after.append(row)
    shares = [r["restored_share"] for r in after]
    return {
        "turns_after_side_job": len(after),
        "cache_share_median": statistics.median(shares) if shares else None,
        "cache_n_sum": sum(r["cache_n"] for r in after),
        "prompt_n_sum": sum(r["prompt_n"] for r in after),
        "main_wall_s_median": statistics.median(r["wall_s"] for r in after) if after else None,
        "main_ttft_s_median": statistics.median(r["ttft_s"] for r in after) if after else None,
        "side_jobs": sorted({r["side_job"] for r in rows if r.get("side_job")}),
    }


def run(quick: bool) -> dict[str, Any]:
    turns = 3 if quick else 8
    results: dict[str, Any] = {}
    engine = None
    with tempfile.TemporaryDirectory(prefix="loki-side-slot-") as tmp:
        for name, env in CONFIGS:
            out = run_config(name, env, turns, Path(tmp))
            out["summary"] = summarize(out["turns"])
            results[name] = out
            engine = engine or out.get("engine_build")
    rows = []
    for name, out in results.items():
        s = out["summary"]
        rows.append(
            [
                name,
                out["engine"]["total_slots"],
                s["turns_after_side_job"],
                None if s["cache_share_median"] is None else round(s["cache_share_median"], 3),
                s["cache_n_sum"],
                s["prompt_n_sum"],
                None if s["main_wall_s_median"] is None else round(s["main_wall_s_median"], 3),
                None if s["main_ttft_s_median"] is None else round(s["main_ttft_s_median"], 3),
            ]
        )
    off = results["one slot, CACHE_RAM 0"]["summary"]
    on = results["SIDE_SLOT on"]["summary"]
    speed = (
        _common.ratio(on["main_wall_s_median"], off["main_wall_s_median"])
        if on["main_wall_s_median"] and off["main_wall_s_median"]
        else None
    )
    targets = [
        _common.target(
            "SIDE_SLOT on: previous prompt restored after a side job (median share)",
            on["cache_share_median"],
            ">=",
            0.95,
            issue="6",
        ),
        _common.target(
            "one slot, CACHE_RAM 0: previous prompt restored after a side job",
            off["cache_share_median"],
            "<=",
            0.1,
            issue="6",
        ),
        _common.target(
            "SIDE_SLOT on / one slot: main request time after a side job",
            speed,
            "<=",
            1.0,
            issue="6",
        ),
    ]
    table = _common.table(
        "Conversation turns that follow a side job (same run, same machine)",
        [
            "configuration",
            "slots",
            "turns",
            "previous prompt restored (median)",
            "cache_n (sum)",
            "prompt_n recomputed (sum)",
            "main request s (median)",
            "main TTFT s (median)",
        ],
        rows,
        notes=f"CTX {CTX}; bundled SmolLM2-135M on CPU; side jobs = the chat service's own "
        "verifier and sub-agent requests, alternately (loki_chat.verify.run_verify, "
        "loki_chat.subagent.run_subagent; a ~700-token inventory in each), the last lease "
        "of each released with job_done (CACHE_ISOLATE on).",
    )
    return _common.result(
        "SIDE_SLOT: the conversation keeps its slot beside side jobs",
        tables=[table],
        targets=targets,
        data={"turns": turns, "configs": results},
        notes="restored share = cache_n of the conversation's request right after a side job "
        "/ prompt tokens of its previous request (a strict prefix), capped at 1. With one "
        "slot and no host-RAM cache the side job evicts the conversation; llama-server's "
        "host-RAM cache can copy it back while it fits (8 GiB default); SIDE_SLOT keeps it "
        "in slot 0.",
        engine=engine,
    )


def _show_tables(doc: dict[str, Any]) -> None:
    for table in doc["tables"]:
        for row in table["rows"]:
            print(row)


def main() -> None:
    _common.main_alone(
        "side_slot", run, __doc__.splitlines()[0], "3 turns instead of 8", show=_show_tables
    )


if __name__ == "__main__":
    main()
