"""Resident memory of each of Loki's services, idle and under load.

The whole stack (:class:`loki_cli.stack.Stack`: NATS, Redis, the services, llama-server
with the bundled model launched by the supervisor) is started; then:

- idle: once the engine is ready and nothing is asked for a few seconds, the RSS of each
  service's own process (``VmRSS``), sampled several times, median;
- under load: chat turns, ``/v1`` requests, SSE readers and summary/state polls run
  together while every service's RSS is sampled every 0.25 s; the peak is reported.

llama-server, NATS and Redis are listed alongside, outside the target. Target (issue 10): the
five original services together under 400 MB idle (MB = 10^6 bytes), 80 MB a service; the
memory service (issue 18) counts as a sixth at the same rate: 480 MB for six.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import _common

TIMEOUT_S = {"quick": 600, "full": 1200}

SERVICES = ["gateway", "chat", "recall", "memory", "engine-supervisor", "perf"]
TARGET_IDLE_MB = 80.0 * len(SERVICES)


def _pids(stack: Any) -> dict[str, int]:
    pids = {name: proc.proc.pid for name, proc in stack.procs.items() if proc.proc}
    for name, proc in stack.infra.items():
        if proc.proc:
            pids[name] = proc.proc.pid
    sup = pids.get("engine-supervisor")
    if sup:
        for pid in _common.process_tree(sup)[1:]:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"llama-server" in cmd:
                pids["llama-server"] = pid
    return pids


def _sample(pids: dict[str, int]) -> dict[str, int]:
    return {name: _common.rss_bytes(pid) for name, pid in pids.items()}


def _load(base: str, turns: int, stop: threading.Event, errors: list[str]) -> None:
    """Chat turns in one conversation, with ``/v1`` requests and SSE/state/summary readers
    running beside them."""
    import httpx

    http = httpx.Client(base_url=base, timeout=600)
    conv: str | None = None

    def poller() -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            while not stop.is_set():
                try:
                    c.get("/api/perf/summary")
                    if conv:
                        c.get("/api/chat/state", params={"conversation": conv})
                        c.get("/api/conversations")
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)

    def v1() -> None:
        with httpx.Client(base_url=base, timeout=600) as c:
            for i in range(2):
                if stop.is_set():
                    return
                try:
                    c.post(
                        "/v1/chat/completions",
                        json={
                            "model": "local",
                            "max_tokens": 8,
                            "messages": [{"role": "user", "content": f"Say {i}."}],
                        },
                    )
                except httpx.HTTPError as exc:
                    errors.append(f"v1: {exc}")

    threads = [threading.Thread(target=poller, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    v1_thread = threading.Thread(target=v1, daemon=True)
    try:
        for i in range(turns):
            body: dict[str, Any] = {"content": f"Turn {i}: list three colours. " + "x " * 300}
            if conv:
                body["conversation"] = conv
            r = http.post("/api/chat/send", json=body)
            if r.status_code != 202:
                errors.append(f"send: {r.status_code} {r.text[:200]}")
                return
            conv = r.json()["conversation"]
            if i == 0:
                v1_thread.start()
            deadline = time.monotonic() + 300
            time.sleep(0.3)
            while time.monotonic() < deadline:
                s = http.get("/api/chat/state", params={"conversation": conv}).json()
                if not s.get("generating") and not s.get("queued"):
                    break
                time.sleep(0.25)
        if v1_thread.is_alive():
            v1_thread.join(timeout=300)
    finally:
        stop.set()


def run(quick: bool) -> dict[str, Any]:
    """Measure idle and loaded RSS of the services; see the module docstring."""
    idle_samples = 5 if quick else 10
    turns = 2 if quick else 5
    env = {"LOKI_CTX": "2048", "LOKI_MAX_TOKENS": "16", "LOKI_ENGINE_THREADS": "2"}
    with (
        tempfile.TemporaryDirectory(prefix="loki-bench-mem-") as home,
        _common.stack(Path(home), env) as stack,
    ):
        base = f"http://127.0.0.1:{stack.config.web_port}"
        engine_url = (stack.engine_info() or {}).get("base_url")
        engine = _common.engine_build(engine_url) if engine_url else None
        time.sleep(3.0)
        pids = _pids(stack)
        idle: dict[str, list[int]] = {name: [] for name in pids}
        for _ in range(idle_samples):
            for name, value in _sample(pids).items():
                idle[name].append(value)
            time.sleep(0.5)

        stop = threading.Event()
        errors: list[str] = []
        loader = threading.Thread(target=_load, args=(base, turns, stop, errors), daemon=True)
        peak: dict[str, int] = {name: 0 for name in pids}
        start = time.monotonic()
        loader.start()
        while loader.is_alive():
            for name, value in _sample(pids).items():
                peak[name] = max(peak[name], value)
            time.sleep(0.25)
        load_s = time.monotonic() - start

    def mb(n: float) -> float:
        return round(n / 1e6, 1)

    idle_med = {name: statistics.median(v) for name, v in idle.items() if v}
    rows = []
    for name in SERVICES + ["llama-server", "nats", "redis"]:
        if name not in pids:
            rows.append([name, None, None, "not running"])
            continue
        rows.append(
            [
                name,
                mb(idle_med.get(name, 0)),
                mb(peak.get(name, 0)),
                "service" if name in SERVICES else "outside the target",
            ]
        )
    services_idle = sum(idle_med.get(n, 0) for n in SERVICES)
    services_peak = sum(peak.get(n, 0) for n in SERVICES)
    rows.append(["the services together", mb(services_idle), mb(services_peak), ""])
    missing = [n for n in SERVICES if n not in pids or not idle_med.get(n)]
    return _common.result(
        "Resident memory of the services",
        tables=[
            _common.table(
                "RSS (MB = 10^6 bytes)",
                ["process", "idle (median)", "peak under load", "note"],
                rows,
                notes=f"Load: {turns} chat turns with a ~300-word message each, "
                f"2 `/v1` requests, 2 pollers of summary/state/"
                f"conversations, for {load_s:.0f} s."
                + (f" Load errors: {'; '.join(errors)[:300]}" if errors else ""),
            )
        ],
        targets=[
            _common.target(
                "the services together, idle RSS",
                None if missing else mb(services_idle),
                "<",
                TARGET_IDLE_MB,
                "MB",
                issue="10",
            )
        ],
        data={
            "idle_bytes": idle,
            "peak_bytes": peak,
            "load_s": load_s,
            "errors": errors,
            "missing": missing,
        },
        engine=engine,
    )
