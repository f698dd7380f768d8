"""Issue 9, the proof by processes: the services started as plain processes with the compose
file's environment (hosts replaced by loopback addresses of real servers) serve a chat turn
through the gateway on the real llama-server, answer the compose health checks, and expose
the /metrics endpoints Prometheus is configured to scrape.

Only the compose *wiring* values are changed, each for a stated reason:

- host names (``nats``, ``redis``, ``engine``) and listen addresses (``0.0.0.0``) become
  127.0.0.1 — loopback servers started by the fixtures;
- the container ports (8090, 9464, 8081) become free ports, since this machine is shared;
- ``LOKI_HOME=/data`` becomes a temporary directory and ``LOKI_LLAMA_SERVER=/app/llama-server``
  (set by the engine image) the llama-server installed here;
- ``LOKI_SECRETS_DIR=/run/secrets/loki`` becomes the folder compose mounts there for that
  service: its own subfolder of what ``loki-secrets``'s command wrote. NATS and Redis run with
  the ``nats.conf`` and ``redis.conf`` it wrote too, so each service logs in as its own user
  with the generated permissions, as in the containers (issue 22).

Every other ``LOKI_*`` value is passed exactly as compose renders it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from loki_cli.stack import Stack, StackConfig
from loki_shared import permissions, servers
from loki_shared.settings import LokiSettings

from .compose_model import (
    BASE,
    LOKI_SERVICES,
    ROOT,
    env_of,
    image_for,
    render,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HOSTS = {"nats", "redis", "engine"}


def compose_env() -> dict[str, dict[str, str]]:
    """service -> the LOKI_* environment its container gets (image ENV, then compose)."""
    out = render([BASE], ["gpu"])
    assert out.returncode == 0, out.stderr
    envs: dict[str, dict[str, str]] = {}
    for name, svc in out.services.items():
        if name in LOKI_SERVICES:
            merged = {**image_for(svc).env, **env_of(svc)}
            envs[name] = {k: v for k, v in merged.items() if k.startswith("LOKI_")}
    return envs


def to_loopback(
    envs: dict[str, dict[str, str]],
    nats_url: str,
    redis_url: str,
    home: Path,
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """One environment for the stack, with the compose wiring mapped to loopback.

    Returns the environment and, for the record, every value changed (old, new).

    Raises:
        AssertionError: two services get different values for one variable, or a value names
            a host this mapping does not know.
    """
    merged: dict[str, str] = {}
    for service, env in envs.items():
        for key, value in env.items():
            assert merged.get(key, value) == value, (key, merged[key], service, value)
            merged[key] = value
    ports = {p: str(servers.free_port()) for p in ("8090", "9464", "8081")}
    replace = {
        "LOKI_NATS_URL": nats_url,
        "LOKI_REDIS_URL": redis_url,
        "LOKI_HOME": str(home),
        "LOKI_WEB_HOST": "127.0.0.1",
        "LOKI_PERF_METRICS_HOST": "127.0.0.1",
        "LOKI_ENGINE_HOST": "127.0.0.1",
        "LOKI_LLAMA_SERVER": str(servers.find_llama_server()),
    }
    changed: dict[str, tuple[str, str]] = {}
    out: dict[str, str] = {}
    for key, value in merged.items():
        new = replace.get(key, ports.get(value, value))
        if key in replace:
            assert key != "LOKI_NATS_URL" or value == "nats://nats:4222", value
            assert key != "LOKI_REDIS_URL" or value.startswith("redis://redis:6379/"), value
        if new != value:
            changed[key] = (value, new)
        # Nothing left that names a compose host.
        assert not re.search(r"(//|@|^)(nats|redis|engine)(:\d|/|$)", new), (key, new)
        out[key] = new
    return out, changed


def run_loki_secrets(folder: Path) -> Path:
    """Run compose's ``loki-secrets`` command (``python -m loki_shared.credentials init``) on
    ``folder`` instead of the container's ``/secrets``; return ``folder``."""
    out = render([BASE], ["gpu"])
    cmd = out.services["loki-secrets"]["command"]
    assert cmd[:2] == ["python", "-m"] and cmd[-1] == "/secrets", cmd
    proc = subprocess.run(
        [sys.executable, *cmd[1:-1], str(folder)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return folder


def own_secrets(
    folder: Path, mounted_at: str
) -> tuple[dict[str, dict[str, str]], dict[str, tuple[str, str]]]:
    """Per service, ``LOKI_SECRETS_DIR`` naming the subfolder compose mounts at ``mounted_at``
    for it (the folder of its NATS user); and that change, for the record."""
    assert mounted_at == "/run/secrets/loki", mounted_at
    per = {user: {"LOKI_SECRETS_DIR": str(folder / user)} for user in permissions.SERVICES}
    return per, {"LOKI_SECRETS_DIR": (mounted_at, str(folder / "<service>"))}


def test_the_stores_refuse_a_client_without_the_login(compose_stack: tuple[Stack, dict]) -> None:
    """With the init step's configuration NATS and Redis refuse a client that does not log
    in, while the services, each logged in as itself, serve the turns of the tests here."""
    import asyncio

    import nats as nats_client
    import redis

    stack, info = compose_stack

    async def nats_refuses() -> bool:
        try:
            nc = await nats_client.connect(
                stack.nats_url, allow_reconnect=False, max_reconnect_attempts=0
            )
        except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
            return "Authorization Violation" in str(exc)
        await nc.close()
        return False

    assert asyncio.run(nats_refuses())
    client = redis.Redis.from_url(stack.redis_url)
    with pytest.raises(redis.exceptions.AuthenticationError):
        client.ping()
    client.close()
    for user, extra in info["per_service"].items():
        assert (Path(extra["LOKI_SECRETS_DIR"]) / "loki_nats_user").read_text() == user


@pytest.fixture(scope="module")
def compose_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict]]:
    root = tmp_path_factory.mktemp("compose-procs")
    envs = compose_env()
    secrets_dir = run_loki_secrets(root / "secrets")
    nats = servers.start_nats(root / "nats", config=secrets_dir / "nats" / "nats.conf")
    redis = servers.start_redis(root / "redis", config=secrets_dir / "redis" / "redis.conf")
    try:
        env, changed = to_loopback(envs, nats.url, redis.url, root / "home")
        per_service, secret_changes = own_secrets(secrets_dir, env.pop("LOKI_SECRETS_DIR"))
        changed.update(secret_changes)
    except BaseException:
        redis.process.stop()
        nats.process.stop()
        raise
    web_port = int(env["LOKI_WEB_PORT"])
    # Only compose's values: the stack must not add LOKI_* of its own beyond what it needs to
    # find the servers (and the test environment's LOKI_* must not leak in).
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("LOKI_")]:
            mp.delenv(key)
        stack = Stack(
            StackConfig(
                home=root / "home",
                web_port=web_port,
                nats_url=nats.url,
                redis_url=redis.url,
                env=env,
                service_env=per_service,
                # the launcher asks loki.engine.info as the `cli` user, like a person would
                nats_login=LokiSettings(_secrets_dir=secrets_dir / "cli").nats_options(),
                echo=False,
            )
        )
        try:
            stack.start()
            stack.wait_engine_ready(timeout=240)
            yield stack, {"env": env, "changed": changed, "per_service": per_service}
        finally:
            stack.stop()
            redis.process.stop()
            nats.process.stop()


