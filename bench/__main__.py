"""The benchmark harness: ``python -m bench [--quick] [--only NAME ...] [--list]``.

Discovers ``bench/<name>_bench.py`` modules, runs each in its own Python process (a crash,
a hang or a leaked server in one bench cannot take the others down), writes one result per
bench to ``bench/results/<name>.json`` and regenerates ``BENCHMARKS.md``.

A module that is expected but missing, that raises, that exits without a result or that runs
past its time limit gets a result with ``status`` ``missing`` / ``failed`` / ``timeout``; the
report shows it instead of the harness crashing. The exit status is 0 when every bench that
ran gave a result (``ok``), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import _common
from bench import report as report_mod

BENCH_DIR = Path(__file__).resolve().parent

#: Benches the issues ask for; one missing from the tree is reported as ``missing``.
EXPECTED = [
    "headline",
    "memory",
    "recall",
    "perf",
    "gateway",
    "side_slot",
    "compaction",
    "ui_render",
    "chaos",
    "tail_reuse_quality",
    "long_conversation",
    "headline_long",
    "engine_measure",
    "engines",
]

#: Time limits (s) when a module does not set ``TIMEOUT_S = {"quick": .., "full": ..}``.
DEFAULT_TIMEOUT_S = {"quick": 300, "full": 1800}

#: Run order: the headline first (the figure that matters most), the rest alphabetically.
FIRST = ["headline"]


def bench_dirs() -> list[Path]:
    """``bench/`` and the ``LOKI_BENCH_EXTRA`` directories (see ``bench/__init__``)."""
    import bench

    return [Path(d) for d in bench.__path__]


def discover(dirs: list[Path] | None = None) -> list[str]:
    """Names of the bench modules present (``<name>_bench.py`` → ``name``), headline first."""
    names = sorted(
        {p.name[: -len("_bench.py")] for d in (dirs or bench_dirs()) for p in d.glob("*_bench.py")}
    )
    return [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]


def base_document(name: str, quick: bool) -> dict[str, Any]:
    """The fields the harness puts in every result: schema, name, mode, commit, machine."""
    return {
        "schema": _common.SCHEMA_VERSION,
        "name": name,
        "mode": "quick" if quick else "full",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        **_common.git_commit(),
        "machine": _common.machine_facts(),
    }


def status_document(
    name: str, quick: bool, status: str, error: str, duration_s: float | None = None
) -> dict[str, Any]:
    """A result recording that bench ``name`` gave no figures (``missing``, ``failed``,
    ``timeout``) and why."""
    doc = base_document(name, quick)
    doc.update(
        status=status,
        error=error,
        duration_s=duration_s,
        title=name,
        tables=[],
        targets=[],
        data={},
        notes="",
    )
    return doc


def run_one(name: str, quick: bool, out: Path) -> int:
    """In the child process: import ``bench.<name>_bench``, call ``run(quick)``, write the
    completed document to ``out``. A raised exception is written as a ``failed`` result.
    Returns the process exit status."""
    start = time.monotonic()
    try:
        module = importlib.import_module(f"bench.{name}_bench")
        document = module.run(quick=quick)
        if not isinstance(document, dict) or not isinstance(document.get("tables"), list):
            raise TypeError(
                "run() must return a dict with a 'tables' list (build it with bench._common.result)"
            )
    except BaseException as exc:  # noqa: BLE001 - recorded, never lost
        tail = traceback.format_exc().strip().splitlines()[-12:]
        doc = status_document(
            name,
            quick,
            "failed",
            f"{type(exc).__name__}: {exc}\n" + "\n".join(tail),
            time.monotonic() - start,
        )
        _write(out, doc)
        return 1
    doc = base_document(name, quick)
    for key in ("title", "tables", "targets", "data", "notes"):
        doc[key] = document.get(
            key, [] if key in ("tables", "targets") else ({} if key == "data" else "")
        )
    if document.get("engine"):
        doc["machine"]["engine"] = document["engine"]
    doc.update(status="ok", error=None, duration_s=round(time.monotonic() - start, 1))
    _write(out, doc)
    return 0


def _write(out: Path, doc: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(
        json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    )
    tmp.replace(out)


def timeout_for(name: str, quick: bool) -> float:
    """The module's ``TIMEOUT_S[mode]`` read from its source without importing it (a module
    that fails to import still gets the default)."""
    mode = "quick" if quick else "full"
    import ast

    try:
        path = next(
            d / f"{name}_bench.py" for d in bench_dirs() if (d / f"{name}_bench.py").exists()
        )
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TIMEOUT_S" for t in node.targets
            ):
                value = ast.literal_eval(node.value)
                return float(value[mode])
    except (OSError, StopIteration, SyntaxError, ValueError, KeyError, TypeError):
        pass
    return float(DEFAULT_TIMEOUT_S[mode])


def run_child(
    name: str, quick: bool, results_dir: Path, timeout: float, python: str = sys.executable
) -> dict[str, Any]:
    """Run bench ``name`` in a child process (its own process group, killed whole on
    timeout) and return its result document (read back, or a ``failed``/``timeout`` one)."""
    scratch = results_dir / f".{name}.run.json"
    scratch.unlink(missing_ok=True)
    argv = [python, "-m", "bench", "--run-one", name, "--out", str(scratch)]
    if quick:
        argv.append("--quick")
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=_common.REPO_ROOT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        code = proc.wait(timeout=timeout)
        status = None
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        code, status = None, "timeout"
    elapsed = round(time.monotonic() - start, 1)
    _kill_group(proc)  # servers a bench left behind
    if status == "timeout":
        doc = status_document(name, quick, "timeout", f"ran past {timeout:.0f} s", elapsed)
    elif scratch.exists():
        doc = json.loads(scratch.read_text())
        scratch.unlink()
    else:
        doc = status_document(
            name, quick, "failed", f"exited with status {code} without a result", elapsed
        )
    _common.write_result(name, doc, results_dir)
    return doc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="quick mode (a few minutes)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this bench (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list the benches and exit")
    parser.add_argument("--results", type=Path, default=_common.RESULTS_DIR)
    parser.add_argument("--report", type=Path, default=_common.REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.run_one:
        return run_one(args.run_one, args.quick, args.out)

    present = discover()
    if args.list:
        for name in present:
            print(name)
        return 0
    wanted = args.only or sorted(set(EXPECTED) | set(present), key=lambda n: (n not in FIRST, n))
    failures = 0
    for name in wanted:
        if name not in present:
            print(f"[bench] {name}: missing (no bench/{name}_bench.py)", file=sys.stderr)
            _common.write_result(
                name,
                status_document(
                    name, args.quick, "missing", f"bench/{name}_bench.py does not exist"
                ),
                args.results,
            )
            failures += 1
            continue
        limit = timeout_for(name, args.quick)
        print(
            f"[bench] {name}: running ({'quick' if args.quick else 'full'}, limit {limit:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        doc = run_child(name, args.quick, args.results, limit)
        print(
            f"[bench] {name}: {doc['status']} in {doc.get('duration_s')} s"
            + (f" — {doc['error'].splitlines()[0]}" if doc.get("error") else ""),
            file=sys.stderr,
            flush=True,
        )
        failures += doc["status"] != "ok"
    report_mod.write_report(args.results, args.report)
    print(f"[bench] wrote {args.report}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
