"""How summaries have been going on each model: compaction's per-model back-off bookkeeping.

One concept: what the compaction policy remembers per model (not per conversation: that is
:mod:`.state`), in memory only, per chat instance — a restart forgets it. The rules it holds:

- the continuation path (``COMPACT_CONTINUATION``): a failed request that reached the engine
  counts (one found before sending, :data:`~.summary_client.NOT_SENT`, never does); the path
  is suspended for the model until restart at the :data:`SUSPEND_AFTER`-th counted failure,
  or at once when the outcome asks (a template error, a tool call); a continuation that
  passes clears the model's count;
- summaries on either path: :data:`FAILING_AFTER` failures in a row on one model are logged
  once (until restart), and from then on the compaction marker carries :data:`FAILING_NOTE`;
  a summary that passes resets the count.

Not the service's health (``loki.health.chat``): nothing here is published.
"""

from __future__ import annotations

import logging

from .summary_client import NOT_SENT, SummaryOutcome

log = logging.getLogger("loki.chat.compaction")

#: Failed summaries in a row after which a model is said to fail them (logged once).
FAILING_AFTER = 2
#: The compaction marker's note once summaries fail on the model.
FAILING_NOTE = "summaries fail on this model: older turns were archived and dropped instead"
#: Counted continuation failures after which the path is suspended for the model.
SUSPEND_AFTER = 2


class SummaryHealth:
    """The per-model counts of one chat instance's compaction policy (empty at start).

    Attributes:
        suspended: models whose continuation path is suspended until restart.
        failures: counted continuation failures per model (requests that reached the engine).
        summary_failures: failed summaries in a row per model, either path (reset by a
            summary that passes).
        failing_logged: models whose failing summaries were logged (once until restart).
    """

    def __init__(self) -> None:
        self.suspended: set[str] = set()
        self.failures: dict[str, int] = {}
        self.summary_failures: dict[str, int] = {}
        self.failing_logged: set[str] = set()

    # -- the continuation path --------------------------------------------------------------
    def continuation_passed(self, model: str) -> None:
        """A continuation on ``model`` gave a summary: its failure count is cleared."""
        self.failures.pop(model, None)

    def continuation_failed(self, model: str, outcome: SummaryOutcome) -> None:
        """A failed continuation on ``model``: counted when the request reached the engine
        (``outcome.failure`` not in :data:`~.summary_client.NOT_SENT`); the path is suspended
        for ``model`` at the :data:`SUSPEND_AFTER`-th, or at once when ``outcome.suspend``
        (logged each time)."""
        if outcome.failure not in NOT_SENT:
            self.failures[model] = self.failures.get(model, 0) + 1
        if outcome.suspend or self.failures.get(model, 0) >= SUSPEND_AFTER:
            self.suspended.add(model)
            log.warning(
                "[compact] continuation suspended for %s until restart (%s)",
                model,
                outcome.failure,
            )

    # -- summaries, either path -------------------------------------------------------------
    def summary_passed(self, model: str | None) -> None:
        """A summary by ``model`` passed: its failures in a row start again from 0 (None:
        no model known, nothing to reset)."""
        if model:
            self.summary_failures.pop(model, None)

    def summary_failed(self, model: str | None) -> str | None:
        """One more failed summary in a row for ``model``; at the :data:`FAILING_AFTER`-th,
        logged once per model (until restart). Returns the marker's note (:meth:`note`);
        None, and nothing counted, when ``model`` is None (no request left)."""
        if not model:
            return None
        n = self.summary_failures.get(model, 0) + 1
        self.summary_failures[model] = n
        if n >= FAILING_AFTER and model not in self.failing_logged:
            self.failing_logged.add(model)
            log.warning(
                "[compact] summaries fail on %s (%d in a row): older turns are archived and "
                "dropped instead",
                model,
                n,
            )
        return self.note(model)

    def note(self, model: str | None) -> str | None:
        """The marker's note: :data:`FAILING_NOTE` when ``model`` failed
        :data:`FAILING_AFTER` summaries in a row, else None."""
        if model and self.summary_failures.get(model, 0) >= FAILING_AFTER:
            return FAILING_NOTE
        return None