def test_only_wiring_values_are_changed(compose_stack: tuple[Stack, dict]) -> None:
    _, info = compose_stack
    assert set(info["changed"]) <= {
        "LOKI_NATS_URL",
        "LOKI_REDIS_URL",
        "LOKI_HOME",
        "LOKI_WEB_HOST",
        "LOKI_WEB_PORT",
        "LOKI_PERF_METRICS_HOST",
        "LOKI_PERF_METRICS_PORT",
        "LOKI_ENGINE_HOST",
        "LOKI_ENGINE_PORT",
        "LOKI_LLAMA_SERVER",
        "LOKI_SECRETS_DIR",
    }, info["changed"]


def test_chat_turn_through_the_gateway(compose_stack: tuple[Stack, dict]) -> None:
    stack, info = compose_stack
    base = f"http://127.0.0.1:{stack.config.web_port}"
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/api/chat/send", json={"content": "Reply with one word: pong"})
        assert r.status_code == 202, r.text
        conv = r.json()["conversation"]
        events: list[dict] = []
        deadline = time.monotonic() + 180
        with httpx.Client(base_url=base, timeout=httpx.Timeout(180, read=30)) as sse_http:
            with connect_sse(sse_http, "GET", "/api/chat", params={"conversation": conv}) as src:
                for sse in src.iter_sse():
                    if sse.data:
                        data = json.loads(sse.data)
                        events.append(data)
                        if data["choices"][0].get("finish_reason"):
                            break
                    assert time.monotonic() < deadline, "no end of turn"
    text = "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if e["choices"][0]["delta"].get("role") != "user"
    )
    assert text.strip(), events
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # The engine the supervisor launched is the one the compose wiring names.
    engine = stack.engine_info()
    assert engine and engine.get("state") == "ready", engine
    assert str(info["env"]["LOKI_ENGINE_PORT"]) in json.dumps(engine), engine


