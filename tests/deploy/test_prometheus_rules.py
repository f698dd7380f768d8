"""The recording and alerting rules of deploy/prometheus/rules: they load (``promtool check
rules``), compose mounts them where prometheus.yml looks, and the low prompt-cache alert fires
exactly when the hit ratio of kind "main" stays under its threshold for 10 minutes
(``promtool test rules`` on synthetic series)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from .compose_model import BASE, UNRAID, render
from .prom import CONTAINER_RULES_DIR, PROM_DIR, RULES_DIR, binary, loopback_config, rule_files

ALERT = "LokiPromptCacheHitRatioLow"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def rules_by_name() -> dict[str, dict]:
    out = {}
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out[rule.get("alert") or rule["record"]] = rule
    return out


def threshold() -> float:
    """The hit-ratio threshold, read from the alert's expression."""
    expr = rules_by_name()[ALERT]["expr"]
    m = re.fullmatch(
        r'kind:lokiassist_prompt_cache_hit_ratio:rate15m\{kind="main"\} < ([0-9.]+)', expr.strip()
    )
    assert m, expr
    return float(m.group(1))


def test_rules_load_without_error():
    files = [str(p) for p in rule_files()]
    out = promtool("check", "rules", *files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    rules = rules_by_name()
    assert {ALERT, "LokiPerfMetricsDown", "LokiEngineMetricsDown"} <= set(rules)
    assert rules[ALERT]["for"] == "10m"
    assert 0 < threshold() < 1
    # Every metric a rule reads is one the perf service exports (or `up`).
    from loki_perf.metrics import exported_names

    records = {r["record"] for r in rules.values() if "record" in r}
    for rule in rules.values():
        for name in re.findall(r"\b[a-z_:]*lokiassist_[a-z0-9_:]+", rule["expr"]):
            assert name in exported_names() or name in records, (name, rule["expr"])


def test_shipped_config_loads_the_rules_and_passes_promtool(tmp_path: Path):
    config = loopback_config({"loki-perf": "127.0.0.1:9", "llama-server": "127.0.0.1:9"})
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = promtool("check", "config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 rules found" in out.stdout or "rules found" in out.stdout, out.stdout


@pytest.mark.parametrize("files", [[BASE], [BASE, UNRAID]], ids=["base", "unraid"])
def test_compose_mounts_the_rules_where_prometheus_looks(files):
    out = render(files, ["cpu"])
    assert out.returncode == 0, out.stderr
    prom = out.model["services"]["prometheus"]
    mounts = {m["target"]: m for m in prom["volumes"]}
    assert Path(mounts[CONTAINER_RULES_DIR]["source"]) == RULES_DIR
    assert mounts[CONTAINER_RULES_DIR].get("read_only") is True
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == [f"{CONTAINER_RULES_DIR}/*.yml"]


def _series(kind: str, ratio: float, minutes: int) -> list[dict]:
    """Counters of one kind: 1000 prompt tokens a minute, ``ratio`` of them cached."""
    cached = round(1000 * ratio)
    labels = f'kind="{kind}",model="m"'
    return [
        {"series": f"lokiassist_prompt_tokens_total{{{labels}}}", "values": f"0+1000x{minutes}"},
        {
            "series": f"lokiassist_prompt_tokens_cached_total{{{labels}}}",
            "values": f"0+{cached}x{minutes}",
        },
        {"series": 'up{job="loki-perf",instance="perf:9464"}', "values": f"1x{minutes}"},
        {"series": 'up{job="llama-server",instance="engine:8081"}', "values": f"1x{minutes}"},
    ]


def test_low_hit_ratio_of_main_fires_after_10_minutes_and_only_then(tmp_path: Path):
    t = threshold()
    low, high = round(t - 0.1, 3), round(t + 0.1, 3)
    notes = rules_by_name()[ALERT]["annotations"]
    fired = {
        "exp_labels": {"kind": "main", "severity": "warning"},
        # The description's template renders the ratio as a percentage.
        "exp_annotations": {
            "summary": notes["summary"],
            "description": notes["description"].replace(
                "{{ $value | humanizePercentage }}", f"{low:.0%}"
            ),
        },
    }
    tests = {
        "rule_files": [str(p) for p in rule_files()],
        "evaluation_interval": "1m",
        "tests": [
            {
                # main under the threshold (and a summary kind far under it, which must not
                # alert): pending from the first minute, firing once 10 minutes have passed.
                "interval": "1m",
                "input_series": _series("main", low, 40) + _series("summary", 0.05, 40)[:2],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": ALERT, "exp_alerts": []},
                    {"eval_time": "10m", "alertname": ALERT, "exp_alerts": []},
                    {"eval_time": "12m", "alertname": ALERT, "exp_alerts": [fired]},
                    {"eval_time": "30m", "alertname": ALERT, "exp_alerts": [fired]},
                    {"eval_time": "30m", "alertname": "LokiPerfMetricsDown", "exp_alerts": []},
                ],
            },
            {
                # main above the threshold: never.
                "interval": "1m",
                "input_series": _series("main", high, 40),
                "alert_rule_test": [{"eval_time": "30m", "alertname": ALERT, "exp_alerts": []}],
            },
            {
                # main recovers after 5 minutes under: the pending alert is dropped.
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'lokiassist_prompt_tokens_total{kind="main",model="m"}',
                        "values": "0+1000x40",
                    },
                    {
                        "series": 'lokiassist_prompt_tokens_cached_total{kind="main",model="m"}',
                        "values": f"0+{round(1000 * low)}x5 {round(5000 * low)}+1000x35",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": ALERT, "exp_alerts": []},
                    {"eval_time": "30m", "alertname": ALERT, "exp_alerts": []},
                ],
            },
        ],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = promtool("test", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
