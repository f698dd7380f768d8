"""The pool's slot book (issue 44): what each pooled slot ``(engine, id_slot)`` last ran.

Pure bookkeeping, no I/O; the pool's lease manager records every grant here and builds the
router's :class:`~loki_supervisor.affinity.SlotState` from it; the replicas mirror
:meth:`SlotBook.snapshot` in Redis.

- A main-like grant (``kind`` in :data:`~loki_supervisor.affinity.MAIN_KINDS`, or a
  ``compact`` with ``continuation``) sets the slot's conversation and fingerprints.
- A side grant replaces the slot's content: the entry becomes ``conversation=None``,
  ``side=True`` (its fingerprints are the side job's prompt's: what the slot's cache holds).
- Every grant clears ``saved`` (the slot now holds a prompt no file has);
  :meth:`SlotBook.mark_saved` sets it when the save was of the prompt the slot still holds.
- :meth:`SlotBook.last_engine` remembers, per conversation, the engine whose slot last ran its
  main prompt (at most :data:`MAX_CONVERSATIONS`, least recently granted dropped first); it
  survives :meth:`SlotBook.forget_engine`, so a conversation of a gone engine is seen as a
  failover.

Table tests: ``tests/engine/test_slot_book.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .affinity import MAIN_KINDS, SlotState

#: How many conversations :meth:`SlotBook.last_engine` remembers (LRU).
MAX_CONVERSATIONS = 10_000
#: :meth:`SlotBook.snapshot`'s format version.
SNAPSHOT_VERSION = 1


@dataclass
class SlotEntry:
    """What one slot last ran: ``conversation`` (None: a side job's or no conversation's
    prompt), ``fingerprints`` (that prompt's cumulative fingerprints), ``last_used``
    (monotonic time of the grant, s), ``side`` (the grant was a side job), ``saved`` (a slot
    file holds exactly this prompt)."""

    conversation: str | None
    fingerprints: tuple[str, ...]
    last_used: float
    side: bool
    saved: bool = False


def is_main_like(kind: str, continuation: bool = False) -> bool:
    """A grant that runs a conversation's main prompt (``main``, ``prewarm``, a continuation
    ``compact``)."""
    return kind in MAIN_KINDS or (kind == "compact" and continuation)


class SlotBook:
    """What each ``(engine, id_slot)`` last ran, and each conversation's last engine."""

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS) -> None:
        self._slots: dict[tuple[str, int], SlotEntry] = {}
        self._last: OrderedDict[str, str] = OrderedDict()
        self._max = max(1, max_conversations)

    def granted(
        self,
        engine: str,
        id_slot: int,
        *,
        kind: str,
        conversation: str | None,
        fingerprints: Sequence[str],
        now: float,
        continuation: bool = False,
    ) -> SlotEntry | None:
        """Record a grant of ``kind`` on ``(engine, id_slot)`` at ``now`` (monotonic s).

        Returns the entry it replaced (the slot's previous occupant), None when the slot
        had none recorded.
        """
        previous = self._slots.get((engine, id_slot))
        if is_main_like(kind, continuation):
            entry = SlotEntry(conversation, tuple(fingerprints), now, side=False)
            if conversation is not None:
                self._remember(conversation, engine)
        else:
            entry = SlotEntry(None, tuple(fingerprints), now, side=True)
        self._slots[(engine, id_slot)] = entry
        return previous

    def _remember(self, conversation: str, engine: str) -> None:
        self._last[conversation] = engine
        self._last.move_to_end(conversation)
        while len(self._last) > self._max:
            self._last.popitem(last=False)

    def entry(self, engine: str, id_slot: int) -> SlotEntry | None:
        """The slot's entry (None: nothing recorded: empty, or its engine was forgotten)."""
        return self._slots.get((engine, id_slot))

    def mark_saved(self, engine: str, id_slot: int, fingerprint: str) -> None:
        """A slot file now holds the slot's prompt whose last fingerprint is ``fingerprint``;
        ignored when the slot holds another prompt by now (or nothing)."""
        entry = self._slots.get((engine, id_slot))
        if entry is not None and entry.fingerprints and entry.fingerprints[-1] == fingerprint:
            entry.saved = True

    def last_engine(self, conversation: str) -> str | None:
        """The engine whose slot last ran ``conversation``'s main prompt (None: unknown)."""
        return self._last.get(conversation)

    def forget_engine(self, engine: str, keep_slot: int | None = None) -> None:
        """``engine`` is gone (or restarted): its slots' contents are lost (``last_engine``
        keeps naming it, so the conversation's next grant elsewhere is a failover); the
        entry of ``keep_slot`` stays (a grant just recorded there)."""
        for key in [k for k in self._slots if k[0] == engine and k[1] != keep_slot]:
            del self._slots[key]

    def slot_state(
        self, engine: str, id_slot: int, *, busy: bool = False, waiting: int = 0
    ) -> SlotState:
        """The router's view of ``(engine, id_slot)``: its entry plus the caller's ``busy``
        (a lease holds it) and ``waiting`` (requests queued for it ahead of the asker)."""
        entry = self._slots.get((engine, id_slot))
        if entry is None:
            return SlotState(engine, id_slot, busy, waiting, None, (), 0.0)
        return SlotState(
            engine,
            id_slot,
            busy,
            waiting,
            entry.conversation,
            entry.fingerprints,
            entry.last_used,
            entry.side,
        )

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The book as JSON-able data (no prompt text: ids and fingerprints only).

        ``now``: this process's monotonic clock when taken; :meth:`restore` with its own
        ``now`` shifts every ``last_used`` by the difference (another process's monotonic
        clock is not this one's).
        """
        return {
            "version": SNAPSHOT_VERSION,
            "now": now,
            "slots": [
                {
                    "engine": engine,
                    "id_slot": id_slot,
                    "conversation": e.conversation,
                    "fingerprints": list(e.fingerprints),
                    "last_used": e.last_used,
                    "side": e.side,
                    "saved": e.saved,
                }
                for (engine, id_slot), e in self._slots.items()
            ],
            "last_engine": [[c, engine] for c, engine in self._last.items()],
        }

    @classmethod
    def restore(
        cls,
        data: dict[str, Any],
        now: float | None = None,
        max_conversations: int = MAX_CONVERSATIONS,
    ) -> SlotBook:
        """A book from :meth:`snapshot`'s data. ``now``: this process's monotonic clock
        (with the snapshot's ``now``, ``last_used`` values are moved onto this clock; a
        ``last_used`` of 0, "never", stays 0).

        Raises:
            ValueError: ``data`` is not a snapshot of this version, or malformed.
        """
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
            raise ValueError("not a slot book snapshot of version 1")
        then = data.get("now")
        shift = 0.0
        if isinstance(then, int | float) and now is not None:
            shift = now - float(then)
        book = cls(max_conversations)
        try:
            for row in data.get("slots", []):
                conversation = row["conversation"]
                if conversation is not None and not isinstance(conversation, str):
                    raise TypeError("conversation")
                last_used = float(row["last_used"])
                book._slots[(str(row["engine"]), int(row["id_slot"]))] = SlotEntry(
                    conversation,
                    tuple(str(f) for f in row["fingerprints"]),
                    last_used + shift if last_used else 0.0,
                    bool(row["side"]),
                    bool(row.get("saved", False)),
                )
            for conversation, engine in data.get("last_engine", []):
                book._remember(str(conversation), str(engine))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed slot book snapshot: {exc}") from exc
        return book
