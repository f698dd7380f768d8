"""The display log's merge rule, one for the whole product.

A conversation's display log holds one event per streamed delta (a 300-token reply is about
300 events). Two places merge runs of them:

- the gateway's replay coalesces a long replay before sending it to a browser;
- the chat service compacts a finished turn's stored events (``loki_chat.log_compaction``),
  so a conversation kept for months does not store and load every delta it ever streamed.

Paging (:func:`history_page`): a long conversation is opened on its last turns and read back
a page of turns at a time (the chat service's replay with ``turns``).

The merge rule (:func:`coalesce`): consecutive plain text deltas of the same key (``content`` with
``content``, ``reasoning_content`` with ``reasoning_content``; nothing else in the delta, no
``finish_reason``, ``usage``, ``timings`` or ``loki`` mark) become one event. A text delta may
also be merged into a preceding event that carries the same key plus ``role`` (a message's
first delta). The merged event keeps the ``seq`` of the LAST event it absorbed, so resuming
after its id resumes after every event it stands for; its ``ts`` is when its text began (the
first absorbed event with text: the time to first token stays readable from a compacted log);
``merged_from`` = the seq of the FIRST: a client whose last seen seq lies in
``[merged_from, seq)`` has seen part of the merged text and must reload the conversation
instead of appending it (the rule of
docs/behaviour.md, "Long conversations"). Seqs are never reused: the seqs a merged event
absorbed simply no longer appear.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .messages.chat import ChatEvent

TEXT_KEYS = ("content", "reasoning_content")


def text_key(event: ChatEvent) -> str | None:
    """The text key of a plain text delta (``content`` or ``reasoning_content``, alone, with
    no finish_reason, usage, timings or mark), else None."""
    if event.finish_reason or event.usage or event.timings or event.loki:
        return None
    keys = set(event.delta)
    for key in TEXT_KEYS:
        if keys == {key} and isinstance(event.delta[key], str):
            return key
    return None


def coalesce(events: list[ChatEvent]) -> list[ChatEvent]:
    """``events`` with every mergeable run merged into one event (see the module docstring).

    Args:
        events: display events in seq order.

    Returns:
        A new list; the events given are never modified (merged events are copies).
    """
    out: list[ChatEvent] = []
    for event in events:
        key = text_key(event)
        if key and out:
            prev = out[-1]
            prev_keys = set(prev.delta)
            mergeable = (
                not (prev.finish_reason or prev.usage or prev.timings or prev.loki)
                and key in prev_keys
                and isinstance(prev.delta[key], str)
                and prev_keys <= {key, "role"}
            )
            if mergeable:
                delta = dict(prev.delta)
                began = prev.ts if delta[key] else event.ts  # the text began with its first piece
                delta[key] = delta[key] + event.delta[key]
                first = prev.merged_from if prev.merged_from is not None else prev.seq
                out[-1] = prev.model_copy(
                    update={"delta": delta, "seq": event.seq, "ts": began, "merged_from": first}
                )
                continue
        out.append(event)
    return out


def history_page(
    log: Sequence[ChatEvent], turns: int, before: int | None = None
) -> tuple[list[ChatEvent], bool]:
    """The events of the last ``turns`` turns logged before seq ``before`` (None: the end of
    the log), from the ``turns``-th last user message on (``loki.event == "user"``, a turn's
    first event), so a page never starts inside a turn; and whether older events exist.

    Args:
        log: display events in seq order.
        turns: how many turns (user messages) the page holds, at least 1.
        before: only events with a smaller seq.
    """
    end = len(log) if before is None else bisect.bisect_left(log, before, key=lambda e: e.seq)
    start, seen = end, 0
    while start > 0 and seen < turns:
        start -= 1
        if (log[start].loki or {}).get("event") == "user":
            seen += 1
    return list(log[start:end]), start > 0
