"""Issue 9: the compose files, rendered by the real Docker Compose (offline), are wired right.

No Docker engine is needed: ``docker-compose config`` parses, merges, interpolates and
validates the files; these tests then check the rendered model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .compose_model import (
    BASE,
    LOKI_SERVICES,
    ROOT,
    UNRAID,
    dockerfile_args,
    dockerfile_of,
    env_of,
    image_for,
    render,
)

FILE_SETS = {"base": [BASE], "unraid": [BASE, UNRAID]}
PROFILES = ["gpu", "cpu"]
ENGINE_OF_PROFILE = {"gpu": "engine-supervisor", "cpu": "engine-supervisor-cpu"}
PUBLISHED = {"gateway", "grafana"}


@pytest.fixture(
    scope="module",
    params=[(f, p) for f in FILE_SETS for p in PROFILES],
    ids=lambda fp: f"{fp[0]}-{fp[1]}",
)
def rendered(request: pytest.FixtureRequest) -> tuple[str, str, dict]:
    files, profile = request.param
    out = render(FILE_SETS[files], [profile])
    assert out.returncode == 0, out.stderr
    return files, profile, out.model


def _one_shots(model: dict) -> set[str]:
    """Services run once (restart "no") that others wait for with
    ``service_completed_successfully``: they need no health check."""
    waited = {
        dep
        for svc in model["services"].values()
        for dep, cond in (svc.get("depends_on") or {}).items()
        if cond.get("condition") == "service_completed_successfully"
    }
    return {n for n in waited if model["services"][n].get("restart") in ("no", None)}


def test_profile_selects_exactly_one_engine(rendered: tuple[str, str, dict]) -> None:
    _, profile, model = rendered
    engines = {n for n in model["services"] if n.startswith("engine-supervisor")}
    assert engines == {ENGINE_OF_PROFILE[profile]}
    svc = model["services"][ENGINE_OF_PROFILE[profile]]
    assert "engine" in svc["networks"]["internal"]["aliases"]
    assert svc["build"]["target"] == {"gpu": "cuda", "cpu": "cpu"}[profile]


def test_no_profile_renders_the_stack_without_engine() -> None:
    out = render([BASE], [])
    assert out.returncode == 0, out.stderr
    assert not any(n.startswith("engine-supervisor") for n in out.services)
    assert {"nats", "redis", "chat", "recall", "memory", "perf", "gateway"} <= set(out.services)


def test_grafana_password_is_required() -> None:
    out = render([BASE], ["gpu"], required=False)
    assert out.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in out.stderr


def test_every_service_has_a_healthcheck(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    one_shots = _one_shots(model)
    for name, svc in model["services"].items():
        if name in one_shots:
            continue
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name} has no healthcheck"
        assert hc["test"][0] in ("CMD", "CMD-SHELL") and len(hc["test"]) > 1, name


def test_loki_healthchecks_ask_the_right_thing(rendered: tuple[str, str, dict]) -> None:
    """NATS health names are the names the services give ``make_broker``; HTTP checks hit the
    port the service is told to listen on."""
    _, _, model = rendered
    for name, svc in model["services"].items():
        if name not in LOKI_SERVICES:
            continue
        folder, package = LOKI_SERVICES[name]
        test = svc["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "loki_shared.health"], (name, test)
        args = test[4:]
        env = env_of(svc)
        if args[0] == "--http":
            url = args[1]
            port = int(re.match(r"http://127\.0\.0\.1:(\d+)/", url).group(1))
            key = {"gateway": "LOKI_WEB_PORT", "perf": "LOKI_PERF_METRICS_PORT"}[name]
            assert int(env[key]) == port, (name, url, env.get(key))
            host_key = {"gateway": "LOKI_WEB_HOST", "perf": "LOKI_PERF_METRICS_HOST"}[name]
            assert env[host_key] == "0.0.0.0", (name, "must listen beyond loopback")
            if name == "gateway":  # the check carries no key: it must pass with LOKI_API_KEY
                from loki_gateway.auth import is_protected

                assert not is_protected(url.split(str(port), 1)[1]), url
        else:
            service_name = args[0]
            sources = "\n".join(p.read_text() for p in (ROOT / "services" / folder).rglob("*.py"))
            assert f'make_broker(settings.nats_url, "{service_name}")' in sources or re.search(
                rf'make_broker\([^)]*"{re.escape(service_name)}"[,)]', sources
            ), f"{name}: no broker named {service_name!r} in services/{folder}"
            if "--fallback-process" in args:
                assert args[args.index("--fallback-process") + 1] == package


def test_depends_on_waits_for_health(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    services = model["services"]
    one_shots = _one_shots(model)
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on missing {dep}"
            if dep in one_shots:
                assert cond["condition"] == "service_completed_successfully"
            else:
                assert cond["condition"] == "service_healthy", (name, dep, cond)
                assert services[dep].get("healthcheck"), dep
    # The start order of issue 2: infrastructure first, the gateway after chat.
    for name in ("recall", "memory", "perf", "chat", "gateway"):
        assert {"nats", "redis"} <= set(services[name]["depends_on"]), name
    assert {"chat", "memory"} <= set(services["gateway"]["depends_on"])


def test_restart_policies(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    one_shots = _one_shots(model)
    for name, svc in model["services"].items():
        if name not in one_shots:
            assert svc.get("restart") in ("unless-stopped", "always"), name


def test_referenced_volumes_networks_and_paths_exist(rendered: tuple[str, str, dict]) -> None:
    files, _, model = rendered
    declared_volumes = set(model.get("volumes", {}))
    declared_networks = set(model.get("networks", {}))
    for name, svc in model["services"].items():
        for mount in svc.get("volumes", []):
            if mount["type"] == "volume":
                assert mount["source"] in declared_volumes, (name, mount)
            elif mount["type"] == "bind":
                src = Path(mount["source"])
                generated = (
                    ROOT / "models",
                    ROOT / "repos",
                    ROOT / "secrets",
                )  # the user's / loki-secrets'
                if src.is_relative_to(ROOT) and not any(src.is_relative_to(g) for g in generated):
                    assert src.exists(), (name, "bind source missing in the repository", src)
        if svc.get("network_mode") == "none":
            continue
        assert svc.get("networks"), f"{name} has no network"
        for net in svc["networks"]:
            assert net in declared_networks, (name, net)


def test_only_gateway_and_grafana_are_published(rendered: tuple[str, str, dict]) -> None:
    files, _, model = rendered
    published = {n for n, s in model["services"].items() if s.get("ports")}
    assert published == PUBLISHED
    assert model["networks"]["internal"].get("internal") is True
    for name, svc in model["services"].items():
        nets = set(svc.get("networks") or {})
        if name in PUBLISHED or name == "chat":
            continue
        assert nets <= {"internal"}, (name, nets)
    ports = {n: model["services"][n]["ports"] for n in PUBLISHED}
    assert [p["target"] for p in ports["gateway"]] == [8090]
    assert [p["target"] for p in ports["grafana"]] == [3000]
    expected_ip = "0.0.0.0" if files == "unraid" else "127.0.0.1"
    for n in PUBLISHED:
        assert [p["host_ip"] for p in ports[n]] == [expected_ip], (n, ports[n])


def test_published_port_and_address_follow_env() -> None:
    out = render([BASE], ["gpu"], env={"LOKI_WEB_PORT": "18090", "LOKI_BIND_ADDR": "0.0.0.0"})
    assert out.returncode == 0, out.stderr
    (port,) = out.services["gateway"]["ports"]
    assert (port["host_ip"], str(port["published"]), port["target"]) == ("0.0.0.0", "18090", 8090)
    # Inside the container the gateway still listens on 8090.
    assert env_of(out.services["gateway"])["LOKI_WEB_PORT"] == "8090"


def test_commands_match_python_m_entry_points(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    for name, svc in model["services"].items():
        if name not in LOKI_SERVICES:
            continue
        folder, package = LOKI_SERVICES[name]
        assert svc["command"] == ["python", "-m", package], (name, svc["command"])
        assert (ROOT / "services" / folder / package / "__main__.py").exists(), package
        pyproject = (ROOT / "services" / folder / "pyproject.toml").read_text()
        assert f'"{package}*"' in pyproject, f"{package} not packaged by services/{folder}"
        # The image builds that service and, by default, runs the same command.
        assert svc["build"]["context"] == str(ROOT)
        image = image_for(svc)
        assert image.run(image.cmd) == ["python", "-m", package], (name, image.cmd)


def test_nats_and_redis_persist(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    nats, redis = model["services"]["nats"], model["services"]["redis"]
    assert "--jetstream" in nats["command"]
    store = nats["command"][nats["command"].index("--store_dir") + 1]
    assert store in {m["target"] for m in nats["volumes"]}, "JetStream store not on a volume"
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    data_dir = redis["command"][redis["command"].index("--dir") + 1]
    assert data_dir in {m["target"] for m in redis["volumes"]}


def test_loki_services_are_wired_to_nats_redis_and_shared_data(
    rendered: tuple[str, str, dict],
) -> None:
    _, _, model = rendered
    for name, svc in model["services"].items():
        if name not in LOKI_SERVICES:
            continue
        env = env_of(svc)
        assert env["LOKI_NATS_URL"] == "nats://nats:4222", name
        assert env["LOKI_REDIS_URL"].startswith("redis://redis:6379/"), name
        # One LOKI_HOME for every service: replicas and services share the sealing key file
        # (created once, by an exclusive create) unless LOKI_SECRET_KEY is given.
        assert env["LOKI_HOME"] == "/data"
        homes = {m["source"] for m in svc["volumes"] if m["target"] == "/data"}
        assert len(homes) == 1, (name, homes)
    # ... but the workspace service's: it seals nothing and never sees the others' data, its
    # /data is a volume of its own (the workspaces).
    sources = {
        next(m["source"] for m in s["volumes"] if m["target"] == "/data")
        for n, s in model["services"].items()
        if n in LOKI_SERVICES and n != "workspace"
    }
    assert len(sources) == 1, sources
    own = {m["source"] for m in model["services"]["workspace"]["volumes"] if m["target"] == "/data"}
    assert own and not own & sources, own


def test_engine_is_reachable_by_name(rendered: tuple[str, str, dict]) -> None:
    """The supervisor launches llama-server on ``engine:8081``: the lease's base_url then
    names a host every container resolves, and Prometheus scrapes the same address."""
    _, profile, model = rendered
    svc = model["services"][ENGINE_OF_PROFILE[profile]]
    env = env_of(svc)
    assert env["LOKI_ENGINE_HOST"] == "engine" and svc["hostname"] == "engine"
    assert env["LOKI_ENGINE_PORT"] == "8081"
    assert "8081" in [str(p) for p in svc.get("expose", [])]
    models = [m for m in svc["volumes"] if m["target"] == "/models"]
    assert models and models[0].get("read_only") is True


def test_gpu_is_reserved_only_for_the_gpu_engine(rendered: tuple[str, str, dict]) -> None:
    _, profile, model = rendered
    svc = model["services"][ENGINE_OF_PROFILE[profile]]
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    if profile == "gpu":
        assert any(
            "gpu" in d.get("capabilities", []) and d.get("driver") == "nvidia" for d in devices
        ), devices
    else:
        assert devices == []
    for name, other in model["services"].items():
        if name != ENGINE_OF_PROFILE[profile]:
            assert not (other.get("deploy") or {}).get("resources"), name


def test_engine_image_is_the_pinned_llama_cpp_image(rendered: tuple[str, str, dict]) -> None:
    """The engine image is upstream's llama.cpp server image of the build the Dockerfile pins;
    compose passes no build of its own (the pin is named once: tests/deploy/test_engine_build.py)."""
    _, profile, model = rendered
    svc = model["services"][ENGINE_OF_PROFILE[profile]]
    image = image_for(svc)
    flavour = {"gpu": "server-cuda", "cpu": "server"}[profile]
    pinned = dockerfile_args(dockerfile_of(svc))["LLAMA_CPP_BUILD"]
    assert image.bases[-1] == f"ghcr.io/ggml-org/llama.cpp:{flavour}-{pinned}", image.bases
    assert "LLAMA_CPP_BUILD" not in (svc["build"].get("args") or {})
    assert image.env["LOKI_LLAMA_SERVER"] == "/app/llama-server"


def test_prometheus_scrapes_perf_and_llama_server(rendered: tuple[str, str, dict]) -> None:
    _, profile, model = rendered
    prom = model["services"]["prometheus"]
    mount = next(m for m in prom["volumes"] if m["target"] == "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(Path(mount["source"]).read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}

    # Every target host is a service (or a network alias) on Prometheus's network, on the
    # port that service listens on.
    names: dict[str, dict] = {}
    for name, svc in model["services"].items():
        names[name] = svc
        for net in (svc.get("networks") or {}).values():
            for alias in (net or {}).get("aliases") or []:
                names[alias] = svc

    def listens(svc: dict, port: int) -> bool:
        env = env_of(svc)
        return str(port) in [str(p) for p in svc.get("expose", [])] and str(port) in env.values()

    perf = jobs["loki-perf"]["dns_sd_configs"][0]
    assert perf["names"] == ["perf"] and listens(names["perf"], perf["port"])
    (target,) = jobs["llama-server"]["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in names and listens(names[host], int(port)), target
    for job in ("loki-perf", "llama-server"):
        assert jobs[job].get("metrics_path", "/metrics") == "/metrics"
    assert "prometheus.yml" in " ".join(prom["command"])


def test_grafana_is_provisioned_and_closed(rendered: tuple[str, str, dict]) -> None:
    _, _, model = rendered
    graf = model["services"]["grafana"]
    env = env_of(graf)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "test-admin-password"
    mounts = {m["target"]: m for m in graf["volumes"]}
    prov = Path(mounts["/etc/grafana/provisioning"]["source"])
    assert prov == ROOT / "deploy/grafana/provisioning"
    (ds,) = yaml.safe_load((prov / "datasources/prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    assert "prometheus" in model["services"]
    assert "9090" in [str(p) for p in model["services"]["prometheus"]["expose"]]
    (provider,) = yaml.safe_load((prov / "dashboards/loki.yml").read_text())["providers"]
    path = provider["options"]["path"]
    assert Path(mounts[path]["source"]) == ROOT / "deploy/grafana/dashboards"
    assert mounts[path].get("read_only") is True
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/")


def test_grafana_dashboards_use_the_provisioned_datasource() -> None:
    """The home dashboard compose names is shipped; every dashboard JSON is valid and names
    only the provisioned datasource (directly, or through a Prometheus datasource variable,
    which resolves to the default datasource: ours)."""
    import json

    ds = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert ds["isDefault"] is True
    base = yaml.safe_load(BASE.read_text())
    home = base["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).is_file(), home
    dashboards = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
    assert dashboards

    def datasources(node: object) -> Iterator[dict]:
        if isinstance(node, dict):
            if isinstance(node.get("datasource"), dict):
                yield node["datasource"]
            for value in node.values():
                yield from datasources(value)
        elif isinstance(node, list):
            for value in node:
                yield from datasources(value)

    for path in dashboards:
        board = json.loads(path.read_text())
        variables = {
            v["name"]
            for v in board.get("templating", {}).get("list", [])
            if v.get("type") == "datasource" and v.get("query") == "prometheus"
        }
        allowed = {ds["uid"]} | {f"${{{v}}}" for v in variables} | {f"${v}" for v in variables}
        found = list(datasources(board))
        assert found, path.name
        for ref in found:
            assert ref.get("type", "prometheus") == "prometheus", (path.name, ref)
            assert ref.get("uid") in allowed, (path.name, ref, allowed)


def test_unraid_conventions() -> None:
    out = render([BASE, UNRAID], ["gpu"], env={"PUID": "1000", "PGID": "1001"})
    assert out.returncode == 0, out.stderr
    services = out.services
    for name, svc in services.items():
        if name in ("loki-init", "loki-secrets"):  # one-shots preparing folders, as root
            assert svc["user"] == "0:0" and svc.get("network_mode") == "none"
            continue
        assert svc.get("user") == "1000:1001", name
        assert (
            services[name]["depends_on"]["loki-init"]["condition"]
            == "service_completed_successfully"
        ), name
        for mount in svc.get("volumes", []):
            if mount["target"] == "/models":
                assert mount["source"] == "/mnt/user/models" and mount.get("read_only")
            elif mount["type"] == "bind" and not Path(mount["source"]).is_relative_to(ROOT):
                assert mount["source"].startswith("/mnt/user/appdata/loki/"), (name, mount)
            assert mount["type"] == "bind", (name, mount)
    init_cmd = " ".join(services["loki-init"]["command"])
    for name, svc in services.items():
        for mount in svc.get("volumes", []):
            src = mount["source"]
            if src.startswith("/mnt/user/appdata/loki/"):
                sub = src.removeprefix("/mnt/user/appdata/loki/")
                assert f"/appdata/{sub}" in init_cmd, f"loki-init does not prepare {sub}"
    assert services["engine-supervisor"].get("runtime") == "nvidia"


def test_unraid_init_prepares_appdata(tmp_path: Path) -> None:
    """``loki-init``'s command, run by a real shell on a scratch folder, creates every appdata
    folder and gives it to PUID:PGID."""
    import os
    import subprocess

    uid, gid = os.getuid(), os.getgid()
    out = render([BASE, UNRAID], ["gpu"], env={"PUID": str(uid), "PGID": str(gid)})
    init = out.services["loki-init"]
    argv = [a.replace("$$", "$") for a in init["command"]]
    assert argv[:2] == ["sh", "-c"]
    script = argv[2].replace("/appdata", str(tmp_path / "appdata"))
    env = {"PATH": os.environ["PATH"], **{k: str(v) for k, v in init["environment"].items()}}
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    for sub in ("nats", "redis", "data", "prometheus", "grafana"):
        st = (tmp_path / "appdata" / sub).stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), sub


def test_unraid_appdata_follows_env() -> None:
    out = render(
        [BASE, UNRAID],
        ["cpu"],
        env={"LOKI_APPDATA": "/mnt/cache/appdata/loki2", "LOKI_MODELS_DIR": "/mnt/user/gguf"},
    )
    assert out.returncode == 0, out.stderr
    sources = {m["source"] for s in out.services.values() for m in s.get("volumes", [])}
    assert "/mnt/cache/appdata/loki2/data" in sources
    assert "/mnt/user/gguf" in sources
    assert not any(s.startswith("/mnt/user/appdata") for s in sources)


def test_each_container_gets_its_own_credentials_only(rendered: tuple[str, str, dict]) -> None:
    """Issue 22: ``loki-secrets`` generates the passwords first; NATS runs with the generated
    permissions, Redis with its ACL users, and each container mounts only its own folder
    of LOKI_SECRETS_DIR (its NATS user's password, not another's)."""
    from loki_shared import permissions

    _, _, model = rendered
    services = model["services"]
    init = services["loki-secrets"]
    assert init["command"] == ["python", "-m", "loki_shared.credentials", "init", "/secrets"]
    assert init.get("network_mode") == "none" and init.get("restart") == "no"
    (init_mount,) = init["volumes"]
    base = Path(init_mount["source"])

    def secrets_of(name: str) -> Path:
        mounts = [m for m in services[name]["volumes"] if m["target"] == "/run/secrets/loki"]
        assert len(mounts) == 1 and mounts[0].get("read_only"), (name, mounts)
        assert not any(Path(m["source"]) == base for m in services[name]["volumes"]), name
        return Path(mounts[0]["source"])

    for name, svc in services.items():
        if name == "loki-secrets" or name not in LOKI_SERVICES | {"nats": 0, "redis": 0}:
            continue
        deps = svc["depends_on"]
        assert deps["loki-secrets"]["condition"] == "service_completed_successfully", name
    assert secrets_of("nats") == base / "nats"
    nats_cmd = services["nats"]["command"]
    assert nats_cmd[nats_cmd.index("-c") + 1] == "/run/secrets/loki/nats.conf"
    assert secrets_of("redis") == base / "redis"
    assert services["redis"]["command"][:2] == ["redis-server", "/run/secrets/loki/redis.conf"]
    assert "/run/secrets/loki/password" in " ".join(services["redis"]["healthcheck"]["test"])
    for name in LOKI_SERVICES:
        if name not in services:
            continue
        user = "engine-supervisor" if name.startswith("engine-supervisor") else name
        assert user in {row.user for row in permissions.USERS}, name
        assert secrets_of(name) == base / user, name
        assert env_of(services[name])["LOKI_SECRETS_DIR"] == "/run/secrets/loki", name


def test_the_init_step_writes_what_the_containers_mount(tmp_path: Path) -> None:
    """``loki-secrets``'s command, run here on a scratch folder, writes every file the
    containers read from their mounts (names as compose mounts them)."""
    import subprocess
    import sys

    out = render([BASE], ["gpu", "tools"])
    assert out.returncode == 0, out.stderr
    cmd = out.services["loki-secrets"]["command"]
    argv = [sys.executable if a == "python" else a for a in cmd]
    argv[-1] = str(tmp_path / "secrets")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    base = Path(out.services["loki-secrets"]["volumes"][0]["source"])
    for name, svc in out.services.items():
        for mount in svc.get("volumes", []):
            if mount["target"] != "/run/secrets/loki":
                continue
            folder = tmp_path / "secrets" / Path(mount["source"]).relative_to(base)
            assert folder.is_dir(), (name, folder)
            if name == "nats":
                assert (folder / "nats.conf").read_text().count('"user"') >= 5
            elif name == "redis":
                assert "user default reset off" in (folder / "redis.conf").read_text()
                assert (folder / "password").read_text()
            else:
                assert (folder / "loki_nats_password").read_text(), name
                assert (folder / "loki_redis_password").read_text(), name
