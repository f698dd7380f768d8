"""Every service stops on SIGTERM within ``LOKI_STOP_TIMEOUT_S``, exit status 0, whatever
NATS and Redis are doing (issue 25).

The seven services run as real processes on their own NATS and Redis (these tests kill them),
the engine supervisor following a scripted engine (``LOKI_ENGINE_URL``). One turn is done
before each stop, and the conversation stored in Redis is compared after the stop: nothing
already persisted is lost. Each scenario measures, for each service, the time from its
SIGTERM to its exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis as redis_client

from loki_cli.stack import SERVICES
from loki_shared import servers
from tests.conftest import login_env, plain_url, start_nats, start_redis
from tests.fakes.fake_engine import FakeEngine, Stream, chunk, text_reply

#: The stop budget the services get here (the default is 10 s; shorter keeps the tests short
#: and proves the bound the same way).
STOP_S = 5.0
#: Time allowed past the budget for the interpreter to exit; the watchdog would end a
#: service at STOP_S + 1 s with status 1, which these tests would see.
EXIT_SLACK_S = 1.0


@dataclass
class Procs:
    """NATS, Redis and the seven services of one test."""

    root: Path
    nats: servers.RunningServer
    redis: servers.RunningServer
    engine: FakeEngine
    services: dict[str, servers.ManagedProcess] = field(default_factory=dict)
    base: str = ""

    def log(self, name: str) -> str:
        return "\n".join(self.services[name].tail)


def start(root: Path, engine: FakeEngine) -> Procs:
    """Start NATS, Redis and the services; return once the gateway serves and the supervisor
    reports the engine ready."""
    nats = start_nats(root / "nats")
    redis = start_redis(root / "redis")
    procs = Procs(root, nats, redis, engine)
    web = servers.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=plain_url(nats.url),  # each service logs in as itself (login_env)
        LOKI_REDIS_URL=plain_url(redis.url),
        LOKI_HOME=str(root / "home"),
        LOKI_SECRET_KEY="stop-test-secret-0123456789",
        LOKI_ENGINE_URL=engine.url,
        LOKI_WEB_PORT=str(web),
        LOKI_PERF_METRICS_PORT=str(servers.free_port()),
        LOKI_STOP_TIMEOUT_S=str(STOP_S),
        PYTHONUNBUFFERED="1",
    )
    for name, module in SERVICES:
        procs.services[name] = servers.ManagedProcess(
            name, [sys.executable, "-m", module], env={**env, **login_env(name)}
        ).start()
    procs.base = f"http://127.0.0.1:{web}"
    procs.services["gateway"].wait_http_ok(f"{procs.base}/healthz", timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(f"{procs.base}/api/engine", timeout=5)
        if r.status_code == 200 and r.json()["state"] == "ready" and answering(nats.url):
            return procs
        time.sleep(0.2)
    raise AssertionError(f"engine never ready or a service not answering: {r.text}")


def answering(nats_url: str) -> bool:
    """Whether every service but the gateway answers its health subject (one still
    importing would leave a request without a responder)."""
    import asyncio

    from loki_shared import health

    async def ask_all() -> bool:
        for name, _ in SERVICES:
            if name == "gateway":
                continue
            try:
                await health.ask_nats(nats_url, name, None, 2.0)
            except (health.NoResponder, RuntimeError):
                return False
        return True

    return asyncio.run(ask_all())


def turn(base: str, content: str, conversation: str | None = None) -> str:
    """Send one message; return the conversation id (the turn runs in the background)."""
    body = {"content": content} | ({"conversation": conversation} if conversation else {})
    r = httpx.post(f"{base}/api/chat/send", json=body, timeout=10)
    assert r.status_code == 202, r.text
    return r.json()["conversation"]


def wait_idle(base: str, conversation: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(
            f"{base}/api/chat/state", params={"conversation": conversation}, timeout=5
        ).json()
        if not state.get("generating") and not state.get("queued"):
            return
        time.sleep(0.2)
    raise AssertionError(f"turn of {conversation} did not end")


def conversations(redis_url: str) -> dict[bytes, bytes]:
    """Every stored conversation blob (sealed bytes), by key."""
    client = redis_client.Redis.from_url(redis_url)
    try:
        return {key: client.get(key) for key in client.scan_iter(match="*:conv:*")}
    finally:
        client.close()


def stop_services(procs: Procs, also: list[servers.ManagedProcess] = ()) -> dict[str, tuple]:
    """SIGTERM every service (and ``also``) at the same moment; return, per service, the
    seconds until it exited and its exit status (None: still running after the budget and
    the slack, then killed)."""
    sent = time.monotonic()
    for proc in [*procs.services.values(), *also]:
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
    out: dict[str, tuple] = {}
    deadline = sent + STOP_S + EXIT_SLACK_S + 5
    while len(out) < len(procs.services) and time.monotonic() < deadline:
        for name, proc in procs.services.items():
            if name not in out and proc.proc is not None and proc.proc.poll() is not None:
                out[name] = (time.monotonic() - sent, proc.proc.returncode)
        time.sleep(0.02)
    for name, proc in procs.services.items():
        if name not in out:
            proc.kill()
            out[name] = (time.monotonic() - sent, None)
    return out


def assert_stopped_in_time(procs: Procs, result: dict[str, tuple]) -> None:
    late = {
        name: (round(t, 2), rc)
        for name, (t, rc) in result.items()
        if rc != 0 or t > STOP_S + EXIT_SLACK_S
    }
    logs = "\n".join(f"--- {name}\n{procs.log(name)[-3000:]}" for name in late)
    assert not late, f"not stopped in {STOP_S:g} s with status 0: {late}\n{logs}"


def restarted_redis(procs: Procs) -> servers.RunningServer:
    """Redis again on the same data directory (append-only file)."""
    return start_redis(procs.redis.data_dir or procs.root / "redis")


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as fake:
        fake.default = text_reply("hello there")
        yield fake


@pytest.fixture
def stack(tmp_path: Path, engine: FakeEngine) -> Iterator[Procs]:
    procs = start(tmp_path, engine)
    try:
        yield procs
    finally:
        for proc in procs.services.values():
            proc.kill()
        for server in (procs.nats, procs.redis):
            if server.process.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.process.proc.pid, signal.SIGCONT)
            server.stop(grace=5)


def done_turn(procs: Procs) -> dict[bytes, bytes]:
    """One turn done; the stored conversations."""
    cid = turn(procs.base, "hi")
    wait_idle(procs.base, cid)
    stored = conversations(procs.redis.url)
    assert stored, "the turn was not persisted"
    return stored


def test_nats_killed_first_then_sigterm(stack: Procs) -> None:
    stored = done_turn(stack)
    stack.nats.stop()
    time.sleep(1.0)
    assert_stopped_in_time(stack, stop_services(stack))
    assert conversations(stack.redis.url) == stored


def test_redis_killed_first_then_sigterm(stack: Procs) -> None:
    stored = done_turn(stack)
    stack.redis.stop()
    time.sleep(1.0)
    assert_stopped_in_time(stack, stop_services(stack))
    again = restarted_redis(stack)
    try:
        assert conversations(again.url) == stored
    finally:
        again.stop()


@pytest.mark.parametrize("round_", range(4))
def test_sigterm_to_services_nats_and_redis_at_once(stack: Procs, round_: int) -> None:
    """What a host shutdown or an unordered ``docker compose down`` does; repeated because the
    hang it caught was a race (a reconnect attempt meeting the stop)."""
    stored = done_turn(stack)
    result = stop_services(stack, also=[stack.nats.process, stack.redis.process])
    assert_stopped_in_time(stack, result)
    stack.redis.process.proc.wait(10)
    again = restarted_redis(stack)
    try:
        assert conversations(again.url) == stored
    finally:
        again.stop()


def test_sigterm_mid_request_waiting_on_dead_peers(stack: Procs, engine: FakeEngine) -> None:
    """A turn streaming from an engine that stopped answering, a second turn waiting for the
    engine's only slot (the supervisor holds its lease request), and requests to recall and
    the supervisor, when NATS and Redis freeze (SIGSTOP: connections open, nothing answers);
    then SIGTERM."""
    stored = done_turn(stack)
    # The next completion sends its first delta, then nothing for minutes.
    engine.push(Stream(frames=[chunk({"role": "assistant", "content": "x"})] * 600, delay_s=0.5))
    slow = turn(stack.base, "tell me a long story")
    engine.wait_requests(2, timeout=20)
    turn(stack.base, "and another one")  # a second conversation: waits for the slot
    time.sleep(0.5)
    for server in (stack.nats, stack.redis):
        assert server.process.proc is not None
        os.kill(server.process.proc.pid, signal.SIGSTOP)

    def ask(path: str) -> None:
        try:
            httpx.get(f"{stack.base}{path}", timeout=30)
        except httpx.HTTPError:
            pass

    for path in ("/api/recall/blocks", "/api/engine", f"/api/chat/state?conversation={slow}"):
        threading.Thread(target=ask, args=(path,), daemon=True).start()
    time.sleep(0.5)
    assert_stopped_in_time(stack, stop_services(stack))
    for server in (stack.nats, stack.redis):
        assert server.process.proc is not None
        os.kill(server.process.proc.pid, signal.SIGCONT)
    assert set(conversations(stack.redis.url)) >= set(stored)


def test_second_signal_stops_at_once(tmp_path: Path) -> None:
    """A service whose stop waits on a peer ends at once on a second SIGTERM (status 1)."""
    nats = start_nats(tmp_path / "nats")
    redis = start_redis(tmp_path / "redis")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats.url,
        LOKI_REDIS_URL=redis.url,
        LOKI_HOME=str(tmp_path / "home"),
        LOKI_SECRET_KEY="stop-test-secret-0123456789",
        LOKI_STOP_TIMEOUT_S="60",
        PYTHONUNBUFFERED="1",
    )
    recall = servers.ManagedProcess(
        "recall", [sys.executable, "-m", "loki_recall"], env=env
    ).start()
    try:
        deadline = time.monotonic() + 30
        while not any("recall service serving" in line for line in recall.tail):
            assert recall.alive() and time.monotonic() < deadline, "\n".join(recall.tail)
            time.sleep(0.1)
        assert nats.process.proc is not None
        os.kill(nats.process.proc.pid, signal.SIGSTOP)  # the drain will wait on it
        assert recall.proc is not None
        recall.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert recall.alive(), "the first signal alone should still be stopping"
        sent = time.monotonic()
        recall.proc.send_signal(signal.SIGTERM)
        rc = recall.proc.wait(5)
        assert rc == 1 and time.monotonic() - sent < 2, "\n".join(recall.tail)
        assert any("second signal" in line for line in recall.tail)
    finally:
        recall.kill()
        if nats.process.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(nats.process.proc.pid, signal.SIGCONT)
        nats.stop()
        redis.stop()
