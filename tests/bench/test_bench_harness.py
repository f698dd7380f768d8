"""The harness (``python -m bench``): discovery, a result per bench, failures recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _common

GOOD = """
from bench import _common
TIMEOUT_S = {"quick": 60, "full": 60}
def run(quick):
    return _common.result("Good", tables=[_common.table("t", ["a"], [[1 if quick else 2]])],
                          targets=[_common.target("a", 1, "<=", 1)], data={"quick": quick})
"""
BROKEN = """
def run(quick):
    raise RuntimeError("no engine here")
"""
WRONG = """
def run(quick):
    return [1, 2]
"""
HANGS = """
import time
TIMEOUT_S = {"quick": 3, "full": 3}
def run(quick):
    time.sleep(600)
"""


@pytest.fixture
def extra_dir(tmp_path: Path) -> Path:
    d = tmp_path / "extra"
    d.mkdir()
    (d / "zzgood_bench.py").write_text(GOOD)
    (d / "zzbroken_bench.py").write_text(BROKEN)
    (d / "zzwrong_bench.py").write_text(WRONG)
    (d / "zzhangs_bench.py").write_text(HANGS)
    return d


def _harness(extra: Path, results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOKI_BENCH_EXTRA": str(extra)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--results",
            str(results),
            "--report",
            str(results / "BENCHMARKS.md"),
            *args,
        ],
        cwd=_common.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_list_discovers_modules(extra_dir: Path, tmp_path: Path) -> None:
    out = _harness(extra_dir, tmp_path, "--list")
    names = out.stdout.split()
    assert out.returncode == 0
    assert {"zzgood", "zzbroken", "zzhangs", "zzwrong"} <= set(names)
    if "headline" in names:
        assert names[0] == "headline"


def test_good_bench_gets_commit_machine_and_status(extra_dir: Path, tmp_path: Path) -> None:
    out = _harness(extra_dir, tmp_path, "--quick", "--only", "zzgood")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "zzgood.json").read_text())
    assert doc["status"] == "ok" and doc["mode"] == "quick" and doc["name"] == "zzgood"
    assert doc["tables"][0]["rows"] == [[1]] and doc["data"] == {"quick": True}
    assert "commit" in doc and doc["machine"]["cores"] >= 1
    assert doc["schema"] == _common.SCHEMA_VERSION
    assert "| zzgood | a | 1 | ≤ 1 | ✅ met |" in (tmp_path / "BENCHMARKS.md").read_text()
    assert not list(tmp_path.glob(".*.run.json"))


def test_failures_are_recorded_not_raised(extra_dir: Path, tmp_path: Path) -> None:
    out = _harness(
        extra_dir,
        tmp_path,
        "--quick",
        "--only",
        "zzbroken",
        "--only",
        "zzwrong",
        "--only",
        "zzhangs",
        "--only",
        "zzabsent",
        "--only",
        "zzgood",
    )
    assert out.returncode == 1
    status = {
        n: json.loads((tmp_path / f"{n}.json").read_text())
        for n in ("zzbroken", "zzwrong", "zzhangs", "zzabsent", "zzgood")
    }
    assert status["zzbroken"]["status"] == "failed"
    assert "RuntimeError: no engine here" in status["zzbroken"]["error"]
    assert status["zzwrong"]["status"] == "failed"
    assert "TypeError" in status["zzwrong"]["error"]
    assert status["zzhangs"]["status"] == "timeout"
    assert status["zzabsent"]["status"] == "missing"
    assert status["zzgood"]["status"] == "ok"  # ran after the others failed
    report = (tmp_path / "BENCHMARKS.md").read_text()
    for name, state in (("zzbroken", "failed"), ("zzhangs", "timeout"), ("zzabsent", "missing")):
        assert f"| {name} | (no figures) | — | — | ⚠ {state} |" in report
