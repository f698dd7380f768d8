"""The summary of a compaction's torso: which path asks for it, and asking.

One concept: the summary request a compaction makes once its cut is planned and its big
blocks archived. The rules it holds:

- the continuation path (``COMPACT_CONTINUATION``) is tried first when
  :func:`~.decide.continuation_allowed` says so: the key is on, the trigger is turn start,
  mid-turn or turn end, :mod:`.slot_watch` says the slot still holds this conversation's last
  request (a stamp of the current epoch), the model is not suspended (:mod:`.health`), the
  window did not change and the request fits the budget;
- any failure of it (refusal, network error, tool call, reasoning only, empty or degenerate
  summary, view mismatch) is counted in :mod:`.health` and the transcript path follows in
  the same compaction; ``timings.prompt_n`` of every continuation answered is kept
  (:attr:`SummaryPath.continuation_prompt_n`: figures, tests);
- the transcript path renders the torso (:func:`~.summariser.render_transcript`, big parts
  as excerpt and recall id) once the lease says whether the model may cite ids.

The summary budget is :func:`~.rules.budget_tokens` of the window. What follows a failed
summary is :mod:`.fallback`'s; the requests themselves are :mod:`.summary_client`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..context import ContextView
from ..settings import Settings
from . import decide as D
from . import summariser as S
from .archive import BlockIds
from .health import SummaryHealth
from .rules import budget_tokens
from .slot_watch import SlotWatch
from .state import ConvState
from .summary_client import SummaryClient, SummaryOutcome

log = logging.getLogger("loki.chat.compaction")


@dataclass(eq=False)
class SummaryPath:
    """Asks for a compaction's summary, by the continuation path when it may, else by the
    transcript path.

    Attributes:
        settings: ``compact_continuation``.
        summaries: the summary request client (leases, POST, answer).
        slots: the slot watch (its ``epoch`` dates the conversation's stamp).
        health: the per-model counts; a failed continuation is counted there, and its
            ``suspended`` models never take the continuation path.
        continuation_prompt_n: ``timings.prompt_n`` of each continuation request answered
            (figures, tests; empty at start).
    """

    settings: Settings
    summaries: SummaryClient
    slots: SlotWatch
    health: SummaryHealth
    continuation_prompt_n: list[int] = field(default_factory=list)

    async def summarise(
        self,
        view: ContextView,
        n_ctx: int,
        st: ConvState,
        cut: D.Cut,
        ids: BlockIds,
        archived: list[str],
    ) -> tuple[SummaryOutcome, str]:
        """The summary of ``cut.torso`` for ``view.conversation`` (``st``: its state) in a
        window of ``n_ctx`` tokens; ``ids``: the recall id of each big part, ``archived``:
        the ids archived (named in the continuation's demand).

        Returns:
            The outcome (``text`` None: the summary failed, ``failure`` says why) and its
            path: ``continuation`` (only when it gave a summary) or ``summary`` (the
            transcript path). No lease, a network or HTTP error, an unusable answer: a
            failed outcome, not an exception (:class:`~.summary_client.SummaryClient`).
        """
        budget = budget_tokens(n_ctx)
        conv = view.conversation
        allowed = D.continuation_allowed(
            enabled=self.settings.compact_continuation,
            trigger=view.trigger,
            stamp=st.stamp,
            epoch=self.slots.epoch,
            suspended=self.health.suspended,
            messages=conv.messages,
            ctx_used=view.ctx_used,
            n_ctx=n_ctx,
            budget=budget,
            count=conv.meter.tokens,
        )
        if allowed and st.stamp is not None:
            model = st.stamp.model
            outcome = await self.summaries.continuation(
                conv, st.stamp, cut.boundary, budget, archived
            )
            if outcome.prompt_n is not None:
                self.continuation_prompt_n.append(outcome.prompt_n)
            if outcome.text is not None:
                self.health.continuation_passed(model)
                return outcome, "continuation"
            self.health.continuation_failed(model, outcome)
            log.info(
                "[compact] %s: continuation failed (%s); transcript path", conv.id, outcome.failure
            )

        def render(cite: bool) -> str:
            return S.render_transcript(cut.torso, ids, set(ids), cite)

        return await self.summaries.transcript(conv.id, budget, render), "summary"
