"""The container health command ``python -m loki_shared.health`` and the responder services
attach (real NATS; the command runs as a subprocess, as Docker runs it)."""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import nats
import pytest

from loki_shared import health, subjects
from loki_shared.nats import make_broker


def run_health(*args: str, nats_url: str = "nats://127.0.0.1:9") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env["LOKI_NATS_URL"] = nats_url
    return subprocess.run(
        [sys.executable, "-m", "loki_shared.health", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


async def run_health_async(*args: str, nats_url: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(run_health, *args, nats_url=nats_url)


def test_subject_and_instance_token() -> None:
    assert subjects.health("chat") == "loki.health.chat"
    assert subjects.health("chat", "abc") == "loki.health.chat.abc"
    for bad in ("", "a.b", "a*", "a b", ">"):
        with pytest.raises(ValueError):
            subjects.health(bad)
    assert health.instance_token("box.lan") == "box_lan"
    assert health.instance_token("3f2a9c") == "3f2a9c"


async def test_attached_service_is_healthy(nats_url: str) -> None:
    broker = make_broker(nats_url, "chat")  # every service's broker answers its health subject
    await broker.start()
    try:
        ok = await run_health_async("chat", nats_url=nats_url)
        assert ok.returncode == 0, ok.stderr
        assert "chat/" in ok.stdout and "fallback" not in ok.stdout
        anyone = await run_health_async("--any", "chat", nats_url=nats_url)
        assert anyone.returncode == 0, anyone.stderr
        reply = await health.ask_nats(nats_url, "chat", health.instance_token())
        assert reply.ok and reply.service == "chat" and reply.detail == {}
    finally:
        await broker.stop()


async def test_failing_check_is_unhealthy(nats_url: str) -> None:
    async def redis_down() -> dict[str, str]:
        return {"redis": "connection refused"}

    async def crashes() -> dict[str, str]:
        raise OSError("disk gone")

    a = make_broker(nats_url, "recall", health_check=redis_down)
    b = make_broker(nats_url, "perf", health_check=crashes)
    await a.start()
    await b.start()
    try:
        bad = await run_health_async("recall", nats_url=nats_url)
        assert bad.returncode == 1 and "connection refused" in bad.stderr, bad
        reply = await health.ask_nats(nats_url, "perf", None)
        assert not reply.ok and "disk gone" in reply.detail["check"]
    finally:
        await a.stop()
        await b.stop()


async def test_nobody_answers(nats_url: str) -> None:
    out = await run_health_async("nobody", nats_url=nats_url)
    assert out.returncode == 1 and "no responder" in out.stderr, out
    # A process fallback only counts when such a process is alive.
    missing = await run_health_async(
        "nobody", "--fallback-process", "no_such_module_xyz", nats_url=nats_url
    )
    assert missing.returncode == 1, missing
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)
        alive = await run_health_async(
            "nobody", "--fallback-process", "http.server", nats_url=nats_url
        )
        assert alive.returncode == 0 and "process fallback" in alive.stdout, alive
    finally:
        proc.terminate()
        proc.wait()


async def test_silent_responder_times_out_without_fallback(nats_url: str) -> None:
    nc = await nats.connect(nats_url)

    async def ignore(msg: object) -> None:
        return None

    await nc.subscribe(subjects.health("mute", health.instance_token()), cb=ignore)
    try:
        out = await run_health_async(
            "mute", "--timeout", "1", "--fallback-process", "pytest", nats_url=nats_url
        )
        assert out.returncode == 1 and "no answer" in out.stderr, out
    finally:
        await nc.close()


def test_nats_unreachable() -> None:
    out = run_health("chat", nats_url="nats://127.0.0.1:1")
    assert out.returncode == 1 and "unreachable" in out.stderr, out


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_check(http_server: str) -> None:
    assert run_health("--http", f"{http_server}/ok").returncode == 0
    bad = run_health("--http", f"{http_server}/down")
    assert bad.returncode == 1 and "503" in bad.stderr
    assert run_health("--http", "http://127.0.0.1:1/").returncode == 1


def test_usage() -> None:
    assert run_health().returncode == 2
    assert run_health("chat", "--http", "http://127.0.0.1:1/").returncode == 2
