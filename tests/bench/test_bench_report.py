"""BENCHMARKS.md generation from sample result documents."""

from __future__ import annotations

import json
from pathlib import Path

from bench import _common, report


def _ok_doc() -> dict:
    doc = _common.result(
        "Headline: prompt recomputation ratio",
        tables=[
            _common.table(
                "By configuration",
                ["configuration", "ratio", "Σ prompt_n"],
                [["naive", 7.25, 41230], ["loki-best", 1.031, 5862]],
                notes="a note under the table",
            )
        ],
        targets=[_common.target("recomputation ratio", 1.031, "<=", 1.05)],
        notes="Session: 30 turns.",
    )
    doc.update(
        schema=1,
        name="headline",
        status="ok",
        mode="quick",
        commit="a" * 40,
        dirty=False,
        started="2026-11-30T02:00:00+00:00",
        duration_s=321.5,
        machine={
            "cpu": "Test CPU",
            "cores": 2,
            "ram_bytes": 2**34,
            "os": "Linux",
            "python": "3.11.2",
            "engine": {"build_info": "b1234", "total_slots": 1, "n_ctx": 2048},
        },
    )
    return doc


def _write(tmp: Path, name: str, doc: dict | str) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    (tmp / f"{name}.json").write_text(text)


def test_report_renders_targets_tables_and_machine(tmp_path: Path) -> None:
    _write(tmp_path, "headline", _ok_doc())
    text = report.render(report.load_results(tmp_path))
    assert text.startswith("# Benchmarks")
    assert (
        "Machine: Test CPU, 2 logical cores, 16.0 GiB RAM, Linux, Python 3.11.2, "
        "llama-server b1234." in text
    )
    assert "| headline | recomputation ratio | 1.031 | ≤ 1.05 | ✅ met |" in text
    assert "| configuration | ratio | Σ prompt_n |" in text
    assert "| naive | 7.250 | 41,230 |" in text
    assert "| loki-best | 1.031 | 5862 |" in text
    assert "a note under the table" in text and "Session: 30 turns." in text
    assert "commit `aaaaaaaaaaaa`" in text


def test_failed_missing_and_unreadable_results_are_reported(tmp_path: Path) -> None:
    _write(tmp_path, "headline", _ok_doc())
    _write(
        tmp_path,
        "gateway",
        {
            "schema": 1,
            "name": "gateway",
            "status": "failed",
            "title": "gateway",
            "error": "RuntimeError: engine exited",
        },
    )
    _write(
        tmp_path,
        "recall",
        {
            "schema": 1,
            "name": "recall",
            "status": "missing",
            "error": "bench/recall_bench.py does not exist",
        },
    )
    _write(tmp_path, "perf", "{not json")
    _write(tmp_path, "recall-by-hand", {"blocks": 100000})
    _write(tmp_path, ".gateway.run", {"blocks": 1})  # the harness's scratch file: not a result
    docs = report.load_results(tmp_path)
    assert [d["name"] for d in docs] == ["headline", "gateway", "perf", "recall", "recall-by-hand"]
    text = report.render(docs)
    assert "| gateway | (no figures) | — | — | ⚠ failed |" in text
    assert "RuntimeError: engine exited" in text
    assert "| recall | (no figures) | — | — | ⚠ missing |" in text
    assert "unreadable result perf.json" in text
    # a file without the harness's schema is reported, never skipped in silence
    assert "| recall-by-hand | (no figures) | — | — | ⚠ no schema |" in text
    assert "## recall-by-hand (`recall-by-hand`)" in text
    assert "recall-by-hand.json has no `schema` field" in text
    assert "100000" not in text  # its figures are not presented as the harness's
    assert report.foreign_results(tmp_path) == ["recall-by-hand.json"]


def test_every_results_file_and_every_table_row_is_rendered(tmp_path: Path) -> None:
    configs = ["naive", "loki-best", "loki-cache-ram", "loki-continuation", "loki-default"]
    doc = _ok_doc()
    doc["tables"] = [
        _common.table("Ratio", ["configuration", "ratio"], [[c, 1.5] for c in configs]),
        _common.table(
            "Rendering check", ["configuration", "layout"], [[c, "-c 4096 | x\ny"] for c in configs]
        ),
    ]
    _write(tmp_path, "headline", doc)
    _write(tmp_path, "by-hand", {"figure": 1})
    text = report.render(report.load_results(tmp_path))
    for title in ("### Ratio", "### Rendering check"):
        section = text.split(title, 1)[1].split("###", 1)[0]
        rows = [
            line for line in section.splitlines() if line.startswith("| ") and "---" not in line
        ]
        assert [r.split(" | ")[0][2:] for r in rows[1:]] == configs, title
    files = sorted(p.stem for p in tmp_path.glob("*.json"))
    assert all(f"(`{name}`)" in text for name in files)


def test_unmet_and_unmeasured_targets(tmp_path: Path) -> None:
    doc = _ok_doc()
    doc["targets"] = [
        _common.target("ratio", 1.2, "<=", 1.05),
        _common.target("memory", None, "<", 400, "MB"),
    ]
    _write(tmp_path, "headline", doc)
    text = report.render(report.load_results(tmp_path))
    assert "| headline | ratio | 1.200 | ≤ 1.05 | ❌ not met |" in text
    assert "| headline | memory | — | < 400 MB | — not measured |" in text


def test_cells_are_formatted_and_escaped() -> None:
    assert report.fmt(None) == "—"
    assert report.fmt(True) == "yes"
    assert report.fmt(0.0012) == "0.0012"
    assert report.fmt(12.345) == "12.3"
    assert report.fmt(1234.5) == "1,234"
    assert report.fmt(123456) == "123,456"
    assert report.fmt("a|b\nc") == "a\\|b c"


def test_write_report_writes_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "headline", _ok_doc())
    out = report.write_report(tmp_path, tmp_path / "BENCHMARKS.md")
    assert out.read_text() == report.render(report.load_results(tmp_path))
