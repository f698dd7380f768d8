"""Regenerate ``BENCHMARKS.md`` from ``bench/results/*.json``: ``python -m bench.report``.

Layout: a header with the machine facts of the newest result, one summary table of every
target (bench, figure, value, target, met), then one section per bench (headline first) with
its tables, notes, mode, commit and duration. A bench whose result says ``missing``,
``failed`` or ``timeout`` gets its section with the reason instead of figures. Every
``*.json`` file of the results folder is reported, none skipped: one that cannot be read is a
``failed`` entry naming the file; a JSON object without the harness's ``schema`` field (a
bench run by hand writing its own file) is a ``no schema`` entry — a row in the targets
table and a section saying its figures were left out and how to get them reported — and
``python -m bench.report`` names it on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ORDER_FIRST = ["headline"]


#: ``status`` of the entry for a results file without the harness's ``schema`` field.
NO_SCHEMA = "no schema"


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """One entry per ``*.json`` under ``results_dir`` (dot-files, the harness's scratch
    files, excepted), headline first, then by name. An unreadable file gives a ``failed``
    entry naming the file; a JSON object without the harness's ``schema`` field (a bench run
    by hand writing its own file, see :func:`foreign_results`) gives a :data:`NO_SCHEMA`
    entry naming the file, its figures left out."""
    docs: list[dict[str, Any]] = []
    for path in sorted(results_dir.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                raise TypeError("not a JSON object")
        except (OSError, ValueError, TypeError) as exc:
            doc = {
                "name": path.stem,
                "status": "failed",
                "title": path.stem,
                "error": f"unreadable result {path.name}: {exc}",
            }
        if "schema" not in doc and doc.get("status") != "failed":
            doc = {
                "name": path.stem,
                "status": NO_SCHEMA,
                "title": path.stem,
                "error": (
                    f"{path.name} has no `schema` field: it was not written by the harness "
                    f"(a bench run by hand?), so its figures are left out of this report. "
                    f"Run it as `python -m bench --only {path.stem}` (the file must be "
                    f"bench/results/<name>.json of a bench/<name>_bench.py), or remove it."
                ),
            }
        doc.setdefault("name", path.stem)
        docs.append(doc)
    docs.sort(key=lambda d: (d["name"] not in ORDER_FIRST, d["name"]))
    return docs


def foreign_results(results_dir: Path) -> list[str]:
    """Names of the ``*.json`` files under ``results_dir`` (dot-files excepted) that are
    JSON objects without the harness's ``schema`` field (:func:`load_results` reports each
    as a :data:`NO_SCHEMA` entry)."""
    out = []
    for path in sorted(results_dir.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "schema" not in doc:
            out.append(path.name)
    return out


def fmt(value: Any) -> str:
    """A table cell: floats to 3 significant decimals (no exponent under 1e6), None as
    ``—``, booleans as yes/no, pipes escaped."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if abs(value) >= 100:
            return f"{value:,.0f}" if abs(value) < 1e9 else f"{value:.3g}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 and value != 0 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = [
        "| " + " | ".join(fmt(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _met(value: Any) -> str:
    return {True: "✅ met", False: "❌ not met", None: "— not measured"}.get(value, str(value))


def _machine_line(machine: dict[str, Any]) -> str:
    parts = [str(machine.get("cpu", "?")), f"{machine.get('cores', '?')} logical cores"]
    if machine.get("ram_bytes"):
        parts.append(f"{machine['ram_bytes'] / 2**30:.1f} GiB RAM")
    parts += [str(machine.get("os", "?")), f"Python {machine.get('python', '?')}"]
    engine = machine.get("engine") or {}
    if engine.get("build_info"):
        parts.append(f"llama-server {engine['build_info']}")
    return ", ".join(parts)


def render(docs: list[dict[str, Any]]) -> str:
    """The whole ``BENCHMARKS.md`` text for ``docs`` (:func:`load_results`)."""
    out = [
        "# Benchmarks",
        "",
        (
            "Generated by `python -m bench.report` from `bench/results/*.json` "
            "(`make bench` runs every benchmark and regenerates this file; `make bench-quick` "
            "the quick mode). Speed figures are ratios against a baseline measured in the same "
            "run; absolute times are given alongside. Medians with their interquartile range "
            "(IQR) over repeated runs."
        ),
        "",
    ]
    newest = max(
        (d for d in docs if d.get("machine")), key=lambda d: d.get("started", ""), default=None
    )
    if newest:
        out += [f"Machine: {_machine_line(newest['machine'])}.", ""]

    rows = []
    for doc in docs:
        if doc.get("status") != "ok":
            rows.append(
                [doc["name"], "(no figures)", None, None, f"⚠ {doc.get('status', 'failed')}"]
            )
            continue
        for t in doc.get("targets") or []:
            rows.append(
                [doc["name"], t.get("name"), t.get("value"), t.get("target"), _met(t.get("met"))]
            )
    out += [
        "## Targets",
        "",
        markdown_table(["bench", "figure", "value", "target", "status"], rows)
        if rows
        else "No results yet.",
        "",
    ]

    for doc in docs:
        title = doc.get("title") or doc["name"]
        out += [f"## {title} (`{doc['name']}`)", ""]
        commit = (doc.get("commit") or "?")[:12] + (" (dirty tree)" if doc.get("dirty") else "")
        meta = [
            f"status **{doc.get('status', '?')}**",
            f"mode {doc.get('mode', '?')}",
            f"commit `{commit}`",
            f"run {doc.get('started', '?')}",
        ]
        if doc.get("duration_s") is not None:
            meta.append(f"{fmt(float(doc['duration_s']))} s")
        out += ["_" + ", ".join(meta) + "._", ""]
        if doc.get("status") != "ok":
            error = (doc.get("error") or "no reason recorded").strip()
            out += ["No figures from this run:", "", "```", error, "```", ""]
            continue
        engine = (doc.get("machine") or {}).get("engine") or {}
        if engine.get("build_info"):
            out += [
                (
                    f"Engine: llama-server {engine['build_info']}, {engine.get('total_slots')} "
                    f"slot(s), n_ctx {engine.get('n_ctx')}."
                ),
                "",
            ]
        if doc.get("notes"):
            out += [doc["notes"].strip(), ""]
        for tab in doc.get("tables") or []:
            if tab.get("title"):
                out += [f"### {tab['title']}", ""]
            out += [markdown_table(tab.get("columns") or [], tab.get("rows") or []), ""]
            if tab.get("notes"):
                out += [tab["notes"].strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def write_report(results_dir: Path, report_path: Path) -> Path:
    """Regenerate ``report_path`` from ``results_dir``; returns the path."""
    report_path.write_text(render(load_results(results_dir)))
    return report_path


def main(argv: list[str] | None = None) -> int:
    from bench._common import REPO_ROOT, RESULTS_DIR

    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    write_report(args.results, args.out)
    for name in foreign_results(args.results):
        print(
            f"warning: {name} has no `schema` field (not from the harness): its figures are "
            f"left out, the report says so",
            file=sys.stderr,
        )
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
