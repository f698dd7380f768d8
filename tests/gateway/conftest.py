"""Gateway test fixtures: a NATS of its own (so no other area's service answers the fakes'
subjects), fake chat/supervisor peers on it, and the gateway itself run as a user runs it
(``python -m loki_gateway`` in a subprocess, on a free loopback port)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from tests.conftest import login_env, start_nats
from tests.fakes.gateway_peers import FakePeers

# The browser tests: Debian's chromium driven by Playwright through its executable path (no
# browser is downloaded); screenshots go to tests/artifacts/ for a person to look at.
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class Gateway:
    """A running gateway subprocess."""

    def __init__(self, proc: servers.ManagedProcess, port: int, key: str | None) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.key = key

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=30, **kw)

    def logs(self) -> str:
        return "\n".join(self.proc.tail)


def launch_gateway(
    nats_url: str,
    home: Path,
    key: str | None = None,
    extra_env: dict[str, str] | None = None,
    redis_url: str = "",
) -> Gateway:
    """Start ``python -m loki_gateway`` and wait for ``/healthz``."""
    port = servers.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_WEB_PORT=str(port),
        LOKI_HOME=str(home),
        LOKI_SECRET_KEY="gateway-test-secret",
        PYTHONUNBUFFERED="1",
        LOKI_REDIS_URL=redis_url,
        **login_env("gateway"),  # the gateway's own NATS user, as in production
    )
    if key:
        env["LOKI_API_KEY"] = key
    env.update(extra_env or {})
    proc = servers.ManagedProcess(
        "gateway", [sys.executable, "-m", "loki_gateway"], env=env, echo=False
    )
    proc.tail = type(proc.tail)(maxlen=400)
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError("gateway exited:\n" + "\n".join(proc.tail))
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return Gateway(proc, port, key)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    raise RuntimeError("gateway not healthy in 60 s:\n" + "\n".join(proc.tail))


@contextmanager
def whole_stack(
    home: Path, engine_url: str, key: str, secret: str, timeout: float = 30
) -> Iterator[httpx.Client]:
    """The whole stack (``loki_cli.stack``: gateway, chat, memory, recall, supervisor, perf)
    on the engine at ``engine_url``, behind the API key ``key``: yields a client with the key
    (``timeout`` s a request) once the engine is ready and the memory service answers
    ``/api/projects``; stopped on leaving."""
    from loki_cli.stack import Stack, StackConfig

    port = servers.free_port()
    env = {"LOKI_ENGINE_URL": engine_url, "LOKI_SECRET_KEY": secret, "LOKI_API_KEY": key}
    stack = Stack(StackConfig(home=home, web_port=port, echo=False, env=env), log=lambda line: None)
    stack.start()
    try:
        stack.wait_engine_ready(timeout=180)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
        ) as client:
            deadline = time.monotonic() + 30
            while client.get("/api/projects").status_code != 200:  # memory service routable
                assert time.monotonic() < deadline
                time.sleep(0.2)
            yield client
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def gw_nats(tmp_path_factory) -> Iterator[str]:
    server = start_nats(tmp_path_factory.mktemp("gw-nats") / "nats")
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def peers(gw_nats: str) -> Iterator[FakePeers]:
    fake = FakePeers(gw_nats).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def gateway_factory(
    gw_nats: str, redis_url: str, tmp_path_factory
) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(key: str | None = None, **extra_env: str) -> Gateway:
        gw = launch_gateway(gw_nats, tmp_path_factory.mktemp("gw-home"), key, extra_env, redis_url)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.proc.stop()


@pytest.fixture(scope="module")
def gateway(gateway_factory, peers: FakePeers) -> Gateway:
    """A gateway without an API key, talking to the fake peers."""
    return gateway_factory()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium (installed by ``scripts/install.sh --test``)."""
    from playwright.sync_api import sync_playwright  # a missing package fails, never skips

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium missing: scripts/install.sh --test installs it")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the gateway processes' last log lines to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name in ("gateway",):
            gw = item.funcargs.get(name)
            if isinstance(gw, Gateway):
                report.sections.append((f"{name} log", gw.logs()))
