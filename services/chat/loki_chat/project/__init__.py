"""The project block at the head of the first user message, and PROJ_SNAPSHOT.

- :mod:`.block` — :class:`BlockView` (what the memory service says about a project) and
  :func:`render` (the block's text; key off: rebuilt each turn; key on: dated, kept);
- :mod:`.update` — :func:`diff`: the ``<context_update from="loki">`` block between two views;
- :mod:`.snapshot` — :class:`ProjSnap` (the dated copy kept per conversation), the retake
  conditions and the removal of update blocks from the history;
- :mod:`.head` — :class:`ProjectHead`: what a turn asks (the head text, the update to store).

Source of the rules: the seeds (commit "PROJ_SNAPSHOT"), issue 18; docs/behaviour.md (projects).
"""

from __future__ import annotations

from .block import BlockView, PageLine, TrackerLine, render
from .snapshot import UPDATE_KIND, ProjSnap, is_update, strip_updates, without_updates
from .update import diff

__all__ = [
    "UPDATE_KIND",
    "BlockView",
    "PageLine",
    "ProjSnap",
    "TrackerLine",
    "diff",
    "is_update",
    "render",
    "strip_updates",
    "without_updates",
]
