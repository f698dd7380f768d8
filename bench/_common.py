"""Helpers every benchmark uses: machine facts, repeated runs, medians and spreads, ratios,
result documents, resident memory of a process tree, and the servers a bench starts.

The contract a bench module follows is in ``bench/README.md``: ``bench/<name>_bench.py``
defines ``run(quick: bool) -> dict`` returning a result document built with :func:`result`
(tables, targets, raw data); the harness (``python -m bench``) adds the commit, the machine
facts and the timing, and writes ``bench/results/<name>.json``.

Speed figures are ratios against a baseline measured in the same run (the machine is shared
and noisy); absolute times go alongside. Spreads are the interquartile range (IQR, the
``inclusive`` quartile method of :func:`statistics.quantiles`) plus min and max.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loki_shared.sse import SSEDecoder, StreamEvent, json_object
from loki_shared.tool_calls import ToolCallAssembler

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"

#: Version of the result document layout (bumped when a field changes meaning).
SCHEMA_VERSION = 1


class BenchError(RuntimeError):
    """A benchmark could not measure what it set out to (a server missing, a bad sample)."""


# --------------------------------------------------------------------------- statistics
def spread(samples: Iterable[float]) -> dict[str, float | int]:
    """Median and spread of ``samples``.

    Returns ``{"n", "median", "q1", "q3", "iqr", "min", "max"}``; with one sample the
    quartiles equal it. Quartiles use the ``inclusive`` method (linear interpolation between
    order statistics, as numpy's default percentile).

    Raises:
        ValueError: no samples.
    """
    values = sorted(float(v) for v in samples)
    if not values:
        raise ValueError("spread() of no samples")
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "n": len(values),
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "min": values[0],
        "max": values[-1],
    }


def percentile(samples: Iterable[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation between order statistics.

    Raises:
        ValueError: no samples, or ``p`` outside 0..100.
    """
    values = sorted(float(v) for v in samples)
    if not values:
        raise ValueError("percentile() of no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    pos = (len(values) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``.

    Raises:
        ValueError: ``baseline`` is zero or negative (a ratio against it means nothing).
    """
    if baseline <= 0:
        raise ValueError(f"ratio against a baseline of {baseline}")
    return value / baseline


def paired_ratios(values: Sequence[float], baselines: Sequence[float]) -> dict[str, Any]:
    """Ratios of runs measured in pairs (candidate i right after baseline i, so both see the
    same load): ``{"ratio": spread of value_i / baseline_i, "value": spread(values),
    "baseline": spread(baselines)}``. The figure to quote is ``ratio["median"]``.

    Raises:
        ValueError: lengths differ, no pair, or a baseline is not positive.
    """
    if len(values) != len(baselines):
        raise ValueError(f"{len(values)} values for {len(baselines)} baselines")
    if not values:
        raise ValueError("paired_ratios() of no pairs")
    ratios = [ratio(v, b) for v, b in zip(values, baselines, strict=True)]
    return {"ratio": spread(ratios), "value": spread(values), "baseline": spread(baselines)}


def repeat(fn: Callable[[], Any], times: int, warmup: int = 1) -> list[float]:
    """Run ``fn`` ``warmup`` times unmeasured, then ``times`` times; return each run's
    wall time in seconds (``time.perf_counter``)."""
    for _ in range(warmup):
        fn()
    out: list[float] = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def interleaved(
    candidate: Callable[[], Any], baseline: Callable[[], Any], times: int, warmup: int = 1
) -> dict[str, Any]:
    """Time ``baseline`` then ``candidate`` alternately ``times`` times (after ``warmup``
    unmeasured pairs) and return :func:`paired_ratios` of candidate over baseline seconds."""
    for _ in range(warmup):
        baseline()
        candidate()
    base: list[float] = []
    cand: list[float] = []
    for _ in range(times):
        start = time.perf_counter()
        baseline()
        base.append(time.perf_counter() - start)
        start = time.perf_counter()
        candidate()
        cand.append(time.perf_counter() - start)
    return paired_ratios(cand, base)


# --------------------------------------------------------------------------- targets, tables
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    ">=": lambda v, t: v >= t,
    ">": lambda v, t: v > t,
}
_OP_TEXT = {"<=": "≤", "<": "<", ">=": "≥", ">": ">"}


def target(
    name: str,
    value: float | None,
    op: str,
    threshold: float,
    unit: str = "",
    issue: str | None = None,
) -> dict[str, Any]:
    """A target check: ``{"name", "value", "target": "≤ 1.05 unit", "met", "issue"}``.

    ``value`` None (not measured) gives ``met: None``.

    Raises:
        ValueError: ``op`` is not one of ``<=``, ``<``, ``>=``, ``>``.
    """
    if op not in _OPS:
        raise ValueError(f"unknown comparison {op!r}")
    text = f"{_OP_TEXT[op]} {threshold:g}" + (f" {unit}" if unit else "")
    met = None if value is None else bool(_OPS[op](float(value), threshold))
    return {"name": name, "value": value, "target": text, "met": met, "issue": issue}


def table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], notes: str = ""
) -> dict[str, Any]:
    """A table of the report: ``{"title", "columns", "rows", "notes"}``.

    Raises:
        ValueError: a row's length differs from the number of columns.
    """
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"row {list(row)!r} has {len(row)} cells for {len(columns)} columns")
    return {
        "title": title,
        "columns": list(columns),
        "rows": [list(r) for r in rows],
        "notes": notes,
    }


def result(
    title: str,
    *,
    tables: Sequence[dict[str, Any]] = (),
    targets: Sequence[dict[str, Any]] = (),
    data: dict[str, Any] | None = None,
    notes: str = "",
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The document a bench's ``run()`` returns (the harness adds the rest).

    ``engine``: :func:`engine_build` of the llama-server the bench used, read while it ran
    (the harness puts it in the machine facts).
    """
    doc: dict[str, Any] = {
        "title": title,
        "tables": list(tables),
        "targets": list(targets),
        "data": data or {},
        "notes": notes,
    }
    if engine:
        doc["engine"] = engine
    return doc


# --------------------------------------------------------------------------- machine facts
def git_commit(root: Path = REPO_ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the working tree."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return {"commit": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def engine_build(engine_url: str, timeout: float = 5.0) -> dict[str, Any]:
    """``build_info``, ``total_slots`` and per-slot ``n_ctx`` from llama-server's ``/props``
    (``{}`` when it does not answer)."""
    import httpx

    try:
        props = httpx.get(f"{engine_url}/props", timeout=timeout).json()
    except (httpx.HTTPError, ValueError):
        return {}
    settings = props.get("default_generation_settings") or {}
    return {
        "build_info": props.get("build_info"),
        "total_slots": props.get("total_slots"),
        "n_ctx": settings.get("n_ctx"),
        # the file name only: a results file must not carry the machine's own paths
        "model_path": Path(str(props.get("model_path") or "")).name or None,
    }


def machine_facts(engine_url: str | None = None) -> dict[str, Any]:
    """Facts that make a figure comparable: CPU model, logical cores, RAM bytes, OS, Python,
    and llama-server's build (from ``/props``) when ``engine_url`` is given."""
    facts: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    if engine_url:
        facts["engine"] = engine_build(engine_url)
    return facts


def write_result(name: str, document: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``document`` as ``<results_dir>/<name>.json`` (atomically: a ``.tmp`` file
    renamed), sorted keys, 2-space indent. Returns the path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(
        json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    )
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- memory
def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may hold spaces
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant alive now (Linux ``/proc``)."""
    children = _children_map()
    out: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(children.get(current, []))
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of one process in bytes (``VmRSS`` of ``/proc/<pid>/status``);
    0 for a process that is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Sum of the resident set sizes of ``pid`` and all its descendants, in bytes.

    Pages shared between processes of the tree count once per process (RSS semantics), so
    this is an upper bound of the tree's real footprint.
    """
    return sum(rss_bytes(p) for p in process_tree(pid))


def mib(n_bytes: float) -> float:
    """Bytes to MiB, rounded to 0.1."""
    return round(n_bytes / (1024 * 1024), 1)


# --------------------------------------------------------------------------- servers
@dataclass
class Engine:
    """A llama-server started by a bench: ``url``, its process, the argv used."""

    url: str
    process: Any
    argv: list[str]

    def stop(self) -> None:
        self.process.stop()


def start_llama(
    ctx: int = 4096,
    parallel: int = 1,
    extra: Sequence[str] = (),
    threads: int = 2,
    timeout: float = 180.0,
) -> Engine:
    """Start the real llama-server with the bundled model on a free loopback port
    (:func:`loki_shared.servers.start_llama`, the tests' command line) and wait until
    ``/health`` answers 200.

    Raises:
        loki_shared.servers.ServerNotFound: no llama-server or no bundled model.
        loki_shared.servers.ServerStartError: it exited or was not healthy in ``timeout`` s.
    """
    from loki_shared import servers

    server = servers.start_llama(
        ctx=ctx, parallel=parallel, extra=list(extra), threads=threads, timeout=timeout
    )
    return Engine(server.url, server.process, server.process.argv)


def split_cores() -> tuple[set[int], set[int]] | None:
    """``(engine cores, other cores)``: every core this process may use but the last for a
    model server, the last for everything else (the service under test, its client, NATS);
    None when there are fewer than two or affinity is not available (not Linux)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(cores) < 2:
        return None
    return set(cores[:-1]), {cores[-1]}


@contextmanager
def pinned(cores: set[int] | None) -> Iterator[None]:
    """Run the block with the calling thread bound to ``cores`` (Linux affinity), so the
    processes it starts and the threads it creates inherit them; restored on exit. None:
    nothing changes."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def llama(
    ctx: int = 4096, parallel: int = 1, extra: Sequence[str] = (), threads: int = 2
) -> Iterator[Engine]:
    """:func:`start_llama` as a context manager (stopped on exit)."""
    engine = start_llama(ctx, parallel, extra, threads)
    try:
        yield engine
    finally:
        engine.stop()


@contextmanager
def stack(
    home: Path,
    env: dict[str, str] | None = None,
    engine_timeout: float = 240.0,
    redis_url: str | None = None,
) -> Iterator[Any]:
    """The whole Loki stack (:class:`loki_cli.stack.Stack`: NATS, Redis, the services)
    on a free port with data under ``home``; yields the stack once the gateway listens and
    the supervisor reports the engine ready. ``stack.config.web_port`` is the gateway's port.
    ``redis_url``: a Redis the bench started itself (no ACL users: the bench reads its
    ``INFO`` and ``MEMORY USAGE``) instead of the embedded one.

    Raises:
        loki_cli.stack.StackError: a part did not start.
    """
    from loki_cli.stack import Stack, StackConfig
    from loki_shared import servers

    config = StackConfig(
        home=home,
        web_port=servers.free_port(),
        env=dict(env or {}),
        echo=os.environ.get("LOKI_BENCH_ECHO", "").lower() in ("1", "true", "on", "yes"),
        redis_url=redis_url,
    )
    running = Stack(config, log=lambda line: None)
    running.start()
    try:
        running.wait_engine_ready(timeout=engine_timeout)
        yield running
    finally:
        running.stop()


def main_alone(
    name: str,
    run: Callable[[bool], dict[str, Any]],
    description: str,
    quick_help: str,
    show: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """What ``python -m bench.<name>_bench [--quick]`` does run alone, outside the harness:
    the harness's base fields (schema, name, mode, commit, machine), ``run(quick)``'s figures,
    ``status``/``duration_s``; writes ``bench/results/<name>.json`` and prints its path, what
    ``show`` prints of the document (default: nothing more) and each target's figures.
    Returns the path written."""
    import argparse

    from bench.__main__ import base_document

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args()
    doc = base_document(name, args.quick)
    t0 = time.monotonic()
    doc.update(run(args.quick))
    doc.update(status="ok", error=None, duration_s=round(time.monotonic() - t0, 1))
    path = write_result(name, doc)
    print(path)
    if show is not None:
        show(doc)
    for t in doc["targets"]:
        print(f"{t['name']}: {t['value']} (target {t['target']}) met={t['met']}")
    return path


@contextmanager
def supervisor_alone(home: Path, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """The engine supervisor (``python -m loki_supervisor``) with a NATS and a Redis of its
    own on free loopback ports (no ACL users), data and ``supervisor.log`` under ``home``;
    yields ``(nats_url, process)`` once NATS and Redis listen (the engine may still load:
    the caller waits for ``ready``). ``env`` is added to this process's environment less
    its ``LOKI_*`` variables. Everything is stopped on exit (the supervisor by SIGTERM, then
    SIGKILL after 30 s)."""
    import sys

    from loki_shared import servers

    nats_port, redis_port = servers.free_port(), servers.free_port()
    (home / "nats").mkdir(parents=True)
    (home / "redis").mkdir(parents=True)
    nats_proc = servers.ManagedProcess("nats", servers.nats_command(nats_port, home / "nats"))
    redis_proc = servers.ManagedProcess("redis", servers.redis_command(redis_port, home / "redis"))
    nats_proc.start()
    redis_proc.start()
    sup = None
    try:
        nats_proc.wait_port(nats_port)
        redis_proc.wait_port(redis_port)
        full = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
        full.update(
            LOKI_NATS_URL=f"nats://127.0.0.1:{nats_port}",
            LOKI_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            LOKI_HOME=str(home),
            **env,
        )
        with open(home / "supervisor.log", "wb") as log:
            sup = subprocess.Popen(
                [sys.executable, "-m", "loki_supervisor"],
                env=full,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        yield f"nats://127.0.0.1:{nats_port}", sup
    finally:
        if sup is not None and sup.poll() is None:
            sup.terminate()
            try:
                sup.wait(30)
            except subprocess.TimeoutExpired:
                sup.kill()
        nats_proc.stop()
        redis_proc.stop()


# --------------------------------------------------------------------------- recording proxy
@dataclass
class Exchange:
    """One request the engine served, as seen by :class:`RecordingProxy`.

    ``body``: the JSON request body; ``content``: the generated text (``content`` deltas or
    ``message.content``); ``timings`` / ``usage``: llama-server's figures from the final
    chunk or the response (None when absent); ``status``: the HTTP status.
    """

    ts: float
    path: str
    body: dict[str, Any]
    status: int = 0
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None

    @property
    def prompt_n(self) -> int | None:
        return (self.timings or {}).get("prompt_n")

    @property
    def cache_n(self) -> int | None:
        return (self.timings or {}).get("cache_n")


class RecordingProxy:
    """A transparent HTTP proxy in front of llama-server that records every completion it
    forwards (:class:`Exchange`), so a bench sees exactly what the engine was asked and what
    it prefilled, whoever sent it (chat, summariser, ``/v1`` proxy, side jobs).

    Streams are passed through chunk by chunk; nothing is changed. Runs uvicorn in a
    background thread on ``port`` (a free one by default). ``upstream`` may be set or changed
    after start (requests get 502 while it is None).
    """

    COMPLETION_PATHS = (
        "/v1/chat/completions",
        "/chat/completions",
        "/completion",
        "/completions",
        "/v1/completions",
    )

    def __init__(self, upstream: str | None = None, port: int | None = None) -> None:
        from loki_shared import servers

        self.upstream = upstream
        self.port = port or servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.exchanges: list[Exchange] = []
        self.other: list[tuple[float, str, str, int]] = []  # (ts, method, path+query, status)
        self._server: Any = None
        self._thread: Any = None

    def _app(self) -> Any:
        import httpx
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response, StreamingResponse
        from starlette.routing import Route

        # no keep-alive: llama-server closes idle connections after a few seconds, and a
        # request sent on one it just closed would fail (the client cannot retry a POST)
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(900.0, connect=30.0),
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        hop = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}

        async def handle(request: Request) -> Response:
            if not self.upstream:
                return Response("no upstream yet", status_code=502)
            raw = await request.body()
            path = request.url.path
            query = ("?" + request.url.query) if request.url.query else ""
            headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
            record = None
            if request.method == "POST" and path in self.COMPLETION_PATHS:
                body = json_object(raw or b"{}")
                record = Exchange(time.time(), path, body) if body is not None else None
            try:
                upstream = await client.send(
                    client.build_request(
                        request.method, self.upstream + path + query, content=raw, headers=headers
                    ),
                    stream=True,
                )
            except httpx.HTTPError as exc:
                return Response(f"upstream unreachable: {exc}", status_code=502)
            out_headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in hop and k.lower() != "content-encoding"
            }
            if record is None:
                body = await upstream.aread()
                await upstream.aclose()
                self.other.append((time.time(), request.method, path + query, upstream.status_code))
                return Response(body, status_code=upstream.status_code, headers=out_headers)
            record.status = upstream.status_code
            self.exchanges.append(record)
            if not record.body.get("stream"):
                body = await upstream.aread()
                await upstream.aclose()
                _absorb_response(record, body)
                return Response(body, status_code=upstream.status_code, headers=out_headers)

            async def relay() -> Any:
                decoder = SSEDecoder()
                calls = ToolCallAssembler()
                try:
                    async for chunk in upstream.aiter_raw():
                        for event in decoder.feed(chunk):
                            _absorb_event(record, event, calls)
                        yield chunk
                    for event in decoder.close():
                        _absorb_event(record, event, calls)
                finally:
                    await upstream.aclose()
                    record.timings = decoder.figures.timings
                    record.usage = decoder.figures.usage
                    record.tool_calls = calls.as_openai() or None

            return StreamingResponse(relay(), status_code=upstream.status_code, headers=out_headers)

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
        return Starlette(routes=[Route("/{path:path}", handle, methods=methods)])

    def start(self) -> RecordingProxy:
        """Start serving; returns once the port accepts connections."""
        import threading

        import uvicorn

        from loki_shared import servers

        config = uvicorn.Config(
            self._app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not servers.port_open("127.0.0.1", self.port):
            if time.monotonic() > deadline:
                raise BenchError("recording proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)


def _absorb_event(record: Exchange, event: StreamEvent, calls: ToolCallAssembler) -> None:
    """One decoded event of a streamed answer: its text, reasoning and tool-call fragments
    (``/v1/chat/completions``) or ``content`` (llama-server's ``/completion``)."""
    chunk = event.chunk
    if event.kind != "chunk" or chunk is None:
        return
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        record.content += delta.get("content") or choice.get("text") or ""
        record.reasoning += delta.get("reasoning_content") or ""
        calls.add_all(delta.get("tool_calls"))
    if isinstance(chunk.get("content"), str):  # /completion stream
        record.content += chunk["content"]


def _absorb_response(record: Exchange, body: bytes) -> None:
    doc = json_object(body)
    if doc is None:
        return
    record.timings = doc.get("timings")
    record.usage = doc.get("usage")
    for choice in doc.get("choices") or []:
        message = choice.get("message") or {}
        record.content += message.get("content") or choice.get("text") or ""
        record.reasoning += message.get("reasoning_content") or ""
        if message.get("tool_calls"):
            record.tool_calls = list(message["tool_calls"])
    if isinstance(doc.get("content"), str):
        record.content += doc["content"]
