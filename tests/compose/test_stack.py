"""Issue 36: the stack built from the repository's Dockerfiles and brought up by Docker
Compose v2 from the real compose files (CPU engine profile), checked while it runs."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest
from openai import OpenAI

from tests.deploy.test_prometheus_live import dashboard_queries
from tests.e2e.conftest import StackClient

from .stack import Compose

#: the first test also builds the images and brings the stack up (the session fixture)
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(3600)]

#: the long-running services of the CPU profile (Grafana has no stand-in, see the override)
RUNNING = {
    "nats",
    "redis",
    "engine-supervisor-cpu",
    "recall",
    "memory",
    "perf",
    "workspace",
    "chat",
    "gateway",
    "prometheus",
}
#: containers that run as root, and why (docs/deployment.md, "Users"): the one-shot init
#: writes the 0700 credentials folder on the host; NATS runs as its official image does (its
#: volume is created root-owned; the Unraid override runs it as PUID:PGID)
ROOT_ALLOWED = {"loki-secrets", "nats"}


def client(compose: Compose) -> StackClient:
    return StackClient(f"http://127.0.0.1:{compose.web_port}")


def wait_engine(c: StackClient, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    info: dict = {}
    while time.monotonic() < deadline:
        r = c.http.get("/api/engine")
        info = r.json() if r.status_code == 200 else {}
        if info.get("state") == "ready" or info.get("ready"):
            return info
        time.sleep(2)
    raise AssertionError(f"engine not ready: {info}")


def test_every_service_is_healthy(compose: Compose) -> None:
    """After ``up --wait``: every long-running service runs and its health check passes; the
    one-shot ``loki-secrets`` completed."""
    by_service = {row["Service"]: row for row in compose.ps()}
    assert RUNNING <= set(by_service), sorted(by_service)
    for name in RUNNING:
        row = by_service[name]
        assert row["State"] == "running" and row.get("Health") == "healthy", row
    secrets = by_service["loki-secrets"]
    assert secrets["State"] == "exited" and secrets.get("ExitCode") == 0, secrets


def test_two_turn_chat_through_the_published_port_reuses_the_prompt_cache(
    compose: Compose,
) -> None:
    """The gateway's published port, the engine container's llama-server: turn 2 of a
    conversation reuses the prompt of turn 1 (``cache_n`` > 0)."""
    c = client(compose)
    wait_engine(c)
    conv = c.send("Reply with one word: pong")
    first = c.events(conv)
    assert first[-1]["choices"][0]["finish_reason"], first[-1]
    c.wait_idle(conv)
    c.send("And again, one word please.", conversation=conv)
    second = c.events(conv, last_event_id=first[-1]["seq"])
    end = second[-1]
    assert end["choices"][0]["finish_reason"], end
    assert end["timings"]["cache_n"] > 0, end["timings"]
    c.wait_idle(conv)


def test_openai_sdk_gets_a_streamed_v1_answer(compose: Compose) -> None:
    """The openai SDK, pointed at the published port's ``/v1``, streams an answer."""
    wait_engine(client(compose))
    sdk = OpenAI(base_url=f"http://127.0.0.1:{compose.web_port}/v1", api_key="unused")
    models = sdk.models.list().data
    assert models, "no model listed"
    stream = sdk.chat.completions.create(
        model=models[0].id,
        messages=[{"role": "user", "content": "Say hello."}],
        stream=True,
        max_tokens=16,
    )
    text = "".join((chunk.choices[0].delta.content or "") for chunk in stream if chunk.choices)
    assert text.strip(), "empty streamed answer"


def prom_query(compose: Compose, expr: str) -> list[dict]:
    """A PromQL instant query to the stack's Prometheus (inside its container: it publishes no
    port)."""
    url = f"http://127.0.0.1:9090/api/v1/query?query={quote(expr)}"
    out = compose("exec", "-T", "prometheus", "wget", "-q", "-O", "-", url, timeout=60)
    body = json.loads(out)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_perf_and_answers_every_dashboard_query(compose: Compose) -> None:
    """The stack's Prometheus scrapes the perf service (and llama-server), and after some
    traffic every query of the Grafana dashboard returns a series."""
    c = client(compose)
    wait_engine(c)
    conv = None
    for text in ("Repeat after me: the cat sat on the mat.", "Again: the cat sat on the mat."):
        conv = c.send(text, conv)
        c.events(conv)
        c.wait_idle(conv, timeout=600)
    deadline = time.monotonic() + 300
    missing: list[str] = []
    while time.monotonic() < deadline:
        up = {r["metric"]["job"] for r in prom_query(compose, "up == 1")}
        assert "loki-perf" in up or time.monotonic() < deadline - 240, up
        missing = [title for title, expr in dashboard_queries() if not prom_query(compose, expr)]
        if not missing and "loki-perf" in up:
            break
        time.sleep(15)
    assert not missing, f"panels with no series: {missing}"


