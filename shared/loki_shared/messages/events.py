"""Audit events kept in the ``LOKI_EVENTS`` JetStream stream (``loki.events.*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Msg


class CompactionEvent(Msg):
    """``loki.events.compaction``: one compaction. Tokens are engine tokens; ``duration_s``
    seconds; ``path`` names what was done (``summary``, ``continuation``, ``fallback``,
    ``shrink``, ``refused``)."""

    conversation: str
    ts: float
    trigger: Literal["start", "mid", "end", "manual", "reactive"]
    tokens_before: int
    tokens_after: int
    archived: list[str] = Field(default_factory=list)
    path: str
    duration_s: float


class ArchiveEvent(Msg):
    """``loki.events.archive``: a block was archived (no content)."""

    id: str
    seq: int
    conversation: str | None = None
    ts: float
