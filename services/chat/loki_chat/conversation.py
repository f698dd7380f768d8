"""A conversation's state: model view (Messages), display log (Log), seq, queue.

The state is persisted by :mod:`loki_chat.store` in one atomic, fenced write per persist: a
small head (seq, queue, meter, title...), the model view's messages and the display log's new
events, so Messages, Log and seq can never disagree after a crash. What each write must carry
(only what changed since the last one) is tracked in :class:`Persisted`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loki_shared.chat_log import coalesce, history_page
from loki_shared.messages.chat import ChatEvent, ChatMessage, ConversationKind
from loki_shared.messages.code import CodeState
from loki_shared.messages.recall import DEFAULT_PROJECT

from .code.rules import is_default
from .images import PendingItem
from .meter import ContextMeter
from .project.snapshot import ProjSnap

#: 1: one blob with everything (read, migrated on the first owned load); 2: the head of
#: :meth:`Conversation.to_head`, with the messages and the log in their own Redis lists.
BLOB_VERSION = 2


@dataclass
class Persisted:
    """What the store last wrote of one conversation (runtime state, never stored itself).

    Attributes:
        messages: the JSON text of each stored model-view message, in order (a persist
            writes from the first message whose JSON differs).
        chunks: ``(first seq, last seq)`` of each stored chunk of the display log, in order.
        rewrite_from: None, or the seq from which the stored log must be rewritten (a log
            compaction merged events there, or a reset emptied it: 0).
        legacy: read from a version-1 blob; the next persist writes the whole conversation in
            the current layout (the owner persists it at once: :meth:`Ownership.take`).
        partial: read for a reply only, without the log's older chunks
            (:meth:`loki_chat.store.Store.load`'s ``log_after``): never saved.
    """

    messages: list[str] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)
    rewrite_from: int | None = None
    legacy: bool = False
    partial: bool = False

    @property
    def last_seq(self) -> int:
        """The last seq of the stored log (0: nothing stored)."""
        return self.chunks[-1][1] if self.chunks else 0


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
        code: the conversation's code mode and acceptance criteria (issue 43); written to
            the blob only when not the default (chat mode, no criteria).
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
    code: CodeState = field(default_factory=CodeState)
    #: the last seq of the display log that :meth:`compact_log` has merged (stored in the head)
    log_compacted: int = 0
    persisted: Persisted = field(default_factory=Persisted, compare=False, repr=False)

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

    def history_page(self, turns: int, before: int | None = None) -> tuple[list[ChatEvent], bool]:
        """The last ``turns`` turns before seq ``before`` and whether older events exist
        (:func:`loki_shared.chat_log.history_page`)."""
        return history_page(self.log, turns, before)

    def clear_log(self) -> None:
        """Empty the display log (a reset: seq goes on); the stored log is rewritten."""
        self.log.clear()
        self.log_compacted = self.seq
        self.persisted.rewrite_from = 0

    def compact_log(self) -> int:
        """Merge the display events logged since the last compaction
        (:func:`loki_shared.chat_log.coalesce`) and mark the stored log for a rewrite from
        the first of them. Called when a turn starts, for the turns before it: a client that
        was streaming them has had them all; one resuming inside a merged run is told by the
        merged event's ``merged_from`` (docs/behaviour.md, "Long conversations").

        Returns:
            How many events the merge removed (0: nothing to merge, nothing marked).
        """
        start = len(self.log)
        while start > 0 and self.log[start - 1].seq > self.log_compacted:
            start -= 1
        fresh = self.log[start:]
        self.log_compacted = self.seq
        if len(fresh) < 2:
            return 0
        merged = coalesce(fresh)
        removed = len(fresh) - len(merged)
        if removed:
            self.log[start:] = merged
            first = fresh[0].seq
            pending = self.persisted.rewrite_from
            self.persisted.rewrite_from = first if pending is None else min(pending, first)
        return removed

    def to_head(self) -> dict[str, Any]:
        """The stored head: everything but the messages and the display log (their own
        lists, :mod:`loki_chat.store`)."""
        head: dict[str, Any] = {
            "v": BLOB_VERSION,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "seq": self.seq,
            "pending": list(self.pending),
            "turn_open": self.turn_open,
            "meter": self.meter.to_dict(),
            "log_compacted": self.log_compacted,
        }
        if self.kind != "main":
            head["kind"] = self.kind
        if self.project != DEFAULT_PROJECT:
            head["project"] = self.project
        if self.proj_snap is not None:
            head["proj_snap"] = self.proj_snap.to_dict()
        if not is_default(self.code):
            head["code"] = self.code.model_dump()
        return head

    def to_blob(self) -> dict[str, Any]:
        """The whole state as one JSON object (the head with ``messages`` and ``log``), the
        shape of a version-1 blob: exports and tests read it."""
        blob = self.to_head()
        blob["messages"] = [m.model_dump(exclude_none=True) for m in self.messages]
        blob["log"] = [e.model_dump(exclude_none=True) for e in self.log]
        return blob

    @classmethod
    def from_blob(cls, data: dict[str, Any]) -> Conversation:
        """A conversation from a head (``messages`` and ``log`` absent: empty) or from a
        version-1 blob that holds them."""
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
            log_compacted=int(data.get("log_compacted", 0)),
            code=CodeState.model_validate(data["code"]) if data.get("code") else CodeState(),
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