def test_no_container_runs_as_root_but_the_documented_ones(compose: Compose) -> None:
    for name in RUNNING:
        uid = compose("exec", "-T", name, "id", "-u", timeout=60).strip()
        if name in ROOT_ALLOWED:
            continue
        assert uid != "0", f"{name} runs as root"


def test_the_engine_runs_the_pinned_llama_build(compose: Compose) -> None:
    info = wait_engine(client(compose))
    text = json.dumps(info)
    from .stack import llama_build

    assert llama_build().removeprefix("b") in text, info


def test_redis_refuses_another_services_keys(compose: Compose) -> None:
    """In the running stack: chat's Redis user can neither read nor write the supervisor's
    presets; the supervisor's can read its own."""
    secrets = compose.workdir / "secrets"

    def cli(user: str, *args: str) -> str:
        password = (secrets / user / "loki_redis_password").read_text()
        return compose(
            "exec", "-T", "-e", f"REDISCLI_AUTH={password}", "redis",
            "redis-cli", "--user", user, *args, timeout=60,
        ).strip()  # fmt: skip

    assert "NOPERM" in cli("chat", "get", "loki:engine:presets")
    assert "NOPERM" in cli("chat", "set", "loki:engine:presets", "x")
    assert "NOPERM" not in cli("engine-supervisor", "exists", "loki:engine:presets")
    assert "NOPERM" in cli("engine-supervisor", "get", "loki:chat:index")


#: Run in the chat container (whose NATS user may ask the workspace service): each request of
#: ``STEPS`` in turn, the replies printed as one JSON list.
WORKSPACE_CLIENT = """
import asyncio, json, sys
import nats
from loki_shared.settings import LokiSettings
async def main():
    s = LokiSettings()
    nc = await nats.connect(s.nats_url, **s.nats_options())
    out = []
    for subject, body in json.loads(sys.argv[1]):
        msg = await nc.request(subject, json.dumps(body).encode(), timeout=150)
        out.append(json.loads(msg.data))
    await nc.close()
    print(json.dumps(out))
asyncio.run(main())
"""


def ask_workspace(compose: Compose, steps: list[tuple[str, dict]]) -> list[dict]:
    out = compose("exec", "-T", "chat", "python", "-c", WORKSPACE_CLIENT, json.dumps(steps),
                  timeout=600)  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def test_the_workspace_container_runs_commands_in_its_sandbox(compose: Compose) -> None:
    """In the running stack, through NATS as chat: a workspace is created, a command runs in
    the sandbox as the container's user with only loopback and none of the container's
    secrets, a fork bomb fails to fork, a sleep past its limit is killed, and a commit is
    Loki's."""
    project = "composecheck"
    look = (
        "id -u; cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; "
        "ls /run/secrets /data 2>&1 | head -2; env | grep -c LOKI_ || true"
    )
    create, run, bomb, sleep, write, commit, log = ask_workspace(
        compose,
        [
            ("loki.workspace.create", {"project": project}),
            ("loki.workspace.run", {"project": project, "command": look}),
            ("loki.workspace.run", {"project": project, "timeout_s": 20,
             "command": "i=0; while [ $i -lt 400 ]; do sleep 5 & i=$((i+1)); done"}),
            ("loki.workspace.run", {"project": project, "command": "sleep 30", "timeout_s": 1}),
            ("loki.workspace.write", {"project": project, "op": "write", "path": "a.txt",
                                      "content": "hello\n"}),
            ("loki.workspace.git", {"project": project, "op": "commit", "message": "first"}),
            ("loki.workspace.git", {"project": project, "op": "log"}),
        ],
    )  # fmt: skip
    assert create.get("error") is None, create
    assert create["info"]["sandbox"].startswith("bubblewrap"), create
    assert run["exit_code"] == 0, run
    lines = run["output"].splitlines()
    assert lines[0] == "10001" and lines[1:2] == ["lo"], run["output"]
    assert "No such file or directory" in run["output"] and lines[-1] == "0", run["output"]
    assert "Cannot fork" in bomb["output"], bomb
    assert sleep["killed"] == "timeout", sleep
    assert write.get("error") is None and commit["exit_code"] == 0, (write, commit)
    assert log["output"].strip().endswith("Loki: first"), log


def test_the_workspace_preview_renders_in_the_container(compose: Compose) -> None:
    project = "composepreview"
    page = "<html><head><title>Check</title></head><body><h1>Rendered</h1></body></html>"
    _, _, preview = ask_workspace(
        compose,
        [
            ("loki.workspace.create", {"project": project}),
            ("loki.workspace.write", {"project": project, "op": "write", "path": "index.html",
                                      "content": page}),
            ("loki.workspace.preview", {"project": project, "path": "index.html"}),
        ],
    )  # fmt: skip
    assert preview.get("error") is None, preview
    assert (preview["title"], preview["text"]) == ("Check", "Rendered"), preview
    assert preview["png"].startswith("iVBORw0KGgo"), preview["png"][:40]  # base64 of a PNG
