"""The project block: what a conversation's model is told about its project.

Rules (seeds, "PROJETS"/"TRACKERS"/"PROJ_SNAPSHOT"; issue 18):

- The block holds the project's description, its memory index (``MEMORY.md``: one line per
  page, ``- [Title](file.md) — description``, maintained by code), the latest value of each
  tracker (one line each, in the order given: the memory service's order is deterministic)
  and the project's instructions file, when any; in code mode, the ``AGENTS.md`` of the
  project's workspace (its repository's root), when it has one (issue 43). An empty
  project renders to ``""``: no block at all, so a request without project content stays
  byte-identical to before.
- Key off: the headers of the original assembly (the tracker header tells the model to
  answer from it); the block is rebuilt each turn.
- Key on (``as_of`` given): the index and tracker headers are fixed texts dated
  "as of <date>" (the date the snapshot was taken), without "answer straight from this".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

#: One page line of the index: ``- [Title](file.md) — description`` (description optional).
PAGE_LINE = re.compile(r"^- \[(?P<title>[^\]]*)\]\((?P<file>[^)\s]+)\)(?P<rest>.*)$")


@dataclass(frozen=True)
class PageLine:
    """One page of the index, keyed by its file (``](file)`` in the line)."""

    file: str
    line: str

    @property
    def key(self) -> str:
        return f"]({self.file})"


@dataclass(frozen=True)
class TrackerLine:
    """The latest value of one tracker, keyed by its slug. ``date``: ``YYYY-MM-DD``;
    ``text``: the line as the memory service rendered it (then the other fields are not
    used)."""

    slug: str
    name: str = ""
    value: str = ""
    unit: str = ""
    date: str = ""
    text: str = ""

    def line(self) -> str:
        """``- weight: 81.2 kg (2026-11-30)`` — the tracker's one full line."""
        if self.text:
            return self.text
        unit = f" {self.unit}" if self.unit else ""
        when = f" ({self.date})" if self.date else ""
        label = (
            self.name if self.name == self.slug or not self.name else f"{self.name} [{self.slug}]"
        )
        return f"- {label}: {self.value}{unit}{when}"


@dataclass(frozen=True)
class BlockView:
    """What the memory service says about one project, in the chat service's terms.

    Attributes:
        project: the project id; ``name``: its display name.
        description: the project's description (free prose).
        index: the text of ``MEMORY.md`` (page lines and any prose around them).
        trackers: the latest value of each tracker, in a deterministic order.
        instructions: the project's instructions file (``AGENTS.md``), "" when none.
        workspace_agents: the ``AGENTS.md`` at the root of the project's workspace (code
            mode only; ``WorkspaceInfo.agents_md``), "" when none.
    """

    project: str
    name: str
    description: str = ""
    index: str = ""
    trackers: tuple[TrackerLine, ...] = field(default_factory=tuple)
    instructions: str = ""
    workspace_agents: str = ""

    def pages(self) -> dict[str, PageLine]:
        """The index's page lines by key (``](file)``), in index order."""
        out: dict[str, PageLine] = {}
        for raw in self.index.splitlines():
            m = PAGE_LINE.match(raw.strip())
            if m:
                page = PageLine(file=m.group("file"), line=raw.strip())
                out[page.key] = page
        return out

    def index_prose(self) -> str:
        """The index without its page lines (blank lines kept out): the prose around them."""
        return "\n".join(
            line.strip()
            for line in self.index.splitlines()
            if line.strip() and not PAGE_LINE.match(line.strip())
        )

    def is_empty(self) -> bool:
        return not (
            self.description.strip()
            or self.index.strip()
            or self.trackers
            or self.instructions.strip()
            or self.workspace_agents.strip()
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (persisted in :class:`~.snapshot.ProjSnap`; ``workspace_agents``
        only when set, so a snapshot taken outside code mode is stored as before)."""
        data = asdict(self)
        if not self.workspace_agents:
            del data["workspace_agents"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlockView:
        trackers = tuple(TrackerLine(**t) for t in data.get("trackers") or [])
        return cls(
            project=data.get("project", ""),
            name=data.get("name", ""),
            description=data.get("description", ""),
            index=data.get("index", ""),
            trackers=trackers,
            instructions=data.get("instructions", ""),
            workspace_agents=data.get("workspace_agents", ""),
        )


def index_header(as_of: str | None) -> str:
    """The index's header: dated with the key on."""
    return f"Memory index (as of {as_of}):" if as_of else "Memory index:"


def trackers_header(as_of: str | None) -> str:
    """The trackers' header: the original one (answer from it) off, dated with the key on."""
    if as_of:
        return f"Tracker values (as of {as_of}):"
    return "Latest tracker values (answer straight from this, no tool needed):"


INSTRUCTIONS_HEADER = "Project instructions (AGENTS.md):"
DESCRIPTION_HEADER = "Project description:"
WORKSPACE_AGENTS_HEADER = "Workspace instructions (AGENTS.md at the repository's root):"


def render(view: BlockView, as_of: str | None = None) -> str:
    """The block's text (``""`` for an empty project).

    Args:
        view: the project as the memory service gives it.
        as_of: the snapshot's date (key on); None with the key off.
    """
    if view.is_empty():
        return ""
    parts = [f'<project name="{view.name}">']
    if view.description.strip():
        parts.append(f"{DESCRIPTION_HEADER}\n{view.description.strip()}")
    if view.index.strip():
        parts.append(f"{index_header(as_of)}\n{view.index.strip()}")
    if view.trackers:
        lines = "\n".join(t.line() for t in view.trackers)
        parts.append(f"{trackers_header(as_of)}\n{lines}")
    if view.instructions.strip():
        parts.append(f"{INSTRUCTIONS_HEADER}\n{view.instructions.strip()}")
    if view.workspace_agents.strip():
        parts.append(f"{WORKSPACE_AGENTS_HEADER}\n{view.workspace_agents.strip()}")
    return "\n\n".join(parts) + "\n</project>"
