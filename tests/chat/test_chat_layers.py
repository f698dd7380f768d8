"""The chat service's lower rooms never import the rooms that compose them (issue 40): the
scheduler gets this instance's conversations, and the toolbox the memory service's calls, from
the composer (``loki_chat.service``), so ``tasks/`` and ``tools/`` import no module above them.
Read from the source (every ``import``, at module level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services/chat/loki_chat"

#: A room, and the chat modules (or packages) none of its modules may import.
FORBIDDEN: dict[str, set[str]] = {
    "tasks": {"ownership", "actor", "handlers", "service", "turn"},
    "tools": {"project", "ownership", "actor", "handlers", "service", "turn"},
}


def imported(path: Path, room: str) -> set[str]:
    """The ``loki_chat`` modules ``path`` (a module of ``loki_chat.<room>``) imports, as
    dotted names under ``loki_chat`` (``project.memory_link``), relative imports resolved."""
    package = ["loki_chat", room]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                head = ".".join(base + ([node.module] if node.module else []))
            else:
                head = node.module or ""
            names = [head] + [f"{head}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("loki_chat."):
                out.add(name.removeprefix("loki_chat."))
    return out


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_lower_room_imports_nothing_above_it(room: str) -> None:
    modules = sorted((PACKAGE / room).glob("*.py"))
    assert modules, room
    for path in modules:
        for name in imported(path, room):
            top = name.split(".")[0]
            assert top not in FORBIDDEN[room], f"{room}/{path.name} imports loki_chat.{name}"
