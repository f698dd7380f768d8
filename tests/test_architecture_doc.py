"""docs/architecture.md's module tables match the code (issue 40).

Each "Inside the … service (`services/<dir>/<package>`)" section and the shared package's
section hold a table whose first column names modules (`name.py`) and sub-packages (`name/`).
Every module of the package is named there (the chat service's sub-packages module by module,
in their row), and every name the first column gives exists: a table that lists what is gone,
or leaves out what was added, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
_SECTION = re.compile(r"^## .*\(`((?:services/[\w-]+/)?\w+/?\w*)`\)\s*$", re.M)
_TICKED = re.compile(r"`([\w./]+)`")
#: Packages whose sub-packages must be listed module by module (the issue names chat's table).
_DEEP = {"loki_chat"}


def _sections() -> dict[str, list[tuple[list[str], str]]]:
    """Package folder → its table's rows as (first-column names, whole row text)."""
    text = DOC.read_text(encoding="utf-8")
    marks = list(_SECTION.finditer(text))
    out: dict[str, list[tuple[list[str], str]]] = {}
    for i, mark in enumerate(marks):
        folder = mark.group(1).rstrip("/")
        if not (ROOT / folder).is_dir() or not (ROOT / folder / "__init__.py").exists():
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        rows = []
        for line in text[mark.end() : end].splitlines():
            if not line.startswith("| `"):
                continue
            first = line.split("|")[1]
            rows.append((_TICKED.findall(first), line))
        out[folder] = rows
    return out


SECTIONS = _sections()


def _modules(folder: Path) -> tuple[list[str], list[str]]:
    mods = sorted(
        p.name for p in folder.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}
    )
    pkgs = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").exists())
    return mods, pkgs


def test_the_doc_has_the_tables() -> None:
    assert {"services/chat/loki_chat", "shared/loki_shared"} <= set(SECTIONS)


@pytest.mark.parametrize("folder", sorted(SECTIONS))
def test_every_module_is_listed(folder: str) -> None:
    rows = SECTIONS[folder]
    named = {name for names, _ in rows for name in names}
    mods, pkgs = _modules(ROOT / folder)
    missing = [m for m in mods if m not in named] + [p + "/" for p in pkgs if p + "/" not in named]
    assert not missing, f"{folder}: not in docs/architecture.md's table: {missing}"
    if Path(folder).name not in _DEEP:
        return
    for pkg in pkgs:
        row = " ".join(line for names, line in rows if pkg + "/" in names)
        inner, _ = _modules(ROOT / folder / pkg)
        ticked = set(_TICKED.findall(row))
        gone = [m for m in inner if m not in ticked and f"{pkg}/{m}" not in ticked]
        assert not gone, f"{folder}/{pkg}: modules not named in its row: {gone}"


@pytest.mark.parametrize("folder", sorted(SECTIONS))
def test_every_listed_name_exists(folder: str) -> None:
    base = ROOT / folder
    stale = []
    for names, _ in SECTIONS[folder]:
        for name in names:
            if name.endswith(".py") and not (base / name).is_file():
                stale.append(name)
            elif name.endswith("/") and not (base / name).is_dir():
                stale.append(name)
    assert not stale, f"{folder}: docs/architecture.md lists what the code no longer has: {stale}"
