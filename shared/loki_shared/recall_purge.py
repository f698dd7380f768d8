"""The durable record of a deletion the recall service must apply (shared by its writers).

Deleting a conversation (or a project) deletes the blocks it archived. The deleter records
the deletion in Redis *in the same atomic write* that deletes the conversation itself, so
nothing is left behind even when the recall service is down at that moment:

- ``loki:recall:purge`` — a set of pending deletions, members :func:`member` (``c:<id>`` for a
  conversation, ``p:<id>`` for a project). The recall service applies each (at start, before
  each search or listing, every few seconds, and at once on ``loki.recall.purge``) and then
  removes it;
- ``loki:recall:gone`` — the same members, kept: an archive for a deleted conversation or
  project (a compaction that was in flight) is refused, never stored.

Only member names (conversation and project ids) are written here, never content.
"""

from __future__ import annotations

PURGE_KEY = "loki:recall:purge"
GONE_KEY = "loki:recall:gone"


def member(conversation: str | None = None, project: str | None = None) -> str:
    """The set member naming a conversation (``c:<id>``) or a project (``p:<id>``).

    Raises:
        ValueError: neither or both are given.
    """
    if (conversation is None) == (project is None):
        raise ValueError("name exactly one of conversation, project")
    return f"c:{conversation}" if conversation is not None else f"p:{project}"
