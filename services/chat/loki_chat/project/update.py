"""The ``<context_update from="loki">`` block: what changed in a project since the state
announced to a conversation (PROJ_SNAPSHOT, seeds).

Rules:

- Pages: one line per page that changed, keyed by its ``](file)``: ``+`` added, ``~``
  changed (the new line), ``-`` removed (the old line).
- Trackers: one FULL line per tracker whose line changed or that appeared (keyed by slug);
  a removed tracker gets ``- <slug>: (tracker removed)``.
- Prose is never diffed: the description, the instructions file, the workspace's
  ``AGENTS.md`` (code mode), or an index whose prose
  (the text around the page lines) changed are sent whole (the index then replaces the
  page lines too).
- Every section header says "as of <date>" (the update's date).
- Nothing changed: no block (None).
"""

from __future__ import annotations

from .block import INSTRUCTIONS_HEADER, WORKSPACE_AGENTS_HEADER, BlockView

OPEN = '<context_update from="loki">'
CLOSE = "</context_update>"


def _page_lines(old: BlockView, new: BlockView) -> list[str]:
    before, after = old.pages(), new.pages()
    out: list[str] = []
    for key, page in after.items():
        text = page.line[2:]  # without the list marker "- "
        if key not in before:
            out.append(f"+ {text}")
        elif before[key].line != page.line:
            out.append(f"~ {text}")
    for key, page in before.items():
        if key not in after:
            out.append(f"- {page.line[2:]}")
    return out


def _tracker_lines(old: BlockView, new: BlockView) -> list[str]:
    before = {t.slug: t.line() for t in old.trackers}
    after = {t.slug: t.line() for t in new.trackers}
    out = [line for slug, line in after.items() if before.get(slug) != line]
    out += [f"- {slug}: (tracker removed)" for slug in before if slug not in after]
    return out


def diff(old: BlockView, new: BlockView, as_of: str) -> str | None:
    """The update block from ``old`` (the state announced) to ``new`` (the live state), or
    None when nothing the model sees changed.

    Args:
        old, new: the two views of the same project (a name change is a retake, not an
            update: see :mod:`.snapshot`).
        as_of: the update's date, in every header.
    """
    sections: list[str] = []
    if old.description.strip() != new.description.strip():
        text = new.description.strip() or "(no description)"
        sections.append(f"Project description (as of {as_of}, full text):\n{text}")
    if old.index_prose() != new.index_prose():
        text = new.index.strip() or "(empty)"
        sections.append(f"Memory index (as of {as_of}, full text):\n{text}")
    else:
        pages = _page_lines(old, new)
        if pages:
            sections.append(f"Memory index changes (as of {as_of}):\n" + "\n".join(pages))
    trackers = _tracker_lines(old, new)
    if trackers:
        sections.append(f"Tracker values (as of {as_of}):\n" + "\n".join(trackers))
    if old.instructions.strip() != new.instructions.strip():
        text = new.instructions.strip() or "(removed)"
        header = INSTRUCTIONS_HEADER.rstrip(":")
        sections.append(f"{header} (as of {as_of}, full text):\n{text}")
    if old.workspace_agents.strip() != new.workspace_agents.strip():
        text = new.workspace_agents.strip() or "(removed)"
        header = WORKSPACE_AGENTS_HEADER.rstrip(":")
        sections.append(f"{header} (as of {as_of}, full text):\n{text}")
    if not sections:
        return None
    return "\n\n".join([OPEN, *sections, CLOSE])
