"""Helpers of the Prometheus tests: Debian's ``prometheus`` and ``promtool`` binaries, the
shipped configuration rewritten for loopback targets, and a Prometheus process.

The binaries come from Debian's ``prometheus`` package (``scripts/install.sh --test``); a
missing one FAILS the tests, never skips them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from loki_shared import servers

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy/prometheus"
RULES_DIR = PROM_DIR / "rules"
#: Where compose mounts RULES_DIR (the shipped prometheus.yml names files there).
CONTAINER_RULES_DIR = "/etc/prometheus/rules"


def binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``.

    Raises:
        AssertionError: not installed (``scripts/install.sh --test`` installs Debian's package).
    """
    found = shutil.which(name)
    assert found, f"{name} not found: scripts/install.sh --test installs Debian's prometheus"
    return found


def rule_files() -> list[Path]:
    files = sorted(RULES_DIR.glob("*.yml"))
    assert files, f"no rule file in {RULES_DIR}"
    return files


def loopback_config(targets: dict[str, str], interval_s: int = 1) -> dict:
    """The shipped ``prometheus.yml`` with each job's targets replaced by ``targets[job]``
    (``host:port`` on loopback), the rule files read from the repository, and a short
    scrape/evaluation interval. Jobs not in ``targets`` are dropped.

    Raises:
        AssertionError: the shipped file has no rule_files under the compose mount, or a job
            of ``targets`` is not in it.
    """
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"] = {
        "scrape_interval": f"{interval_s}s",
        "evaluation_interval": f"{interval_s}s",
    }
    rules = []
    for pattern in config.get("rule_files") or []:
        assert pattern.startswith(CONTAINER_RULES_DIR + "/"), pattern
        rules.append(str(RULES_DIR / pattern[len(CONTAINER_RULES_DIR) + 1 :]))
    assert rules, "prometheus.yml loads no rule file"
    config["rule_files"] = rules
    jobs = []
    for job in config["scrape_configs"]:
        name = job["job_name"]
        if name not in targets:
            continue
        kept = {k: v for k, v in job.items() if not k.endswith("_sd_configs")}
        kept["static_configs"] = [{"targets": [targets[name]]}]
        jobs.append(kept)
    assert {j["job_name"] for j in jobs} == set(targets), "a job is missing from prometheus.yml"
    config["scrape_configs"] = jobs
    return config


class Prometheus:
    """A Prometheus on a free loopback port with its storage in ``workdir``."""

    def __init__(self, workdir: Path, config: dict) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        check = subprocess.run(
            [binary("promtool"), "check", "config", str(self.config_path)],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        self.port = servers.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            binary("prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        self.process = servers.ManagedProcess("prometheus", argv, echo=False).start()
        try:
            self.process.wait_http_ok(f"{self.url}/-/ready", timeout=60)
        except servers.ServerStartError:
            self.process.stop()
            raise

    def query(self, expr: str) -> list[dict]:
        """The result vector of an instant query (``/api/v1/query``).

        Raises:
            AssertionError: Prometheus refused the query.
        """
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def get(self, path: str) -> dict:
        r = httpx.get(f"{self.url}{path}", timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def wait(self, what: str, ok, timeout: float = 120.0, every: float = 1.0):
        """Poll ``ok()`` until it returns a true value; return it.

        Raises:
            AssertionError: still false after ``timeout`` seconds (says ``what``).
        """
        deadline = time.monotonic() + timeout
        while True:
            got = ok()
            if got:
                return got
            assert time.monotonic() < deadline, f"{what}: not true after {timeout:.0f} s"
            time.sleep(every)

    def stop(self) -> None:
        self.process.stop()
