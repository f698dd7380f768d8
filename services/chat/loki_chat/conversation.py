"""A conversation's state: model view (Messages), display log (Log), seq, queue.

The whole state is persisted as ONE sealed blob (see :mod:`loki_chat.store`), so Messages,
Log and seq can never disagree after a crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loki_shared.messages.chat import ChatEvent, ChatMessage, ConversationKind
from loki_shared.messages.recall import DEFAULT_PROJECT

from .images import PendingItem
from .meter import ContextMeter
from .project.snapshot import ProjSnap

BLOB_VERSION = 1


@dataclass
class Conversation:
    """State of one conversation.

    Attributes:
        messages: the model view without the system message (OpenAI messages + ``loki``).
        log: the display log; ``log[i].seq`` increases by one; a reset empties the log but
            seq goes on.
        seq: the last seq given.
        pending: user messages waiting behind the running turn (FIFO), persisted so a
            crash does not lose them (text, or text and images: :mod:`loki_chat.images`).
        turn_open: a turn has started and not ended (set in the blob while it runs).
        kind: ``main`` (a person's conversation) or ``task`` (a scheduled task's run: its
            steps ask leases of kind ``task``, its perf records say ``task``); kept in the
            blob only when not ``main``.
        project: the project the conversation belongs to (the one active at creation).
        proj_snap: PROJ_SNAPSHOT's dated copy of the project block (None: none taken).
            Both are written to the blob only when set (omitempty).
    """

    id: str
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[ChatMessage] = field(default_factory=list)
    log: list[ChatEvent] = field(default_factory=list)
    seq: int = 0
    pending: list[PendingItem] = field(default_factory=list)
    turn_open: bool = False
    meter: ContextMeter = field(default_factory=ContextMeter)
    kind: ConversationKind = "main"
    project: str = DEFAULT_PROJECT
    proj_snap: ProjSnap | None = None

    def new_event(
        self,
        delta: dict[str, Any] | None = None,
        *,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        timings: dict[str, Any] | None = None,
        loki: dict[str, Any] | None = None,
    ) -> ChatEvent:
        """Append a display event with the next seq and return it (the same object that is
        published live)."""
        self.seq += 1
        event = ChatEvent(
            conversation=self.id,
            seq=self.seq,
            ts=time.time(),
            delta=delta or {},
            finish_reason=finish_reason,
            usage=usage,
            timings=timings,
            loki=loki,
        )
        self.log.append(event)
        return event

    def events_after(
        self, after_seq: int, limit: int | None = None
    ) -> tuple[list[ChatEvent], bool]:
        """Events with ``seq > after_seq`` (and whether ``limit`` cut the list)."""
        start = 0
        if self.log:
            first = self.log[0].seq
            start = min(len(self.log), max(0, after_seq - first + 1))
            while start > 0 and self.log[start - 1].seq > after_seq:
                start -= 1
            while start < len(self.log) and self.log[start].seq <= after_seq:
                start += 1
        events = self.log[start:]
        if limit is not None and len(events) > limit:
            return events[:limit], True
        return events, False

    def to_blob(self) -> dict[str, Any]:
        blob: dict[str, Any] = {
            "v": BLOB_VERSION,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "messages": [m.model_dump(exclude_none=True) for m in self.messages],
            "log": [e.model_dump(exclude_none=True) for e in self.log],
            "seq": self.seq,
            "pending": list(self.pending),
            "turn_open": self.turn_open,
            "meter": self.meter.to_dict(),
        }
        if self.kind != "main":
            blob["kind"] = self.kind
        if self.project != DEFAULT_PROJECT:
            blob["project"] = self.project
        if self.proj_snap is not None:
            blob["proj_snap"] = self.proj_snap.to_dict()
        return blob

    @classmethod
    def from_blob(cls, data: dict[str, Any]) -> Conversation:
        return cls(
            id=data["id"],
            title=data.get("title", ""),
            created=data.get("created", 0.0),
            updated=data.get("updated", 0.0),
            messages=[ChatMessage.model_validate(m) for m in data.get("messages", [])],
            log=[ChatEvent.model_validate(e) for e in data.get("log", [])],
            seq=data.get("seq", 0),
            pending=list(data.get("pending", [])),
            turn_open=bool(data.get("turn_open", False)),
            meter=ContextMeter.from_dict(data.get("meter")),
            kind="task" if data.get("kind") == "task" else "main",
            project=data.get("project") or DEFAULT_PROJECT,
            proj_snap=ProjSnap.from_dict(data["proj_snap"]) if data.get("proj_snap") else None,
        )

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "project": self.project,
            "kind": self.kind,
        }
