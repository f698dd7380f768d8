"""docs/behaviour.md's rule tables name the code of each rule, and that code exists.

Every table whose header starts ``| Rule | Test |`` has a third column, ``Code``: the
module and function (or class, method) that carry the rule, in backticks. The first name in a
cell is a full dotted path (``loki_shared.sse.SSEDecoder.split``); a later one is either a
full path too, ``.name`` (beside the previous one: ``.decode`` after
``loki_shared.sse.SSEDecoder.split`` is ``loki_shared.sse.SSEDecoder.decode``) or a bare
``name`` in the previous one's module. Each must import (module) and resolve (attributes).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "behaviour.md"
HEADER = re.compile(r"^\|\s*rule\s*\|\s*test\s*\|", re.IGNORECASE)
ROOTS = ("loki_shared", "loki_chat", "loki_gateway", "loki_recall", "loki_memory")
ROOTS += ("loki_supervisor", "loki_workspace")
ROOTS += ("loki_perf", "loki_cli", "bench", "tests")


def rule_rows() -> list[tuple[int, list[str]]]:
    """(line number, cells) of every row of every rule table."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows: list[tuple[int, list[str]]] = []
    i = 0
    while i < len(lines):
        if HEADER.match(lines[i]):
            header = [c.strip().lower() for c in lines[i].strip().strip("|").split("|")]
            assert header[:3] == ["rule", "test", "code"], f"line {i + 1}: {lines[i]}"
            i += 2  # the header and its |---| line
            while i < len(lines) and lines[i].startswith("|"):
                rows.append((i + 1, split_row(lines[i])))
                i += 1
        else:
            i += 1
    return rows


def split_row(line: str) -> list[str]:
    """The cells of a table row (a ``|`` inside backticks does not split)."""
    cells, cell, quoted = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "`":
            quoted = not quoted
        if ch == "|" and not quoted:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def resolve(path: str) -> Any:
    """The object a full dotted path names: its longest importable module, then attributes.

    Raises:
        LookupError: nothing by that name.
    """
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                raise LookupError(f"{path}: {'.'.join(parts[:cut])} has no {name!r}")
            obj = getattr(obj, name)
        return obj
    raise LookupError(f"{path}: no such module")


def references(cell: str) -> list[str]:
    """The full dotted paths a Code cell names (see the module docstring)."""
    out: list[str] = []
    for name in re.findall(r"`([^`]+)`", cell):
        if name.split(".")[0] in ROOTS:
            out.append(name)
        elif not out:
            raise LookupError(f"{name!r} comes first but is not a full dotted path")
        elif name.startswith("."):
            out.append(out[-1].rsplit(".", 1)[0] + name)
        else:
            previous = out[-1].split(".")
            module = next(
                ".".join(previous[:cut])
                for cut in range(len(previous), 0, -1)
                if isinstance(resolve(".".join(previous[:cut])), ModuleType)
            )
            out.append(f"{module}.{name}")
    return out


ROWS = rule_rows()


def test_the_doc_has_rule_tables():
    assert len(ROWS) > 150


@pytest.mark.parametrize(("line", "cells"), ROWS, ids=[f"line{n}" for n, _ in ROWS])
def test_each_rule_names_code_that_exists(line: int, cells: list[str]):
    assert len(cells) >= 3, f"docs/behaviour.md:{line}: no Code column"
    names = references(cells[2])
    assert names, f"docs/behaviour.md:{line}: the Code cell names no module or function"
    for name in names:
        resolve(name)


def code_mentions() -> list[tuple[int, str]]:
    """(line number, names) of every ``code:`` mention outside the tables (the rules written
    as paragraphs and bullets: ``(test...; code: `a.b.c`, `.d`)``), up to its closing
    parenthesis or the end of its paragraph; a ``code:`` that names a path or a file
    (``services/...``) is an overview, not a rule's code."""
    text = DOC.read_text(encoding="utf-8")
    out = []
    roots = "|".join(ROOTS)
    pattern = rf"\bcode: (`(?:{roots})[.`]" + r"(?:[^)\n]|\n(?!\n))*)"
    for match in re.finditer(pattern, text, re.IGNORECASE):
        line = text.count("\n", 0, match.start()) + 1
        if not text.splitlines()[line - 1].startswith("|"):
            out.append((line, match.group(1)))
    return out


MENTIONS = code_mentions()


def test_the_prose_rules_name_their_code_too():
    """The engine supervisor's and perf's rules are paragraphs: they name their code inline."""
    assert len(MENTIONS) > 30


@pytest.mark.parametrize(("line", "names"), MENTIONS, ids=[f"line{n}" for n, _ in MENTIONS])
def test_code_named_in_the_prose_exists(line: int, names: str):
    found = references(names)
    assert found, f"docs/behaviour.md:{line}: `code:` names nothing"
    for name in found:
        resolve(name)
