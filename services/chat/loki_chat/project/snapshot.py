"""PROJ_SNAPSHOT's state per conversation (:class:`ProjSnap`) and its retake rules.

Rules (seeds, commit "PROJ_SNAPSHOT"; issue 18):

- Each conversation keeps a dated copy of the block (``text``), sent byte for byte at the
  head of the first user message, and the state announced to it since (``announced``: the
  snapshot plus the updates stored). The snapshot is taken on an explicit mark (``taken``):
  an empty project is a snapshot too, so its first page arrives as an update and the first
  message does not move.
- Update blocks are user messages marked ``loki.injected = "context_update"`` stored just
  before the user's message (the request joins them at the head of it).
- Retake (update blocks removed from the WHOLE history, a fresh dated copy) when the prompt
  changes anyway: a compaction (turn start, end, manual, mid-turn: the live block taken as
  the snapshot at once), the system prompt or the tools changed, the engine or the model
  changed, the project switched or renamed, a restart of the chat service; and past
  ``LOKI_PROJ_SNAPSHOT_MAX_UPDATES`` update blocks accumulated.
- Reset and key removed: the snapshot is dropped and the update blocks removed.
- Update blocks are left out of the title, the export and the summariser's input
  (:func:`without_updates`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from loki_shared.messages.chat import ChatMessage

from .block import BlockView

#: ``loki.injected`` of a stored update block.
UPDATE_KIND = "context_update"


def is_update(message: ChatMessage) -> bool:
    """A stored ``<context_update>`` block (recognised by ``loki.injected``)."""
    return bool(message.loki and message.loki.injected == UPDATE_KIND)


def without_updates(messages: list[ChatMessage]) -> list[ChatMessage]:
    """``messages`` without the update blocks (title, export, summariser input)."""
    return [m for m in messages if not is_update(m)]


def strip_updates(messages: list[ChatMessage]) -> int:
    """Remove every update block from ``messages`` in place; returns how many went."""
    kept = without_updates(messages)
    removed = len(messages) - len(kept)
    messages[:] = kept
    return removed


def prompt_fingerprint(system_prompt: str, tools: list[dict[str, Any]] | None) -> str:
    """A short hash of the system prompt and the tool schemas offered (a change = retake)."""
    raw = json.dumps([system_prompt, tools or []], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass
class ProjSnap:
    """The dated copy of a conversation's project block.

    Attributes:
        as_of: the date the copy was taken (in its headers).
        text: the block's text as sent (``""`` for an empty project).
        announced: the state the model was told (snapshot + stored updates), for the next diff.
        project, name: the project it was taken for.
        prompt: :func:`prompt_fingerprint` of the request it was taken with.
        model: the model (and engine) it was taken with.
        boot: the chat service's start token (another token: a restart).
    """

    as_of: str
    text: str
    announced: BlockView
    project: str
    name: str
    prompt: str = ""
    model: str = ""
    boot: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "as_of": self.as_of,
            "text": self.text,
            "announced": self.announced.to_dict(),
            "project": self.project,
            "name": self.name,
            "prompt": self.prompt,
            "model": self.model,
            "boot": self.boot,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProjSnap:
        return cls(
            as_of=data.get("as_of", ""),
            text=data.get("text", ""),
            announced=BlockView.from_dict(data.get("announced") or {}),
            project=data.get("project", ""),
            name=data.get("name", ""),
            prompt=data.get("prompt", ""),
            model=data.get("model", ""),
            boot=data.get("boot", ""),
        )


def retake_reason(
    snap: ProjSnap | None,
    *,
    live: BlockView | None,
    prompt: str,
    model: str,
    boot: str,
    updates: int,
    max_updates: int,
) -> str | None:
    """Why the snapshot must be retaken before this request (None: keep it).

    Args:
        snap: the conversation's snapshot (None: never taken -> ``"first"``).
        live: the project now (None: the memory service did not answer; the project
            identity is then not checked).
        prompt: :func:`prompt_fingerprint` of this request; ``model``: this lease's model.
        boot: this service's start token; ``updates``: update blocks in the history.
        max_updates: the threshold of accumulated updates.
    """
    if snap is None:
        return "first"
    if live is not None and live.project != snap.project:
        return "project"
    if live is not None and live.name != snap.name:
        return "name"
    if snap.prompt and prompt != snap.prompt:
        return "prompt"
    if snap.model and model and model != snap.model:
        return "model"
    if snap.boot != boot:
        return "restart"
    if updates > max_updates:
        return "updates"
    return None
