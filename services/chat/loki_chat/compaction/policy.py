"""The compaction policy: when to compact, and compaction itself (archive, then summarise).

Implements :class:`loki_chat.context.ContextPolicy`. The rules live in the modules it puts
together (tests named in docs/behaviour.md (compaction)):

- when, what, which path fits: :mod:`.decide` (pure) — thresholds, the generation guard, the
  turn-end look-ahead (with PREWARM on a local engine), the refusal memory, at most two
  compactions between two completion steps; the cut (about the last 20% verbatim, from an
  assistant message) and the 20% gain re-measured first;
- archive first: :mod:`.archive` — every torso part of at least 800 characters, verbatim,
  through ``loki.recall.archive``; the summariser sees its first 400 characters and its id;
- the summary: :mod:`.summary_path` — continuation path (``COMPACT_CONTINUATION``) when
  :mod:`.slot_watch` says the slot still holds the conversation's last request and it fits,
  else the transcript path (requests: :mod:`.summary_client`); a failed or unusable summary
  falls back (:mod:`.fallback`) to the torso stripped of its big blocks
  (:func:`~.rules.strip_torso`, ids kept) — raw reasoning is never installed;
- after: system, the summary message (holding the torso's last request re-injected when the
  tail has no user request), then the tail; with ``COMPACT_TAIL_REUSE`` the summary is
  marked to be sent after the tail (:mod:`.layout`; stored order unchanged), and a failed
  summary's place is taken by an index of the archived torso (:mod:`.digest`) instead of the
  stripped torso before the tail; in code mode with criteria, the summary message also
  carries the criteria's state as last checked (:func:`with_criteria`);
- a summary that fails is remembered by its torso's fingerprint (:mod:`.failures`): the
  same summary is never asked again, and the refusal hold-off applies; when the fallback
  leaves the context above the threshold (or strips nothing), or the summary would repeat
  one that failed, :mod:`.shrink` archives then drops the oldest exchanges — at any trigger;
  two failures in a row on one model are logged once and named in the marker (:mod:`.health`);
- reactive, when the engine still refuses after a compaction (or nothing could be
  summarised): the last-resort :mod:`.shrink`;
- KEEP_TURN_IMAGES: whenever a compaction is due (any trigger), the kept images are made
  ephemeral first (:func:`loki_chat.kept_images.drop_kept`); when that alone brings the
  context under the threshold (or on a reactive overflow: the step is replayed without
  them), no text is summarised;
- a model whose chat template drops ``tools`` (the lease's template probe,
  ``supports_tools`` False) cannot call ``recall``: blocks are still archived, but no excerpt,
  summary header or summariser instruction cites a ``recall:r<N>`` id to it (issue 16);
- what each compaction leaves: :mod:`.events` (marker, audit event, log line) and a
  ``compact`` perf record per summary request.

The continuation path is suspended for a model (until restart) after two failures of
requests that reached the engine, or at once on a template error or a tool call
(:mod:`.health`).

This module applies what those choose: it installs a new model view, counts and marks it
(:meth:`CompactionPolicy._install`), and archives-then-drops (:meth:`CompactionPolicy._shrink`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease

from ..bus import ChatBus
from ..code.rules import summary_part
from ..context import ContextView
from ..kept_images import drop_kept
from ..leases import EngineLeases
from ..settings import Settings
from . import decide as D
from .archive import Archiver, BlockIds
from .events import CompactionEvents
from .failures import torso_fingerprint
from .fallback import FallbackPath
from .health import SummaryHealth
from .rules import SUMMARY_KIND, big_parts, budget_tokens
from .shrink import shrink
from .slot_watch import SlotWatch
from .state import ConvState
from .summary_client import SummaryClient, SummaryOutcome
from .summary_path import SummaryPath

log = logging.getLogger("loki.chat.compaction")


def with_criteria(new: list[ChatMessage], part: str) -> None:
    """Code mode: the criteria's state (``part``, :func:`loki_chat.code.rules.summary_part`)
    appended to the summary message of ``new`` (the first message marked
    ``loki.injected="summary"``; a fresh message anyway, so no cache is lost); nothing when
    ``part`` is empty or ``new`` holds no summary."""
    if not part:
        return
    for message in new:
        if message.loki and message.loki.injected == SUMMARY_KIND:
            if isinstance(message.content, str):
                message.content += part
            return


@dataclass
class CompactionDeps:
    """What the compaction policy needs from its chat instance.

    Attributes:
        settings: ``compact_threshold``, ``compact_continuation``, ``system_prompt``,
            ``chat_template_kwargs``, ``engine_timeout_s``, ``recall_timeout_s``,
            ``lease_timeout_s``.
        bus: the instance's NATS bus (leases, archive, engine info, events, perf records).
        http: the HTTP client for the engine (summary requests).
    """

    settings: Settings
    bus: ChatBus
    http: httpx.AsyncClient


class CompactionPolicy:
    """The default :class:`~loki_chat.context.ContextPolicy` of the chat service.

    Args:
        deps: the instance's settings, NATS bus and HTTP client.
    """

    def __init__(self, deps: CompactionDeps) -> None:
        self.settings = deps.settings
        self.states: dict[str, ConvState] = {}
        #: per model, until restart: continuation suspended, failed summaries in a row
        self.health = SummaryHealth()
        self.n_ctx = 0  # the window of the last lease seen (tokens)
        #: the cap on one step's reply (``LOKI_MAX_TOKENS``, else the last lease's; tokens)
        self.reply_cap: int | None = deps.settings.max_tokens
        self.slots = SlotWatch(self.states, deps.bus)
        self.archiver = Archiver(deps.bus, deps.settings.recall_timeout_s)
        self.events = CompactionEvents(deps.bus)
        leases = EngineLeases(deps.bus, deps.settings)
        self.summaries = SummaryClient(deps.settings, deps.bus, deps.http, leases, self.slots)
        self.summary_path = SummaryPath(deps.settings, self.summaries, self.slots, self.health)
        self.fallback = FallbackPath(deps.settings, self.archiver, self.summaries)

    @property
    def suspended(self) -> set[str]:
        """Models whose continuation path is suspended until restart (:mod:`.health`)."""
        return self.health.suspended

    @property
    def failures(self) -> dict[str, int]:
        """Counted continuation failures per model (:mod:`.health`)."""
        return self.health.failures

    @property
    def continuation_prompt_n(self) -> list[int]:
        """``timings.prompt_n`` of each continuation request answered (figures, tests)."""
        return self.summary_path.continuation_prompt_n

    @property
    def _perf_sub(self) -> Any:
        """The perf ring subscription of the slot watch (None until watching)."""
        return self.slots.subscription

    def state(self, cid: str) -> ConvState:
        return self.states.setdefault(cid, ConvState())

    # -- notes from the turn loop -----------------------------------------------------------
    def note_step(
        self,
        cid: str,
        lease: Lease,
        body: bytes,
        usage: dict[str, Any] | None,
        count: int,
        generated_chars: int = 0,
    ) -> None:
        """See :meth:`loki_chat.context.ContextPolicy.note_step`: the slot now holds this
        conversation's prompt (every other conversation's stamp is void), its generation
        size is remembered, and the per-step compaction count restarts."""
        st = self.state(cid)
        st.since_step = 0
        st.reactive_done = False
        st.generations.append(D.generation_tokens(usage, generated_chars))
        st.external = lease.external
        if lease.n_ctx:
            self.n_ctx = lease.n_ctx
        if self.settings.max_tokens is None:
            self.reply_cap = lease.max_tokens
        self.summaries.template = lease.template
        self.slots.stamp(st, lease, body, usage, count)

    async def window(self, view: ContextView) -> int:
        """The window (tokens): the view's, else the last lease's, else
        ``loki.engine.info``'s; 0 when unknown."""
        if view.n_ctx:
            return view.n_ctx
        if self.n_ctx:
            return self.n_ctx
        info = await self.summaries.engine_info()
        return info.n_ctx if info and info.n_ctx else 0

    # -- entry point ------------------------------------------------------------------------
    async def maybe_compact(self, view: ContextView) -> bool:
        """See :class:`~loki_chat.context.ContextPolicy`. Never raises for engine, recall or
        NATS trouble (a failed summary falls back; a failed fallback changes nothing)."""
        await self.slots.start()
        conv = view.conversation
        st = self.state(conv.id)
        await conv.meter.prime(self.settings.system_prompt, conv.messages)
        n_ctx = await self.window(view)
        lookahead = 0
        if view.trigger == "end" and self.settings.prewarm and not st.external:
            # PREWARM's look-ahead: what the next message would push past the threshold is
            # compacted now, while the user reads, and the prewarm fills the slot behind it
            lookahead = D.lookahead_tokens(conv.messages, n_ctx, conv.meter.tokens)

        def decide() -> D.Decision:
            return D.decide(
                view.trigger,
                view.ctx_used,
                n_ctx,
                threshold=self.settings.compact_threshold,
                since_step=st.since_step,
                refused_at=st.refused_at,
                generations=st.generations,
                lookahead=lookahead,
            )

        decision = decide()
        if decision.forget_refusal:
            st.refused_at = None
        if decision.why is None:
            return False
        log.info(
            "[compact] %s: %s (%s), ctx_used %d of %d",
            conv.id,
            view.trigger,
            decision.why,
            view.ctx_used,
            n_ctx,
        )
        freed = drop_kept(conv.messages)
        if freed:  # KEEP_TURN_IMAGES: kept images go first, before any text is summarised
            conv.meter.invalidate()
            view.ctx_used = max(0, view.ctx_used - freed)
            log.info("[compact] %s: kept images dropped first (%d tokens)", conv.id, freed)
            if view.trigger == "reactive":
                return True  # replayed without them; still refused, compaction goes on
            if view.trigger != "manual" and decide().why is None:
                return True
        return await self.compact(view, n_ctx, st)

    async def compact(self, view: ContextView, n_ctx: int, st: ConvState) -> bool:
        """Compact ``view.conversation`` now (archive, summarise or fall back; when that
        leaves the context above the threshold, or reactively when it is not enough,
        archive-then-drop). True when the model view changed."""
        conv = view.conversation
        reactive = view.trigger == "reactive"
        t0 = time.monotonic()
        before = view.ctx_used
        if reactive and st.reactive_done:
            return await self._shrink(view, n_ctx, st, t0)
        cut = D.plan_cut(list(conv.messages), conv.meter.tokens)
        if cut is None:
            return await self._shrink(view, n_ctx, st, t0) if reactive else False
        if not cut.saves_enough(before):
            st.refused_at = before
            log.info(
                "[compact] %s: refused, an empty summary would save %d of %d tokens",
                conv.id,
                cut.gain,
                before,
            )
            await self.events.audit(view, "refused", before, before, [], t0)
            if reactive or D.leaves_no_room(before, n_ctx, self.reply_cap):
                # the request would not fit (or barely): the path that always reduces
                return await self._shrink(view, n_ctx, st, t0)
            return False
        budget = budget_tokens(n_ctx)
        fingerprint = torso_fingerprint(cut.torso, budget)
        if st.failed.failed(fingerprint):
            # the very same summary request failed already: never sent again
            log.info("[compact] %s: this summary failed before; archive and drop", conv.id)
            note = self.health.note(st.summary_model)
            changed = await self._shrink(view, n_ctx, st, t0, failure="failed_before", note=note)
            if not changed:
                st.refused_at = before
            return changed
        st.refused_at = None
        ids, archived = await self.archiver.archive_parts(conv.id, big_parts(cut.torso))
        outcome, path = await self.summary_path.summarise(view, n_ctx, st, cut, ids, archived)
        if outcome.text is None:
            return await self._failed(view, n_ctx, st, t0, cut, ids, archived, outcome, fingerprint)
        self.health.summary_passed(outcome.model)
        summary = D.summary_message(cut, outcome.text, ids, self.summaries.cite)
        if self.settings.compact_tail_reuse and summary.loki is not None:
            # COMPACT_TAIL_REUSE: sent after the tail (less its trailing user messages)
            summary.loki.sent_after = len(D.continued(cut.tail))
        await self._install(
            view, n_ctx, st, [summary, *cut.tail], path, archived, t0, summary=outcome.text
        )
        return True

    async def _failed(
        self,
        view: ContextView,
        n_ctx: int,
        st: ConvState,
        t0: float,
        cut: D.Cut,
        ids: BlockIds,
        archived: list[str],
        outcome: SummaryOutcome,
        fingerprint: str,
    ) -> bool:
        """The summary failed: remember it (never asked again; hold-off), count it for its
        model (:mod:`.health`), and apply what takes its place (:mod:`.fallback`): the
        torso's index or the stripped torso installed, or archive-then-drop the oldest
        exchanges. True when the model view changed."""
        conv = view.conversation
        before = view.ctx_used
        if outcome.failure != "no_lease":  # a request that never left is not remembered
            st.failed.remember(fingerprint, before)
        st.refused_at = before
        note = self.health.summary_failed(outcome.model)
        if outcome.model:
            st.summary_model = outcome.model
        fb = await self.fallback.choose(view, n_ctx, st.external, cut, ids, outcome.failure)
        if fb.action == "none":
            return False
        if fb.action != "drop":
            await self._install(
                view,
                n_ctx,
                st,
                fb.new,
                "fallback",
                archived + fb.archived,
                t0,
                after=fb.after,
                failure=outcome.failure,
                note=note if fb.action == "index" else None,
            )
            return True
        if fb.new:  # stripped, yet above the threshold: dropping goes on from the stripped view
            conv.messages[:] = fb.new
            conv.meter.invalidate()
        return await self._shrink(
            view,
            n_ctx,
            st,
            t0,
            before=before,
            archived=archived,
            failure=outcome.failure,
            note=note,
            stripped=bool(fb.new),
        )

    async def _install(
        self,
        view: ContextView,
        n_ctx: int,
        st: ConvState,
        new: list[ChatMessage],
        path: str,
        archived: list[str],
        t0: float,
        after: int | None = None,
        **extra: str | None,
    ) -> None:
        """Install ``new`` as ``view.conversation``'s model view and count the compaction;
        mark it (``path``, the ``archived`` ids, ``t0`` the monotonic start, ``after`` its
        tokens — None: counted now —, ``extra`` the marker's ``summary``, ``failure``,
        ``note``; tokens before: ``view.ctx_used``), then archive-then-drop when it left too
        much."""
        before = view.ctx_used
        conv = view.conversation
        with_criteria(new, summary_part(conv.code))
        conv.messages[:] = new
        conv.meter.invalidate()
        if after is None:
            after = conv.meter.used(self.settings.system_prompt, conv.messages)
        st.since_step += 1
        if view.trigger == "reactive":
            st.reactive_done = True
        await self.events.mark(view, path, before, after, archived, t0, **extra)
        await self._shrink_if_still_refused(view, n_ctx, st, before, after)

    async def _shrink_if_still_refused(
        self, view: ContextView, n_ctx: int, st: ConvState, before: int, after: int
    ) -> None:
        """When the compaction left too much, archive-then-drop follows: reactively, more
        than the shrink's share of the window (corrected by the size the engine reported);
        at any other trigger, 90% of the window or more (the request would not fit, or leave
        no room to answer — a long paste in the verbatim tail)."""
        if view.trigger == "reactive":
            if view.overflow is not None:
                factor = D.overflow_factor(view.overflow, before)
                if D.still_too_big(after, factor, n_ctx):
                    await self._shrink(view, n_ctx, st, time.monotonic())
        elif D.leaves_no_room(after, n_ctx, self.reply_cap):
            await self._shrink(view, n_ctx, st, time.monotonic())

    # -- last resort ------------------------------------------------------------------------
    async def _shrink(
        self,
        view: ContextView,
        n_ctx: int,
        st: ConvState,
        t0: float,
        *,
        before: int | None = None,
        archived: list[str] | None = None,
        failure: str | None = None,
        note: str | None = None,
        stripped: bool = False,
    ) -> bool:
        """Archive-then-drop (:func:`.shrink.shrink`) toward :func:`~.decide.shrink_target`
        (corrected by the size an overflow reported). ``before``/``archived``: the context
        size and the ids of a failed summary's fallback this continues (``stripped``: that
        fallback already changed the view); one marker (path ``shrink``, or ``fallback``
        when nothing could be dropped after a strip). True when the model view changed."""
        conv = view.conversation
        if n_ctx <= 0:
            return stripped
        reactive = view.trigger == "reactive"
        factor = D.overflow_factor(view.overflow, view.ctx_used)
        target = D.shrink_target(n_ctx, factor)
        system = self.settings.system_prompt
        if before is None:
            before = conv.meter.used(system, conv.messages)
        ids = list(archived or [])
        reachable = True

        async def archive(role: str, text: str, tool_name: str | None) -> str | None:
            nonlocal reachable
            if not reachable:  # recall unreachable: not tried again in this compaction
                return None
            block = await self.archiver.archive(conv.id, role, text, tool_name)
            reachable = block is not None
            return block

        new, dropped = await shrink(
            conv.messages,
            lambda view: conv.meter.view_tokens(system, view),
            target,
            archive,
            self.summaries.cite,
        )
        if new == conv.messages and not stripped:
            return False
        path = "shrink" if new != conv.messages else "fallback"
        conv.messages[:] = new
        conv.meter.invalidate()
        after = conv.meter.used(system, conv.messages)
        st.since_step += 1
        if reactive:
            st.reactive_done = True
        await self.events.mark(
            view, path, before, after, ids + dropped, t0, failure=failure, note=note
        )
        return True
