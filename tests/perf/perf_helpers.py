"""Helpers for the perf tests: a NATS of their own, the perf service as a subprocess,
record building and metric scraping."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import deque
from pathlib import Path

import httpx
import nats
import nats.js.errors
from prometheus_client.parser import text_string_to_metric_families

from loki_shared import servers, subjects
from loki_shared.perf_publish import build_record


def start_own_nats(data_dir: Path) -> tuple[servers.ManagedProcess, str]:
    """A JetStream NATS for the perf tests only (the stream LOKI_PERF is global to a server)."""
    from tests.conftest import start_nats

    server = start_nats(data_dir)
    return server.process, server.url


async def reset_stream(nc) -> None:
    """Delete the perf stream and the metrics checkpoint bucket (a fresh start)."""
    js = nc.jetstream()
    for delete in (
        lambda: js.delete_stream(subjects.STREAM_PERF),
        lambda: js.delete_key_value(subjects.KV_PERF_TOTALS),
    ):
        try:
            await delete()
        except nats.js.errors.NotFoundError:
            pass


class PerfProc:
    """``python -m loki_perf`` as a user runs it, with /metrics on a free port."""

    def __init__(self, nats_url: str, home: Path, *, log: bool = False, **env_extra: str):
        self.metrics_port = servers.free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
        env.update(
            LOKI_NATS_URL=nats_url,
            LOKI_HOME=str(home),
            PYTHONUNBUFFERED="1",
            LOKI_PERF_METRICS_PORT=str(self.metrics_port),
            LOKI_PERF_CHECKPOINT_S="0.2",
            **env_extra,
        )
        if log:
            env["LOKI_PERF_LOG"] = "1"
        self.proc = servers.ManagedProcess("perf", [sys.executable, "-m", "loki_perf"], env=env)
        self.proc.tail = deque(maxlen=2000)
        self.proc.start()
        self.proc.wait_port(self.metrics_port, timeout=60)

    def lines(self, prefix: str = "[perf]") -> list[str]:
        return [line for line in self.proc.tail if line.startswith(prefix)]

    def scrape(self) -> dict[str, float]:
        """Sample name (+ sorted labels) -> value; and plain name -> sum over labels."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
                key = s.name + json.dumps(dict(sorted(s.labels.items())))
                out[key] = s.value
        return out

    def stop(self) -> int:
        self.proc.stop()
        return self.proc.proc.returncode

    def kill(self) -> None:
        self.proc.kill()


async def request(nc, subject: str, body: dict | None = None, timeout: float = 3.0) -> dict:
    msg = await nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout)
    return json.loads(msg.data)


async def wait_summary(nc, completions: int, timeout: float = 30.0) -> dict:
    """Poll ``loki.perf.summary`` until it counts ``completions`` records."""
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        try:
            last = await request(nc, subjects.PERF_SUMMARY)
            if last.get("completions") == completions:
                return last
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"summary never reached {completions} completions: {last}")


def conv_messages(conv: str, turns: int) -> list[dict]:
    out = [{"role": "system", "content": "You are helpful."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"{conv} question {i}"})
        if i < turns - 1:
            out.append({"role": "assistant", "content": f"{conv} answer {i}"})
    return out


def record(
    conv: str,
    turns: int,
    cache_n: int,
    prompt_n: int,
    predicted_n: int = 10,
    kind: str = "main",
    **kw,
):
    """A record as the chat service would build it after a turn of ``conv``."""
    return build_record(
        kind=kind,
        conversation=conv,
        model="smol",
        messages=conv_messages(conv, turns),
        final={
            "timings": {
                "cache_n": cache_n,
                "prompt_n": prompt_n,
                "predicted_n": predicted_n,
                "prompt_ms": 50.0,
                "predicted_ms": 100.0,
            },
            "usage": {
                "prompt_tokens": cache_n + prompt_n,
                "completion_tokens": predicted_n,
                "prompt_tokens_details": {"cached_tokens": cache_n},
            },
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        },
        ttft_ms=30.0,
        total_ms=150.0,
        **kw,
    )