def _health(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    run_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "loki_shared.health", *args],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_compose_healthchecks_pass(compose_stack: tuple[Stack, dict]) -> None:
    """Each compose healthcheck command, with its ports mapped like the environment, exits 0
    against the running services."""
    stack, info = compose_stack
    env = info["env"]
    out = render([BASE], ["gpu"])
    port_map = {old: new for key, (old, new) in info["changed"].items() if key.endswith("_PORT")}
    results = {}
    for name, svc in out.services.items():
        if name not in LOKI_SERVICES:
            continue
        args = svc["healthcheck"]["test"][4:]
        args = [
            re.sub(r":(\d+)/", lambda m: f":{port_map.get(m.group(1), m.group(1))}/", a)
            for a in args
        ]
        user = "engine-supervisor" if name.startswith("engine-supervisor") else name
        proc = _health(args, {**env, **info["per_service"][user]})
        assert proc.returncode == 0, (name, args, proc.stdout, proc.stderr)
        results[name] = proc.stdout.strip()
        folder, _ = LOKI_SERVICES[name]
        sources = [*(ROOT / "services" / folder).rglob("*.py"), ROOT / "shared/loki_shared/nats.py"]
        wired = any(
            "health.attach(" in p.read_text() or "attach(broker" in p.read_text() for p in sources
        )
        if wired:  # a service that answers its health subject must not need the fallback
            assert "process fallback" not in results[name], (name, results[name])
    print("health checks:", json.dumps(results, indent=1))
    # A stopped service fails its check: the checks are not vacuous.
    stack.stop_service("recall")
    try:
        proc = _health(["recall"], {**env, **info["per_service"]["recall"]})
        assert proc.returncode == 1, proc.stdout
    finally:
        stack.start_service("recall")


def test_prometheus_targets_serve_metrics(compose_stack: tuple[Stack, dict]) -> None:
    """The perf service and llama-server answer /metrics on the ports compose gives them
    (the ports deploy/prometheus/prometheus.yml scrapes)."""
    _, info = compose_stack
    env = info["env"]
    for port in (env["LOKI_PERF_METRICS_PORT"], env["LOKI_ENGINE_PORT"]):
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert r.status_code == 200, (port, r.text[:200])
        assert "# TYPE" in r.text, r.text[:200]
