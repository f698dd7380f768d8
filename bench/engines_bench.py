"""ENGINES: several llama-servers behind one Loki, conversations routed to the cache (issue 44).

One run, the same machine, real processes on loopback: NATS, Redis, the engine supervisor
(``python -m loki_supervisor``, following the engines: it launches none) and real
llama-servers with the bundled model on CPU, every one given the same ``--slot-save-path``.
A driver plays a session of ``convs`` conversations × ``turns`` turns, interleaved (one
asyncio task per conversation, all at once), with side work between turns (a ``task`` request
with its own prompt every ``side_every`` turns of a conversation). Every request is what the
chat service does around one completion: an engine lease (:class:`loki_shared.lease.EngineLease`
with the kind, the conversation and ``prompt_fingerprints``), a streamed
``POST {base_url}/v1/chat/completions`` with the lease's ``id_slot`` and ``cache_prompt``,
then the release with the usage. The engine's ``timings`` (``cache_n``, ``prompt_n``,
``prompt_ms``) give the figures.

Parts, each its own supervisor (Redis flushed, the engines' slots erased between them):

- (a) ``baseline``: the session on ONE engine with enough slots (``convs + 2``);
- (b) ``affine`` over two engines (``convs // 2 + 1`` slots each), (c) ``round_robin``,
  (d) ``least_busy``: the same session, ``LOKI_ENGINE_ROUTING`` set to each policy;
- (e) a forced move: two conversations on two engines, then the engine holding the first one
  is killed (SIGKILL) and its next turn lands on the other engine, with slot transfer
  (``LOKI_ENGINE_SLOT_DIR`` = the engines' ``--slot-save-path``) and without (empty): the
  tokens that turn recomputed and its time to first token;
- (f) a supervisor kill: two supervisors with ``LOKI_SUPERVISOR_REPLICATED=true``; the
  leader gets SIGKILL mid-session: turns lost, turns without an end, the pause it caused.

Recomputation ratio = Σ``prompt_n`` / Σ(``prompt_n`` + ``cache_n``) over the main turns (side
work reported apart). A part that cannot run (pool mode or a helper's part absent from the
tree) is reported as ``not run: <why>`` with no figures.

Usage: ``python -m bench --only engines [--quick]`` or ``python bench/engines_bench.py
[--quick]`` (writes ``bench/results/engines.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common
from loki_shared import servers, subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.lease import LeaseError, LeaseStopped
from loki_shared.lease import lease as engine_lease
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, Lease, LeaseRequest

TIMEOUT_S = {"quick": 900, "full": 1500}

#: Tokens of one slot's window (every engine, every slot).
SLOT_CTX = 3072
#: llama-server threads of the one engine of (a); each of the two engines gets half (the
#: same cores in all: the machine has two).
THREADS = 2
SYSTEM = "You are a brief assistant. Answer in one short sentence."

WORDS = (
    "river stone lantern harbor copper meadow quiet orbit violet canyon ember signal "
    "timber glacier pepper saddle marble velvet thunder willow cobalt falcon orchard "
    "prism tundra beacon cedar dune fable garnet hollow ivory jasper kettle lagoon "
    "mantle nectar onyx pebble quartz raven sable thistle umber vessel wharf yarrow "
    "zephyr anchor bramble cinder delta ferry grove heron inlet juniper kiln ledger"
).split()


@dataclass(frozen=True)
class Plan:
    """The session's size: ``convs`` conversations × ``turns`` turns, a side ``task`` after
    every ``side_every``-th turn of a conversation, user messages of ``words`` words (about
    1.3 tokens each), answers of ``max_tokens`` tokens at most."""

    convs: int
    turns: int
    side_every: int
    words: int
    max_tokens: int = 12


FULL = Plan(convs=8, turns=12, side_every=3, words=40)
QUICK = Plan(convs=4, turns=4, side_every=2, words=40)


def user_text(conv: int, turn: int, words: int) -> str:
    """Turn ``turn``'s user message of conversation ``conv``: ``words`` varied words,
    deterministic (the same in every part of the run)."""
    rng = random.Random(f"user-{conv}-{turn}")
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Conversation {conv}, message {turn}. Notes: {body}. Which word came first?"


def side_text(conv: int, turn: int, words: int) -> str:
    """A side task's own prompt (nothing in common with the conversation but its id)."""
    rng = random.Random(f"side-{conv}-{turn}")
    items = ", ".join(f"{rng.choice(WORDS)} {rng.randint(1, 999)}" for _ in range(words // 2))
    return f"Task for conversation {conv} after turn {turn}: count the items: {items}."


# --------------------------------------------------------------------------- one request
@dataclass
class Row:
    """One request of the session as measured: ``kind`` ``main`` or ``task``; placement
    fields from ``Lease.placement`` (None without a pool); ``prompt_n``/``cache_n``/
    ``prompt_ms`` from the engine's ``timings``; ``ttft_s`` client time to the first token;
    ``lease_s`` time waiting for the grant; ``error`` why it failed (None: it ended)."""

    conv: int
    turn: int
    kind: str
    started: float = 0.0
    granted: float | None = None
    ended: float | None = None
    engine: str | None = None
    base_url: str = ""
    id_slot: int | None = None
    reason: str | None = None
    prefix: int | None = None
    moved_from: str | None = None
    transfer: str | None = None
    restored_tokens: int | None = None
    prompt_n: int | None = None
    cache_n: int | None = None
    prompt_ms: float | None = None
    ttft_s: float | None = None
    lease_s: float | None = None
    text: str = ""
    error: str | None = None


async def completion(
    client: httpx.AsyncClient, lease: Lease, messages: list[dict[str, Any]], max_tokens: int
) -> dict[str, Any]:
    """One streamed request as the chat sends it (``id_slot`` only when the lease names one):
    returns ``text``, ``timings``, ``usage`` and ``ttft_s`` (seconds to the first delta with
    text; the whole request when none came).

    Raises:
        httpx.HTTPError: the engine refused or the connection failed.
    """
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
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
    out: dict[str, Any] = {"text": ""}
    async with client.stream(
        "POST", f"{lease.base_url}/v1/chat/completions", json=body, headers=headers
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if ttft is None and (delta.get("content") or delta.get("reasoning_content")):
                    ttft = time.perf_counter() - t0
                out["text"] += delta.get("content") or ""
            for key in ("usage", "timings"):
                if chunk.get(key):
                    out[key] = chunk[key]
    out["ttft_s"] = ttft if ttft is not None else time.perf_counter() - t0
    return out


async def one_request(
    nc: Any,
    client: httpx.AsyncClient,
    row: Row,
    messages: list[dict[str, Any]],
    conversation: str,
    plan: Plan,
    wait_s: float = 240.0,
) -> Row:
    """Lease, complete, release (with the usage; ``job_done`` for a side task) and fill
    ``row``; a failure is recorded in ``row.error``, never raised."""
    fps = fingerprints(messages)
    request = LeaseRequest(
        kind=row.kind,  # type: ignore[arg-type]
        conversation=conversation,
        wait_s=wait_s,
        prompt_fingerprints=fps,
    )
    row.started = time.monotonic()
    try:
        async with engine_lease(nc, request, timeout=wait_s + 10) as held:
            row.granted = time.monotonic()
            row.lease_s = row.granted - row.started
            lease = held.lease
            row.base_url, row.id_slot = lease.base_url, lease.id_slot
            if lease.placement is not None:
                p = lease.placement
                row.engine, row.reason, row.prefix = p.engine, p.reason, p.prefix
                row.moved_from, row.transfer = p.moved_from, p.transfer
                row.restored_tokens = p.restored_tokens
            data = await completion(client, lease, messages, plan.max_tokens)
            usage = data.get("usage") or {}
            held.report(
                usage.get("prompt_tokens"),
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                job_done=row.kind != "main",
                prompt_fingerprint=fps[-1] if row.kind == "main" else None,
            )
        t = data.get("timings") or {}
        row.prompt_n, row.cache_n, row.prompt_ms = t.get("prompt_n"), t.get("cache_n"), None
        if t.get("prompt_ms") is not None:
            row.prompt_ms = round(float(t["prompt_ms"]), 1)
        row.ttft_s = round(data["ttft_s"], 3)
        row.text = data["text"]
        row.ended = time.monotonic()
    except (LeaseError, LeaseStopped, httpx.HTTPError, OSError, ValueError) as exc:
        row.error = f"{type(exc).__name__}: {exc}"[:300]
    return row


# --------------------------------------------------------------------------- the session
@dataclass
class Session:
    """The driver: one task per conversation, turns in order within it, all conversations
    at once. ``tag`` names the conversations; ``rows`` collects every request;
    ``messages[c]`` is conversation ``c`` so far (the assistant's answers kept)."""

    plan: Plan
    tag: str = "bench"
    rows: list[Row] = field(default_factory=list)
    messages: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def conversation_id(self, conv: int) -> str:
        """``<tag>-c<conv>``: each part its own conversations (no slot file of one part is
        ever another's)."""
        return f"{self.tag}-c{conv}"

    async def turn(self, nc: Any, client: httpx.AsyncClient, conv: int, turn: int) -> Row:
        """Conversation ``conv``'s turn ``turn`` (``main``), then its side task when due."""
        msgs = self.messages.setdefault(conv, [{"role": "system", "content": SYSTEM}])
        msgs.append({"role": "user", "content": user_text(conv, turn, self.plan.words)})
        row = Row(conv, turn, "main")
        self.rows.append(row)
        await one_request(nc, client, row, list(msgs), self.conversation_id(conv), self.plan)
        msgs.append({"role": "assistant", "content": row.text.strip() or "ok"})
        if self.plan.side_every and turn % self.plan.side_every == self.plan.side_every - 1:
            side = Row(conv, turn, "task")
            self.rows.append(side)
            task_msgs = [
                {"role": "system", "content": "You count items."},
                {"role": "user", "content": side_text(conv, turn, self.plan.words)},
            ]
            await one_request(nc, client, side, task_msgs, self.conversation_id(conv), self.plan)
        return row

    async def play(
        self,
        nc: Any,
        turns: range,
        convs: range | None = None,
        stagger_s: float = 0.15,
    ) -> None:
        """Play ``turns`` of each conversation of ``convs`` (default all), interleaved."""
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as client:

            async def one(conv: int) -> None:
                await asyncio.sleep(conv * stagger_s)
                for t in turns:
                    await self.turn(nc, client, conv, t)

            await asyncio.gather(*(one(c) for c in (convs or range(self.plan.convs))))


def recompute_ratio(rows: list[Row]) -> float | None:
    """Σprompt_n / Σ(prompt_n + cache_n) over ``rows`` that have both (None: none has)."""
    pairs = [(r.prompt_n, r.cache_n) for r in rows]
    done = [(p, c) for p, c in pairs if p is not None and c is not None]
    total = sum(p + c for p, c in done)
    return round(sum(p for p, _ in done) / total, 4) if total else None


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The figures of one session: main and side recomputation ratios and token sums,
    prompt_ms and TTFT (median, p90) of the main turns, placements (reasons, moves,
    transfers, main turns per engine), turns failed and their errors."""
    main = [r for r in rows if r.kind == "main" and r.error is None]
    side = [r for r in rows if r.kind != "main" and r.error is None]
    prompt_ms = [r.prompt_ms for r in main if r.prompt_ms is not None]
    ttft = [r.ttft_s for r in main if r.ttft_s is not None]
    lease_s = [r.lease_s for r in rows if r.lease_s is not None]
    return {
        "main_turns": len(main),
        "side_requests": len(side),
        "failed": sum(r.error is not None for r in rows),
        "errors": sorted({r.error for r in rows if r.error})[:5],
        "main_ratio": recompute_ratio(main),
        "side_ratio": recompute_ratio(side),
        "main_prompt_n": sum(r.prompt_n or 0 for r in main),
        "main_cache_n": sum(r.cache_n or 0 for r in main),
        "side_prompt_n": sum(r.prompt_n or 0 for r in side),
        "prompt_ms_median": round(statistics.median(prompt_ms), 1) if prompt_ms else None,
        "prompt_ms_p90": round(_common.percentile(prompt_ms, 90), 1) if prompt_ms else None,
        "ttft_s_median": round(statistics.median(ttft), 3) if ttft else None,
        "ttft_s_p90": round(_common.percentile(ttft, 90), 3) if ttft else None,
        "lease_s_max": round(max(lease_s), 3) if lease_s else None,
        "reasons": dict(Counter(r.reason or "-" for r in rows if r.error is None)),
        "moves": sum(r.moved_from is not None for r in main),
        "transfers": dict(Counter(r.transfer for r in main if r.transfer)),
        "main_per_engine": dict(Counter(r.engine or r.base_url for r in main)),
        "side_apart": sum(_side_apart(rows, r) for r in side),
    }


def _side_apart(rows: list[Row], side: Row) -> bool:
    """The side request ran on another engine than its conversation's turn just before it."""
    main = [r for r in rows if r.kind == "main" and r.conv == side.conv and r.turn == side.turn]
    return bool(main and main[0].engine and side.engine and main[0].engine != side.engine)


# --------------------------------------------------------------------------- processes
@dataclass
class Infra:
    """NATS and Redis of the run (no ACL users), a scratch directory ``root`` and the
    engines' shared ``--slot-save-path`` ``slot_dir`` (``root/slots``)."""

    root: Path
    nats: servers.RunningServer
    redis: servers.RunningServer

    @property
    def slot_dir(self) -> Path:
        return self.root / "slots"

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def fresh(self, engines: list[EngineProc]) -> None:
        """Start a part cold: Redis flushed, the slot files of earlier parts removed,
        every slot of ``engines`` erased."""
        self.flush_redis()
        for path in self.slot_dir.iterdir():
            path.unlink()
        for e in engines:
            e.erase_slots()

    def flush_redis(self) -> None:
        """Forget everything a previous part's supervisor stored (presets, leases, the
        slot book, the leader key)."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            client.flushall()
        finally:
            client.close()


@contextlib.contextmanager
def infra(root: Path) -> Iterator[Infra]:
    """Start NATS and Redis under ``root`` (and make ``root/slots``); stopped on exit."""
    (root / "slots").mkdir(parents=True, exist_ok=True)
    nats_server = servers.start_nats(root / "nats")
    try:
        redis_server = servers.start_redis(root / "redis")
        try:
            yield Infra(root, nats_server, redis_server)
        finally:
            redis_server.stop()
    finally:
        nats_server.stop()


def engine_flags() -> list[str]:
    """Flags every engine gets beside ``-np``/``-c``: one window per slot
    (``--no-kv-unified``) and no host-RAM prompt cache (``--cache-ram 0``: a prompt evicted
    from a slot is not copied back from RAM, so the figures measure the routing alone), each
    only when this llama-server's ``--help`` lists it."""
    try:
        out = subprocess.run(
            [str(servers.find_llama_server()), "--help"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    flags: list[str] = []
    if "--no-kv-unified" in text:
        flags.append("--no-kv-unified")
    if "--cache-ram" in text:
        flags += ["--cache-ram", "0"]
    return flags


@dataclass
class EngineProc:
    """A llama-server of the run: its pool name, slots, URL and process."""

    name: str
    slots: int
    server: servers.RunningServer
    threads: int = THREADS

    @property
    def url(self) -> str:
        return self.server.url

    def kill(self) -> None:
        """SIGKILL (a crash, not a stop)."""
        self.server.process.kill()

    def stop(self) -> None:
        self.server.stop(grace=5)

    def erase_slots(self) -> None:
        """Empty every slot (``POST /slots/{i}?action=erase``) so a part starts cold."""
        with httpx.Client(timeout=30) as client:
            for i in range(self.slots):
                client.post(f"{self.url}/slots/{i}", params={"action": "erase"})


def start_engine(
    name: str, slots: int, slot_dir: Path, flags: list[str], threads: int = THREADS
) -> EngineProc:
    """A llama-server with the bundled model: ``slots`` slots of :data:`SLOT_CTX` tokens,
    ``threads`` threads, ``--slot-save-path slot_dir``.

    Raises:
        loki_shared.servers.ServerNotFound, loki_shared.servers.ServerStartError.
    """
    server = servers.start_llama(
        ctx=slots * SLOT_CTX,
        parallel=slots,
        threads=threads,
        extra=["--slot-save-path", str(slot_dir), *flags],
        timeout=180,
    )
    return EngineProc(name, slots, server, threads)


def pool_env(engines: list[EngineProc], routing: str, slot_dir: Path | None) -> dict[str, str]:
    """The supervisor's environment for a pool of ``engines``."""
    return {
        "LOKI_ENGINE_URLS": ",".join(f"{e.name}={e.url}" for e in engines),
        "LOKI_ENGINE_ROUTING": routing,
        "LOKI_ENGINE_SLOT_DIR": str(slot_dir) if slot_dir else "",
    }


def start_supervisor(ifr: Infra, home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m loki_supervisor`` with the run's NATS and Redis, data and
    ``supervisor.log`` under ``home``; ``env`` added to this process's environment less its
    ``LOKI_*`` variables."""
    home.mkdir(parents=True, exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    full.update(
        LOKI_NATS_URL=ifr.nats_url,
        LOKI_REDIS_URL=ifr.redis_url,
        LOKI_HOME=str(home),
        LOKI_SECRET_KEY="bench-engines-key-0123456789",
        PYTHONUNBUFFERED="1",
        **env,
    )
    with open(home / "supervisor.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "loki_supervisor"],
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=_common.REPO_ROOT,
        )


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def info(nc: Any, timeout: float = 2.0) -> EngineInfo:
    """``loki.engine.info`` once.

    Raises:
        nats.errors.TimeoutError, nats.errors.NoRespondersError: no supervisor answered.
    """
    r = await nc.request(
        subjects.ENGINE_INFO, EngineInfoRequest().model_dump_json().encode(), timeout=timeout
    )
    return EngineInfo.model_validate_json(r.data)


async def wait_ready(
    nc: Any, procs: list[subprocess.Popen[bytes]], engines: int, timeout: float = 120.0
) -> EngineInfo:
    """Wait until the supervisor says ``ready`` and, with a pool, lists ``engines`` ready
    engines (``engines`` 0: no pool expected).

    Raises:
        bench._common.BenchError: a supervisor exited or it was not ready in time.
    """
    deadline = time.monotonic() + timeout
    last: EngineInfo | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise _common.BenchError(f"supervisor exited with {p.returncode}")
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
            last = await info(nc)
            ready = [e for e in last.engines if e.state == "ready"]
            if last.state == "ready" and (engines == 0 or len(ready) >= engines):
                return last
        await asyncio.sleep(0.3)
    state = None if last is None else (last.state, [(e.id, e.state) for e in last.engines])
    raise _common.BenchError(f"supervisor not ready in {timeout:.0f} s (last: {state})")


def _supervisor_source() -> str:
    """The text of the supervisor package's modules (where a helper's part is wired in)."""
    import importlib.util

    spec = importlib.util.find_spec("loki_supervisor")
    if spec is None or not spec.submodule_search_locations:
        return ""
    folder = Path(next(iter(spec.submodule_search_locations)))
    return "\n".join(p.read_text() for p in sorted(folder.glob("*.py")) if p.name != "settings.py")


def pool_present() -> str | None:
    """None when this tree's supervisor follows ``LOKI_ENGINE_URLS`` as a pool; else why
    not (the parts that need it are then reported as not run)."""
    if "settings.engine_urls" not in _supervisor_source():
        return "pool mode (LOKI_ENGINE_URLS) is not wired into the supervisor in this tree"
    return None


def replicas_present() -> str | None:
    """None when replicated supervisors (``LOKI_SUPERVISOR_REPLICATED``) are wired in this
    tree; else why not."""
    if "settings.supervisor_replicated" not in _supervisor_source():
        return "replicated supervisors (LOKI_SUPERVISOR_REPLICATED) are not wired in this tree"
    return pool_present()


def transfer_present() -> str | None:
    """None when slot transfer (``LOKI_ENGINE_SLOT_DIR``) is wired in this tree; else why
    not."""
    if "engine_slot_dir" not in _supervisor_source():
        return "slot transfer (LOKI_ENGINE_SLOT_DIR) is not wired in this tree"
    return pool_present()


# --------------------------------------------------------------------------- parts
#: Part (f): lease requests made up to this many seconds after the leader's kill count
#: towards the pause it caused (the leader's key lives 3 s unrenewed by default).
PAUSE_WINDOW_S = 10.0
#: Part (f): seconds the session may run on after the kill; a request still running then is
#: a turn without an end.
KILL_DEADLINE_S = 300.0


def run_session(
    ifr: Infra,
    label: str,
    env: dict[str, str],
    engines: list[EngineProc],
    plan: Plan,
    pool: bool = True,
) -> dict[str, Any]:
    """One supervisor with ``env`` (pool of ``engines`` when ``pool``), the whole session
    through it; returns its rows, summary, wall time and the supervisor's ``info``."""
    ifr.fresh(engines)
    sup = start_supervisor(ifr, ifr.root / label, env)
    try:

        async def go() -> dict[str, Any]:
            nc = await nats.connect(ifr.nats_url)
            try:
                await wait_ready(nc, [sup], len(engines) if pool else 0)
                session = Session(plan, label)
                t0 = time.monotonic()
                await session.play(nc, range(plan.turns))
                wall = time.monotonic() - t0
                after = await info(nc)
                return {
                    "rows": [_row_dict(r) for r in session.rows],
                    "summary": summarize(session.rows),
                    "wall_s": round(wall, 1),
                    "engines": [
                        e.model_dump(include={"id", "grants", "moves_in", "restores", "saves"})
                        for e in after.engines
                    ],
                    "routing": after.routing,
                }
            finally:
                await nc.drain()

        out = asyncio.run(go())
        out["slot_files"] = sum(1 for _ in ifr.slot_dir.iterdir())  # left by this part
        return out
    finally:
        stop_process(sup)


def _row_dict(row: Row) -> dict[str, Any]:
    d = dict(row.__dict__)
    d.pop("text", None)
    d.pop("base_url", None)
    for key in ("started", "granted", "ended"):
        d.pop(key, None)
    return d


def forced_move(
    ifr: Infra,
    label: str,
    engines: list[EngineProc],
    slot_dir: Path | None,
    plan: Plan,
    idle_wait_s: float = 4.0,
) -> dict[str, Any]:
    """Part (e): two conversations play ``turns - 1`` turns over the two engines; after
    ``idle_wait_s`` (the supervisor's idle-save runs ~2 s after a main turn) the engine
    holding conversation 0 is killed (SIGKILL); once the supervisor no longer lists it
    ready, conversation 0 plays its last turn, which lands on the other engine. Returns
    that turn's row, the turn before it, and the killed engine's name. The killed engine is
    NOT restarted here (the caller does)."""
    ifr.fresh(engines)
    env = pool_env(engines, "affine", slot_dir)
    sup = start_supervisor(ifr, ifr.root / label, env)
    small = Plan(convs=2, turns=plan.turns, side_every=0, words=plan.words)
    try:

        async def go() -> dict[str, Any]:
            nc = await nats.connect(ifr.nats_url)
            try:
                await wait_ready(nc, [sup], len(engines))
                session = Session(small, label)
                await session.play(nc, range(small.turns - 1))
                before = [r for r in session.rows if r.conv == 0][-1]
                victim = next(
                    (e for e in engines if e.name == before.engine or e.url == before.base_url),
                    None,
                )
                if victim is None:
                    raise _common.BenchError(f"conversation 0's engine unknown: {before}")
                await asyncio.sleep(idle_wait_s)
                victim.kill()
                t_kill = time.monotonic()
                gone = await _wait_engine_down(nc, victim.name, 60)
                async with httpx.AsyncClient(timeout=600) as client:
                    moved = await session.turn(nc, client, 0, small.turns - 1)
                return {
                    "killed": victim.name,
                    "down_seen_s": round(gone - t_kill, 2) if gone else None,
                    "before": _row_dict(before),
                    "moved": _row_dict(moved),
                    "moved_prompt_tokens": (moved.prompt_n or 0) + (moved.cache_n or 0),
                }
            finally:
                await nc.drain()

        out = asyncio.run(go())
        out["slot_files"] = sum(1 for _ in ifr.slot_dir.iterdir())  # left by this part
        return out
    finally:
        stop_process(sup)


async def _wait_engine_down(nc: Any, name: str, timeout: float) -> float | None:
    """Monotonic time when the supervisor first lists engine ``name`` as not ready (None:
    not within ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
            now = await info(nc)
            if any(e.id == name and e.state != "ready" for e in now.engines):
                return time.monotonic()
        await asyncio.sleep(0.2)
    return None


def supervisor_kill(
    ifr: Infra, engines: list[EngineProc], slot_dir: Path, plan: Plan
) -> dict[str, Any]:
    """Part (f): two supervisors (``LOKI_SUPERVISOR_REPLICATED=true``) follow the pool;
    the session plays; when a third of its main turns ended, the leader gets SIGKILL.
    Returns turns planned/ended/lost (a request that failed)/without an end (still running
    at the deadline), the longest lease wait of the turns that asked across the kill, the
    leaders before and after."""
    ifr.fresh(engines)
    env = {**pool_env(engines, "affine", slot_dir), "LOKI_SUPERVISOR_REPLICATED": "true"}
    procs: list[subprocess.Popen[bytes]] = []
    try:

        async def go() -> dict[str, Any]:
            nc = await nats.connect(ifr.nats_url)
            try:
                # the first instance alone: it takes the leader key, so the leader's process
                # is known without reading any process's id out of the supervisor
                procs.append(start_supervisor(ifr, ifr.root / "replica0", env))
                alone = await wait_ready(nc, procs, len(engines))
                leader = await _leader(nc, 30)
                if leader != alone.instance:
                    raise _common.BenchError(
                        f"the only instance {alone.instance!r} is not the leader ({leader!r})"
                    )
                procs.append(start_supervisor(ifr, ifr.root / "replica1", env))
                seen = await _instances(nc, procs, 2, 60)
                if leader is None or len(seen) < 2:
                    raise _common.BenchError(
                        f"replicas not both up (leader {leader!r}, instances seen {seen})"
                    )
                victim = procs[0]
                session = Session(plan, "kill")
                planned = plan.convs * plan.turns
                player = asyncio.create_task(session.play(nc, range(plan.turns)))
                while sum(r.ended is not None for r in session.rows if r.kind == "main") < (
                    planned // 3
                ):
                    if player.done():
                        break
                    await asyncio.sleep(0.1)
                t_kill = time.monotonic()
                os.kill(victim.pid, signal.SIGKILL)
                # a probe asking at the kill: how long a lease request waits for the new
                # leader (it holds nothing: released at once)
                probe = Row(-1, -1, "bench")
                async with httpx.AsyncClient(timeout=30) as client:
                    await _probe_lease(nc, client, probe)
                victim.wait(10)
                done, _ = await asyncio.wait({player}, timeout=KILL_DEADLINE_S)
                if not done:
                    player.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await player
                after = await _leader(nc, 30)
                main = [r for r in session.rows if r.kind == "main"]
                # requests in flight at the kill (asked, not yet ended), and those waiting for
                # a grant at the kill or asking within PAUSE_WINDOW_S after it
                in_flight = [
                    r
                    for r in session.rows
                    if r.started <= t_kill and (r.ended is None or r.ended >= t_kill)
                ]
                across = [
                    r
                    for r in session.rows
                    if r.started <= t_kill + PAUSE_WINDOW_S
                    and (r.granted is None or r.granted >= t_kill)
                ]
                grants_after = [
                    r.granted - t_kill for r in session.rows if r.granted and r.granted >= t_kill
                ]
                waits = [r.lease_s for r in session.rows if r.lease_s is not None]
                return {
                    "planned_turns": planned,
                    "main_turns_ended": sum(r.ended is not None for r in main),
                    "requests": len(session.rows),
                    "lost": sum(r.error is not None for r in session.rows),
                    "without_end": sum(r.ended is None and r.error is None for r in session.rows),
                    "turns_missing": planned - len(main),
                    "errors": sorted({r.error for r in session.rows if r.error})[:5],
                    "killed_at_turns_ended": sum(
                        r.ended is not None and r.ended < t_kill for r in main
                    ),
                    "in_flight_at_kill": len(in_flight),
                    "in_flight_ended": sum(r.ended is not None for r in in_flight),
                    "probe_lease_s": None if probe.lease_s is None else round(probe.lease_s, 3),
                    "probe_error": probe.error,
                    "asked_across_kill": len(across),
                    "lease_s_max_across_kill": round(max((r.lease_s or 0.0) for r in across), 3)
                    if across
                    else None,
                    "first_grant_after_kill_s": round(min(grants_after), 3)
                    if grants_after
                    else None,
                    "lease_s_median": round(statistics.median(waits), 3) if waits else None,
                    "leader_before": leader,
                    "leader_after": after,
                    "summary": summarize(session.rows),
                }
            finally:
                await nc.drain()

        out = asyncio.run(go())
        out["slot_files"] = sum(1 for _ in ifr.slot_dir.iterdir())  # left by this part
        return out
    finally:
        for p in procs:
            stop_process(p)


async def _probe_lease(nc: Any, client: httpx.AsyncClient, row: Row) -> None:
    """Lease (kind ``bench``, no conversation) and release at once, timing the grant in
    ``row`` (``lease_s``; ``error`` when none came)."""
    row.started = time.monotonic()
    try:
        async with engine_lease(nc, LeaseRequest(kind="bench", wait_s=60), timeout=70):
            row.granted = time.monotonic()
            row.lease_s = row.granted - row.started
        row.ended = time.monotonic()
    except (LeaseError, LeaseStopped) as exc:
        row.error = f"{type(exc).__name__}: {exc}"[:300]


async def _instances(
    nc: Any, procs: list[subprocess.Popen[bytes]], want: int, timeout: float
) -> list[str]:
    """The instance ids seen answering ``loki.engine.info`` (asked until ``want`` distinct
    ones answered or ``timeout`` s passed).

    Raises:
        bench._common.BenchError: a supervisor exited.
    """
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise _common.BenchError(f"supervisor exited with {p.returncode}")
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
            now = await info(nc)
            if now.instance and now.instance not in seen and now.state == "ready":
                seen.append(now.instance)
        await asyncio.sleep(0.1)
    return seen


async def _leader(nc: Any, timeout: float) -> str | None:
    """The leader's instance id as a supervisor reports it (None: none said in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
            now = await info(nc)
            if now.leader:
                return now.leader
        await asyncio.sleep(0.3)
    return None


# --------------------------------------------------------------------------- the run
def not_run(why: str) -> dict[str, Any]:
    return {"not_run": why}


#: Every part, in run order. ``LOKI_BENCH_ENGINES_PARTS=affine,move`` runs only those whose
#: name starts with one of the words (the others say "not run: not selected"): a by-hand run.
PARTS = [
    "baseline",
    "affine",
    "round_robin",
    "least_busy",
    "move_with_transfer",
    "move_without",
    "supervisor_kill",
]


def _selected(name: str) -> bool:
    words = [w for w in os.environ.get("LOKI_BENCH_ENGINES_PARTS", "").split(",") if w.strip()]
    return not words or any(name.startswith(w.strip()) for w in words)


#: Monotonic time after which no part starts (set by :func:`run` from
#: ``LOKI_BENCH_ENGINES_BUDGET_S``, default the mode's ``TIMEOUT_S`` less a margin): a part
#: left out for lack of time is reported "not run: out of time", the others keep their
#: figures (the harness would otherwise kill the whole run at its limit).
_deadline: float | None = None


def _part(name: str, why: str | None, fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)``, or ``not_run`` with why it was not run or how it failed (a failure of
    one part never hides the others' figures). A finished part is appended to the file
    ``LOKI_BENCH_ENGINES_PROGRESS`` names, when set (an interrupted run keeps its figures)."""
    if not _selected(name):
        return not_run("not selected (LOKI_BENCH_ENGINES_PARTS)")
    if why is not None:
        return not_run(why)
    if _deadline is not None and time.monotonic() > _deadline:
        return not_run("out of time (the run's budget was spent by the parts before it)")
    print(f"[engines] {name} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        out: dict[str, Any] = fn(*args)
    except (_common.BenchError, servers.ServerStartError, OSError) as exc:
        return not_run(f"failed: {type(exc).__name__}: {exc}"[:400])
    out["part_s"] = round(time.monotonic() - t0, 1)
    print(f"[engines] {name}: {out['part_s']} s", file=sys.stderr, flush=True)
    progress = os.environ.get("LOKI_BENCH_ENGINES_PROGRESS")
    if progress:
        with open(progress, "a") as f:
            f.write(json.dumps({"part": name, **out}, default=str) + "\n")
    return out


def run(quick: bool) -> dict[str, Any]:
    global _deadline
    plan = QUICK if quick else FULL
    parts: dict[str, Any] = {}
    t_start = time.monotonic()
    default_budget = TIMEOUT_S["quick" if quick else "full"] - 300
    _deadline = t_start + float(os.environ.get("LOKI_BENCH_ENGINES_BUDGET_S") or default_budget)
    flags = engine_flags()
    pool_why = pool_present()
    build: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="loki-engines-") as tmp:
        root = Path(tmp)
        with infra(root) as ifr:
            slot_dir = ifr.slot_dir
            # (a) the same session on one engine with a slot per conversation and more
            one = start_engine("e0", plan.convs + 2, slot_dir, flags)
            try:  # started even when (a) is not selected: its /props are the engine facts
                build = _common.engine_build(one.url)
                if pool_why is None:
                    env = pool_env([one], "affine", slot_dir)
                    parts["baseline"] = _part(
                        "baseline", None, run_session, ifr, "baseline", env, [one], plan
                    )
                else:  # the harness still runs: one engine followed, the engine picks slots
                    env = {"LOKI_ENGINE_URL": one.url}
                    parts["baseline"] = _part(
                        "baseline", None, run_session, ifr, "baseline", env, [one], plan, False
                    )
                    parts["baseline"]["mode"] = "LOKI_ENGINE_URL (no pool in this tree)"
            finally:
                one.stop()
            per = plan.convs // 2 + 1
            half = max(1, THREADS // 2)
            pair = [start_engine(f"e{i + 1}", per, slot_dir, flags, half) for i in range(2)]
            try:
                # (b) affine first: the target; (c), (d) after (e), (f) (reported beside)
                env = pool_env(pair, "affine", slot_dir)
                parts["affine"] = _part(
                    "affine", pool_why, run_session, ifr, "affine", env, pair, plan
                )
                # (e) forced move, with and without slot transfer
                why = transfer_present()
                for label, sdir in (("move_with_transfer", slot_dir), ("move_without", None)):
                    parts[label] = _part(label, why, forced_move, ifr, label, pair, sdir, plan)
                    pair = _restart_dead(pair, slot_dir, flags)
                # (f) a supervisor killed mid-session (a smaller session)
                small = Plan(
                    convs=max(2, plan.convs // 2),
                    turns=max(3, plan.turns // 2),
                    side_every=plan.side_every,
                    words=plan.words,
                )
                parts["supervisor_kill"] = _part(
                    "supervisor_kill",
                    replicas_present(),
                    supervisor_kill,
                    ifr,
                    pair,
                    slot_dir,
                    small,
                )
                for routing in ("round_robin", "least_busy"):
                    env = pool_env(pair, routing, slot_dir)
                    parts[routing] = _part(
                        routing, pool_why, run_session, ifr, routing, env, pair, plan
                    )
            finally:
                for e in pair:
                    e.stop()
    return report(plan, parts, flags, round(time.monotonic() - t_start, 1), build)


def _restart_dead(pair: list[EngineProc], slot_dir: Path, flags: list[str]) -> list[EngineProc]:
    """The pair with every engine that is not alive started again, on the same name (a new
    port: each part's supervisor is given the URLs anew)."""
    out = []
    for e in pair:
        if e.server.process.alive():
            out.append(e)
        else:
            e.stop()
            out.append(start_engine(e.name, e.slots, slot_dir, flags, e.threads))
    return out


# --------------------------------------------------------------------------- the report
SESSION_PARTS = [
    ("baseline", "(a) one engine, enough slots"),
    ("affine", "(b) 2 engines, affine"),
    ("round_robin", "(c) 2 engines, round_robin"),
    ("least_busy", "(d) 2 engines, least_busy"),
]


def _fmt_counts(d: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"


def report(
    plan: Plan,
    parts: dict[str, Any],
    flags: list[str],
    duration_s: float,
    build: dict[str, Any] | None,
) -> dict[str, Any]:
    """The result document: one table per figure group, the targets, the raw parts."""
    base = (parts.get("baseline") or {}).get("summary") or {}
    rows: list[list[Any]] = []
    for key, title in SESSION_PARTS:
        part = parts.get(key) or not_run("not reached")
        if "not_run" in part:
            rows.append([title, f"not run: {part['not_run']}"] + [None] * 9)
            continue
        s = part["summary"]
        vs = (
            _common.ratio(s["main_ratio"], base["main_ratio"])
            if s.get("main_ratio") is not None and base.get("main_ratio")
            else None
        )
        rows.append(
            [
                title,
                s["main_ratio"],
                None if vs is None else round(vs, 3),
                s["main_prompt_n"],
                s["main_cache_n"],
                s["side_ratio"],
                s["prompt_ms_median"],
                s["ttft_s_median"],
                _fmt_counts(s["reasons"]),
                f"{s['moves']}; transfers: {_fmt_counts(s['transfers'])}",
                f"{s['failed']} failed, {part['wall_s']} s",
            ]
        )
    session_table = _common.table(
        f"Recomputation over {plan.convs} conversations × {plan.turns} turns, side task every "
        f"{plan.side_every} turns (same run, same machine)",
        [
            "routing",
            "main recompute ratio",
            "× baseline",
            "main prompt_n Σ",
            "main cache_n Σ",
            "side recompute ratio",
            "main prompt_ms median",
            "main TTFT s median",
            "placements (reasons)",
            "moves; slot transfers",
            "requests failed, wall",
        ],
        rows,
        notes="recompute ratio = Σprompt_n / Σ(prompt_n + cache_n) of llama-server's timings; "
        "× baseline = that ratio / the one-engine session's. Every part runs with slot "
        "transfer on (LOKI_ENGINE_SLOT_DIR): an evicted prompt may come back by restore. "
        "Engines: bundled SmolLM2 on CPU, "
        f"{THREADS} threads for the one engine, {max(1, THREADS // 2)} for each of the two, "
        f"{SLOT_CTX} tokens per slot, flags {' '.join(flags) or '-'}.",
    )
    move_rows = []
    for key, title in (
        ("move_with_transfer", "with slot transfer (LOKI_ENGINE_SLOT_DIR set)"),
        ("move_without", "without (LOKI_ENGINE_SLOT_DIR empty)"),
    ):
        part = parts.get(key) or not_run("not reached")
        if "not_run" in part:
            move_rows.append([title, f"not run: {part['not_run']}"] + [None] * 6)
            continue
        m, b = part["moved"], part["before"]
        move_rows.append(
            [
                title,
                f"{b['engine']} → {m['engine']} ({m['reason']}, transfer {m['transfer']})",
                m["prompt_n"],
                m["cache_n"],
                m["prompt_ms"],
                m["ttft_s"],
                None if m["lease_s"] is None else round(m["lease_s"] + (m["ttft_s"] or 0), 3),
                f"{b['prompt_n']} / {b['prompt_ms']} ms",
            ]
        )
    move_table = _common.table(
        "Forced move: the engine holding a conversation killed, its next turn elsewhere",
        [
            "variant",
            "placement of the moved turn",
            "prompt_n (recomputed)",
            "cache_n",
            "prompt_ms",
            "TTFT s",
            "lease + TTFT s",
            "turn before: prompt_n / prompt_ms",
        ],
        move_rows,
        notes="two conversations; the engine of conversation 0 gets SIGKILL a few seconds "
        "after its turn (after the idle save), then its next turn is leased. TTFT counts from "
        "the completion request; lease + TTFT also counts the grant, which waits for the "
        "restore.",
    )
    kill = parts.get("supervisor_kill") or not_run("not reached")
    if "not_run" in kill:
        kill_rows = [["not run: " + kill["not_run"]] + [None] * 8]
    else:
        kill_rows = [
            [
                f"{kill['planned_turns']} turns, leader killed after {kill['killed_at_turns_ended']}",
                kill["main_turns_ended"],
                f"{kill['in_flight_ended']} of {kill['in_flight_at_kill']}",
                kill["lost"],
                kill["without_end"],
                kill["probe_lease_s"],
                kill["lease_s_max_across_kill"],
                kill["lease_s_median"],
                f"{kill['leader_before']} → {kill['leader_after']}",
            ]
        ]
    kill_table = _common.table(
        "Supervisor kill: two replicated supervisors, the leader SIGKILLed mid-session",
        [
            "session",
            "main turns ended",
            "in flight at the kill: ended",
            "lost",
            "without an end",
            "pause s (a lease asked at the kill)",
            "longest lease wait s, asked ≤ 10 s after the kill",
            "lease wait s median",
            "leader",
        ],
        kill_rows,
    )
    aff = (parts.get("affine") or {}).get("summary") or {}
    vs_base = (
        _common.ratio(aff["main_ratio"], base["main_ratio"])
        if aff.get("main_ratio") is not None and base.get("main_ratio")
        else None
    )
    with_t = parts.get("move_with_transfer") or {}
    without = parts.get("move_without") or {}
    move_vs = None
    if "moved" in with_t and "moved" in without and without["moved"].get("prompt_n"):
        move_vs = _common.ratio(with_t["moved"]["prompt_n"] or 0, without["moved"]["prompt_n"])
    targets = [
        _common.target(
            "affine over 2 engines / one engine: main recompute ratio",
            None if vs_base is None else round(vs_base, 3),
            "<=",
            1.05,
            issue="44",
        ),
        _common.target(
            "forced move: tokens recomputed with slot transfer / without",
            None if move_vs is None else round(move_vs, 3),
            "<",
            0.5,
            issue="44",
        ),
        _common.target(
            "supervisor kill: requests lost + without an end + never asked",
            None
            if "not_run" in kill
            else kill["lost"] + kill["without_end"] + kill["turns_missing"],
            "<=",
            0,
            issue="44",
        ),
    ]
    return _common.result(
        "ENGINES: several llama-servers, cache-affine routing, moves and a supervisor kill",
        tables=[session_table, move_table, kill_table],
        targets=targets,
        data={
            "plan": plan.__dict__,
            "flags": flags,
            "slot_ctx": SLOT_CTX,
            "duration_s": duration_s,
            "parts": parts,
        },
        notes="Each part has its own supervisor process (Redis flushed, every slot erased "
        "before it); the session is the same in every part (deterministic user messages, "
        "temperature 0). A part that could not run says why instead of figures.",
        engine=build,
    )


def _show(doc: dict[str, Any]) -> None:
    for table in doc["tables"]:
        print(table["title"])
        for row in table["rows"]:
            print("  ", row)


def main() -> None:
    _common.main_alone("engines", run, __doc__.splitlines()[0], "4 × 4 instead of 8 × 12", _show)


if __name__ == "__main__":
    main()
