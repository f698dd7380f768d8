"""The multi-node compose example (``docker-compose.cluster.yml`` on top of the base file,
issue 44), rendered by the real Docker Compose offline: every Loki service is wired to the
three NATS nodes and to Redis through the three sentinels; the NATS nodes route to each other;
the files ``redis-ha-init`` writes are read by a real redis-server and redis-sentinel."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from loki_shared import credentials, redis_ha, servers
from loki_shared.nats import nats_servers
from loki_shared.redis_client import parse_sentinel_url
from loki_supervisor.engine_pool import parse_engine_urls
from tests.deploy.compose_model import BASE, LOKI_SERVICES, ROOT, render

CLUSTER = ROOT / "docker-compose.cluster.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    rendered = render([BASE, CLUSTER], ["cpu"])
    assert rendered.returncode == 0, rendered.stderr
    return rendered.services


def test_every_loki_service_reaches_the_cluster(services: dict[str, dict]) -> None:
    for name in LOKI_SERVICES:
        if name not in services:  # the other engine profile
            continue
        env = services[name]["environment"]
        urls = nats_servers(env["LOKI_NATS_URL"])
        assert [u.split("//")[1].split(":")[0] for u in urls] == ["nats", "nats-2", "nats-3"]
        assert env["LOKI_JETSTREAM_REPLICAS"] == "3"
        parsed = parse_sentinel_url(env["LOKI_REDIS_URL"])
        assert {host for host, _ in parsed.sentinels} <= set(services), parsed.sentinels
        assert (parsed.service, parsed.db) == ("loki", 0)
        waits = services[name]["depends_on"]
        for part in ("nats-2", "nats-3", "redis-sentinel-1", "redis-sentinel-3"):
            assert waits[part]["condition"] == "service_healthy", (name, part)


def test_nats_nodes_form_one_cluster(services: dict[str, dict]) -> None:
    nodes = ["nats", "nats-2", "nats-3"]
    for node in nodes:
        command = services[node]["command"]
        assert command[command.index("--cluster_name") + 1] == "loki"
        routes = command[command.index("--routes") + 1].split(",")
        assert sorted(r.split("//")[1].split(":")[0] for r in routes) == sorted(
            n for n in nodes if n != node
        )
        assert "--jetstream" in command and "healthcheck" in services[node]


def test_redis_servers_and_sentinels_mount_the_ha_files(services: dict[str, dict]) -> None:
    for name in ("redis", "redis-replica", "redis-sentinel-1", "redis-sentinel-2"):
        mounts = {v["target"]: v for v in services[name]["volumes"]}
        assert mounts["/run/secrets/loki"]["source"].endswith("/redis-ha"), name
        assert mounts["/run/secrets/loki"]["read_only"] is True
        assert mounts["/data"]["type"] == "volume"  # its own writable configuration copy
    assert "replicaof redis 6379" in " ".join(services["redis-replica"]["command"])
    init = services["redis-ha-init"]
    assert init["command"][:4] == ["python", "-m", "loki_shared.redis_ha", "init"]
    assert init["depends_on"]["loki-secrets"]["condition"] == "service_completed_successfully"


def test_the_init_files_run_a_real_master_replica_and_sentinel(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    creds = credentials.init_folder(folder)
    port, replica_port, sentinel_port = (servers.free_port() for _ in range(3))
    out = redis_ha.init_folder(folder, ("127.0.0.1", port))
    again = redis_ha.init_folder(folder, ("127.0.0.1", port))  # rerun: same passwords
    assert (again / "redis.conf").read_text() == (out / "redis.conf").read_text()
    conf = out / "redis.conf"
    master = servers.start_redis(tmp_path / "m", port=port, config=conf)
    replica_conf = tmp_path / "replica.conf"
    replica_conf.write_text(f"include {conf}\nreplicaof 127.0.0.1 {port}\n")
    replica = servers.start_redis(tmp_path / "r", port=replica_port, config=replica_conf)
    sentinel_conf = tmp_path / "sentinel.conf"
    text = (out / "sentinel.conf").read_text()
    text = text.replace("port 26379", f"port {sentinel_port}").replace(
        "bind 0.0.0.0", "bind 127.0.0.1"
    )
    sentinel_conf.write_text(text.replace("dir /data", f"dir {tmp_path}"))
    argv = [str(servers.find_redis_server()), str(sentinel_conf), "--sentinel"]
    sentinel = servers.ManagedProcess("sentinel", argv).start()
    try:
        sentinel.wait_port(sentinel_port)
        health = redis.Redis(
            port=replica_port, username="health", password=(out / "password").read_text()
        )
        assert health.ping()
        admin = redis.Redis(port=replica_port, username="chat", password=creds.redis["chat"])
        deadline = time.monotonic() + 20
        s = redis.Redis(port=sentinel_port, socket_timeout=1)
        while time.monotonic() < deadline:
            master_info = s.sentinel_master("loki")
            if master_info.get("num-slaves") == 1 and not master_info.get("is_disconnected"):
                break
            time.sleep(0.2)
        assert master_info["num-slaves"] == 1, master_info  # the sentinel logged in and sees it
        assert s.sentinel_get_master_addr_by_name("loki")[1] in (port, str(port))
        with pytest.raises(redis.exceptions.ReadOnlyError):
            admin.set("loki:chat:x", "1")  # the replica replicates (read-only)
    finally:
        sentinel.stop(grace=2)
        replica.stop(grace=2)
        master.stop(grace=2)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_two_replicated_supervisors_follow_the_same_engines(profile: str) -> None:
    rendered = render([BASE, CLUSTER], [profile])
    assert rendered.returncode == 0, rendered.stderr
    services = rendered.services
    first = "engine-supervisor-cpu" if profile == "cpu" else "engine-supervisor"
    envs = [services[name]["environment"] for name in (first, "engine-supervisor-2")]
    for env in envs:
        assert env["LOKI_SUPERVISOR_REPLICATED"] == "true"
        assert env["LOKI_ENGINE_URLS"] == envs[0]["LOKI_ENGINE_URLS"]
        assert env["LOKI_NATS_URL"] == envs[0]["LOKI_NATS_URL"]
        assert env["LOKI_REDIS_URL"].startswith("redis+sentinel://")
    [spec] = parse_engine_urls(envs[0]["LOKI_ENGINE_URLS"])  # the default: engine-0
    assert spec.url.startswith("http://engine-0:8081") and "engine-0" in services
    second = services["engine-supervisor-2"]
    assert second["command"] == ["python", "-m", "loki_supervisor"]
    mounts = {v["target"]: v for v in second["volumes"]}
    assert mounts["/run/secrets/loki"]["source"].endswith("/engine-supervisor")  # its own login
    assert mounts["/data"]["source"] == "loki-data"
    assert second["environment"]["LOKI_SECRETS_DIR"] == "/run/secrets/loki"
    assert "engine-supervisor" in " ".join(second["healthcheck"]["test"])
    for part in ("nats-2", "redis-sentinel-1"):
        assert second["depends_on"][part]["condition"] == "service_healthy"


def test_engine_zero_runs_llama_server_on_the_bundled_model(tmp_path: Path) -> None:
    """engine-0's shell command as compose renders it, run here with ``echo`` in the place
    of llama-server: the model it finds (LOKI_MODEL unset: the bundled one) and its port."""
    rendered = render([BASE, CLUSTER], ["cpu"])
    command = rendered.services["engine-0"]["command"]
    assert command[:2] == ["sh", "-c"] and "exec /app/llama-server" in command[2]
    # `config` keeps compose's `$$` escape; the container's shell gets one `$`
    script = command[2].replace("$$", "$").replace("exec /app/llama-server", "exec echo")
    venv = Path(sys.executable).parent
    env = {"PATH": f"{venv}:/usr/bin:/bin", "ENGINE_MODEL": ""}
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "--host",
        "0.0.0.0",
        "--port",
        "8081",
        "-m",
        str(servers.find_bundled_model()),
        "-np",
        "2",
    ]
    env["ENGINE_MODEL"] = "/models/mine.gguf"
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "-m /models/mine.gguf" in out.stdout
