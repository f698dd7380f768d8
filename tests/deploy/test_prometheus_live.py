"""Prometheus for real: Debian's Prometheus scrapes a running stack (real llama-server, real
model) and answers every query of the Grafana dashboard with data.

The configuration is the shipped ``deploy/prometheus/prometheus.yml`` with its targets put on
loopback (the perf service's ``/metrics`` and llama-server's, which the supervisor starts with
``--metrics``) and a 1 s scrape; the rules are the shipped ones. The engine runs with a draft
n-gram speculative decoding so the speculative-decoding panel has figures.

Dashboard variables are given the values Grafana would: ``$model`` its "All" value,
``$__range`` the dashboard's default time range, ``$__rate_interval`` four times the
provisioned datasource's scrape interval (Grafana's lower bound for it).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from loki_cli.stack import Stack, StackConfig
from loki_shared import servers
from tests.e2e.conftest import StackClient

from .prom import ROOT, Prometheus, loopback_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]

DASHBOARD = ROOT / "deploy/grafana/dashboards/loki-prompt-cache.json"
DATASOURCE = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"


def _seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smhd])", text)
    assert m, text
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every target of the dashboard, variables substituted."""
    board = json.loads(DASHBOARD.read_text())
    (ds,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    rate_interval = f"{4 * _seconds(ds['jsonData']['timeInterval'])}s"
    start = board["time"]["from"]
    assert start.startswith("now-") and board["time"]["to"] == "now", board["time"]
    values = {"__rate_interval": rate_interval, "__range": start[len("now-") :]}
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["current"]["value"] == "$__all" and var.get("allValue"), var
            values[var["name"]] = var["allValue"]
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets") or []:
            expr = target["expr"]
            for name in sorted(values, key=len, reverse=True):
                expr = expr.replace("${" + name + "}", values[name]).replace(
                    "$" + name, values[name]
                )
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    assert len(out) >= 20
    return out


def finite(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {
        "LOKI_CTX": "2048",
        "LOKI_PERF_METRICS_PORT": str(servers.free_port()),
        # Speculative decoding by n-gram lookup (no draft model: the bundled model as its own
        # draft crashed this llama-server build under the supervisor's arguments): any pair
        # of tokens seen before in the context proposes the tokens that followed it, so
        # replies that repeat the prompt get drafts, and the completions carry draft_n /
        # draft_n_accepted for the draft-acceptance panel.
        "LOKI_EXTRA_ARGS": (
            "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 8"
        ),
        "LOKI_MAX_TOKENS": "96",
    }
    home = tmp_path_factory.mktemp("prom-home")
    s = Stack(StackConfig(home=home, web_port=servers.free_port(), env=env, echo=False))
    s.start()
    try:
        s.wait_engine_ready(timeout=240)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    info = stack.engine_info()
    assert info and info["base_url"], info
    engine = urlsplit(info["base_url"])
    assert engine.hostname in ("127.0.0.1", "localhost"), info["base_url"]
    perf_port = stack.service_env()["LOKI_PERF_METRICS_PORT"]
    config = loopback_config(
        {
            "loki-perf": f"127.0.0.1:{perf_port}",
            "llama-server": f"127.0.0.1:{engine.port}",
        }
    )
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), config)
    yield prom
    prom.stop()


def chat(client: StackClient, text: str, conversation: str | None = None) -> str:
    conv = client.send(text, conversation)
    client.events(conv)
    client.wait_idle(conv)
    return conv


@pytest.fixture(scope="module")
def traffic(stack: Stack, prometheus: Prometheus) -> int:
    """Turns on the real engine, in two conversations; returns how many were sent."""
    client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
    # Both targets are scraped, and llama-server's own metrics are there.
    for job in ("loki-perf", "llama-server"):
        prometheus.wait(
            f"target {job} up",
            lambda job=job: finite(prometheus.query(f'up{{job="{job}"}} == 1')),
            timeout=60,
        )
    # A first turn creates the counters; Prometheus must see them before the next turns so
    # that their rates (and the quantiles over them) move.
    first = chat(client, "Reply with one word: ready")
    prometheus.wait(
        "perf counters scraped",
        lambda: finite(prometheus.query('lokiassist_completions_total{kind="main"}')),
        timeout=60,
    )
    count = "Count from 1 to 30, separated by commas."
    chat(client, count, first)
    second = chat(client, "Name three colours.")
    chat(client, "And two fruits?", second)
    chat(client, count, first)  # back to the first: its cache was evicted
    sent = 5
    # Replies that repeat themselves give the n-gram drafter something to propose.
    while not finite(prometheus.query("sum(lokiassist_draft_tokens_total) > 0")) and sent < 9:
        chat(client, "Repeat this line three times: one two three four five six", second)
        sent += 1
        time.sleep(2)  # a scrape or two
    return sent


def test_every_dashboard_query_returns_data(prometheus: Prometheus, traffic: int) -> None:
    queries = dashboard_queries()

    def all_answer() -> list[str] | None:
        missing = [
            f"{title}: {expr}" for title, expr in queries if not finite(prometheus.query(expr))
        ]
        return None if missing else ["ok"]

    try:
        prometheus.wait("every dashboard query returns data", all_answer, timeout=40)
    except AssertionError:
        missing = [f"{t}: {e}" for t, e in queries if not finite(prometheus.query(e))]
        raise AssertionError("queries without data:\n" + "\n".join(missing)) from None

    # Figures that must be real, not merely present.
    accepted = finite(prometheus.query(next(e for t, e in queries if t == "Draft acceptance")))
    assert accepted and 0 < accepted[0] <= 1, accepted
    completions = finite(prometheus.query('sum(lokiassist_completions_total{kind="main"})'))
    assert completions and completions[0] >= traffic, completions  # tool steps add more
    llama = finite(prometheus.query('llamacpp:prompt_tokens_total{job="llama-server"}'))
    assert llama and llama[0] > 0, llama


def test_shipped_rules_are_loaded_and_evaluate(prometheus: Prometheus, traffic: int) -> None:
    def groups_evaluated() -> list[dict] | None:
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if not rules or any(r.get("health") == "unknown" for r in rules):
            return None
        return groups

    groups = prometheus.wait("rules evaluated", groups_evaluated, timeout=30)
    names = {g["name"] for g in groups}
    assert {"loki-prompt-cache", "loki-alerts"} <= names
    for group in groups:
        assert Path(group["file"]).parent == ROOT / "deploy/prometheus/rules"
        for rule in group["rules"]:
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
    ratio = prometheus.wait(
        "hit ratio of main recorded",
        lambda: finite(
            prometheus.query('kind:lokiassist_prompt_cache_hit_ratio:rate15m{kind="main"}')
        ),
        timeout=30,
    )
    assert 0 <= ratio[0] <= 1, ratio
