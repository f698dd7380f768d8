"""Compaction: the chat service's default :class:`~loki_chat.context.ContextPolicy`.

- :mod:`.rules` — tail selection, big parts, summary cleaning, budget (pure);
- :mod:`.summariser` — the summariser prompt and the transcript / continuation requests;
- :mod:`.policy` — when to compact, archive-then-summarise, fallbacks, shrink, events.

See docs/behaviour.md (compaction) for every rule and the test that shows it.
"""

from .policy import CompactionPolicy

__all__ = ["CompactionPolicy"]
