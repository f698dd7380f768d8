"""What each compaction leaves behind: a display marker, an audit event, a log line.

- the marker: a display event ``{"event": "compaction", "trigger", "path", "tokens_before",
  "tokens_after", "archived"[, "summary"][, "failure"][, "note"]}`` in the conversation's
  Log (``note``: a sentence for the user, e.g. that summaries fail on this model);
- the audit event: a :class:`~loki_shared.messages.events.CompactionEvent` on
  ``loki.events.compaction``, stored in the JetStream stream ``LOKI_EVENTS`` (created when
  missing; best effort: a failure is logged, never raised). A refusal (path ``refused``)
  gets the event only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from loki_shared import subjects
from loki_shared.messages.events import CompactionEvent
from loki_shared.nats import events_stream, publish_durable

from ..bus import ChatBus
from ..context import ContextView

log = logging.getLogger("loki.chat.compaction")


def _events_config() -> Any:
    return dataclasses.replace(
        events_stream().config, subjects=[subjects.EVENTS_COMPACTION, subjects.EVENTS_ARCHIVE]
    )


class CompactionEvents:
    """Publishes the compaction events of one chat instance.

    Args:
        bus: the NATS bus (the events go to JetStream through its connection).
    """

    def __init__(self, bus: ChatBus) -> None:
        self.bus = bus
        self._stream_ready: set[int] = set()  # JetStream contexts whose stream was declared

    async def mark(
        self,
        view: ContextView,
        path: str,
        before: int,
        after: int,
        archived: list[str],
        t0: float,
        summary: str | None = None,
        failure: str | None = None,
        note: str | None = None,
    ) -> None:
        """The display marker, the audit event and the log line of one compaction of
        ``view.conversation`` by ``path`` (``summary``, ``continuation``, ``fallback``,
        ``shrink``) from ``before`` to ``after`` tokens, begun at ``t0`` (monotonic);
        ``failure``: why the summary failed; ``note``: a sentence the UI shows with it."""
        meta: dict[str, Any] = {
            "event": "compaction",
            "trigger": view.trigger,
            "path": path,
            "tokens_before": before,
            "tokens_after": after,
            "archived": archived,
        }
        if summary is not None:
            meta["summary"] = summary
        if failure is not None:
            meta["failure"] = failure
        if note is not None:
            meta["note"] = note
        if view.emit is not None:
            try:
                await view.emit({}, meta)
            except Exception:  # the marker is display only: no emitter failure fails a compaction
                log.warning("[compact] marker not emitted", exc_info=True)
        await self.audit(view, path, before, after, archived, t0)
        log.info(
            "[compact] %s: %s via %s, %d -> %d tokens, archived %s",
            view.conversation.id,
            view.trigger,
            path,
            before,
            after,
            archived,
        )

    async def audit(
        self, view: ContextView, path: str, before: int, after: int, archived: list[str], t0: float
    ) -> None:
        """Publish the audit event of one compaction (or refusal) of ``view.conversation``."""
        event = CompactionEvent(
            conversation=view.conversation.id,
            ts=time.time(),
            trigger=view.trigger,
            tokens_before=before,
            tokens_after=after,
            archived=archived,
            path=path,
            duration_s=time.monotonic() - t0,
        )
        await self.publish(event)

    async def publish(self, event: CompactionEvent) -> bool:
        """Publish ``event`` on ``loki.events.compaction`` into the ``LOKI_EVENTS`` stream
        (created when missing; :func:`loki_shared.nats.publish_durable`). Best effort: False
        when it could not be stored (logged, also when the stream is still missing after
        its creation); False without a word when the bus is not connected."""
        import nats.errors
        from faststream.exceptions import IncorrectState

        try:
            js = self.bus.jetstream()
        except (IncorrectState, TypeError):  # not connected, or no broker: nothing to publish
            return False
        if id(js) not in self._stream_ready:
            # created when missing (idempotent); a core subscriber on the subject would
            # otherwise turn a missing stream into a timeout instead of a "no stream" answer
            try:
                await js.add_stream(config=_events_config())
            except (nats.errors.Error, OSError, ValueError):
                pass  # exists with another configuration, or NATS away: publish anyway
            self._stream_ready.add(id(js))
        return await publish_durable(
            js,
            subjects.EVENTS_COMPACTION,
            event.model_dump_json().encode(),
            _events_config(),
            what="compaction event",
            log=log,
        )
