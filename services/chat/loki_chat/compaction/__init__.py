"""Compaction: the chat service's default :class:`~loki_chat.context.ContextPolicy`.

- :mod:`.policy` — :class:`CompactionPolicy`: puts the parts below together;
- :mod:`.decide` — when to compact, where to cut, which summary path fits (pure);
- :mod:`.rules` — tail selection, big parts, stripping, summary cleaning, budget (pure);
- :mod:`.summariser` — the summariser prompt and the transcript / continuation requests;
- :mod:`.layout` — COMPACT_TAIL_REUSE: the order a compacted view is sent in (tail first);
- :mod:`.state` — what the policy remembers per conversation (in memory);
- :mod:`.slot_watch` — whether a slot still holds a conversation's last request;
- :mod:`.archive` — big blocks archived verbatim through the recall service;
- :mod:`.summary_client` — the summary request to the engine (lease, POST, answer);
- :mod:`.summary_path` — which path asks for the summary: continuation, else transcript;
- :mod:`.fallback` — what takes a failed summary's place (index, stripped torso, or drop);
- :mod:`.failures` — the fingerprints of failed summaries (never asked twice);
- :mod:`.health` — per model, until restart: continuation suspended, summaries failing;
- :mod:`.shrink` — archive-then-drop: the last resort, and the path after failed summaries;
- :mod:`.events` — the marker, audit event and log line of each compaction.

See docs/behaviour.md (compaction) for every rule and the test that shows it.
"""

from .policy import CompactionDeps, CompactionPolicy

__all__ = ["CompactionDeps", "CompactionPolicy"]
