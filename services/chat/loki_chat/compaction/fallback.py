"""What takes a failed summary's place in the model view: the fallback of a compaction.

One concept: once a summary failed (continuation, its retry and the transcript path), which
view replaces the torso — raw reasoning is never installed. The rules it holds, in order:

- COMPACT_TAIL_REUSE applies (:func:`~.layout.applies`: key on, local engine, a template
  that allows it) and the summary did not fail for want of a lease: an index of the torso
  (:mod:`.digest`) takes the summary's place, sent after the tail like a summary (the tail
  keeps its place and its cache); an archive request that fails, or an index that leaves the
  context above the threshold (not reactively), falls back as with the key off;
- else the torso stripped of its big blocks (:func:`~.rules.strip_torso`, ids kept), before
  the tail; installed when it strips something and the trigger is reactive, or it leaves the
  context at or under the threshold, or the engine was not reached (no lease: nothing is
  dropped for that);
- no lease, not reactive, and nothing to strip: the view is left as it is;
- otherwise (above the threshold, or nothing stripped): archive-then-drop the oldest
  exchanges (:mod:`.shrink`), from the stripped view when it stripped something.

Pure choice but for the index's archive requests: the policy applies the result
(:class:`~.policy.CompactionPolicy`), and remembers the failure (:mod:`.failures`,
:mod:`.health`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from loki_shared.messages.chat import ChatMessage

from ..context import ContextView
from ..settings import Settings
from . import decide as D
from . import layout
from .archive import Archiver, BlockIds
from .digest import digest
from .rules import budget_tokens, strip_torso
from .summary_client import SummaryClient

log = logging.getLogger("loki.chat.compaction")


@dataclass(frozen=True)
class Fallback:
    """What takes a failed summary's place (:meth:`FallbackPath.choose`).

    Attributes:
        action: ``index`` — install ``new``, the torso's index after the tail (its marker
            carries the failing-model note); ``strip`` — install ``new``, the stripped torso
            before the tail (no note); ``drop`` — archive-then-drop, from ``new`` when it is
            not empty (the stripped view, still above the threshold); ``none`` — leave the
            view as it is.
        new: the model view (without the system message); empty for ``none``, and for
            ``drop`` when stripping saved nothing.
        after: ``new``'s size in tokens, system prompt included (``index`` and ``strip``;
            else 0).
        archived: the recall ids the index archived, beyond the summary's own (``index``;
            else empty).
    """

    action: Literal["index", "strip", "drop", "none"]
    new: list[ChatMessage] = field(default_factory=list)
    after: int = 0
    archived: list[str] = field(default_factory=list)


class FallbackPath:
    """Chooses, and builds, what takes a failed summary's place.

    Args:
        settings: ``compact_tail_reuse``, ``compact_threshold``, ``system_prompt``.
        archiver: archives what the index cuts or leaves out (through the recall service).
        summaries: the summary client (``template``: the last lease's template probe;
            ``cite``: whether recall ids may be named to the model).
    """

    def __init__(self, settings: Settings, archiver: Archiver, summaries: SummaryClient) -> None:
        self.settings = settings
        self.archiver = archiver
        self.summaries = summaries

    async def choose(
        self,
        view: ContextView,
        n_ctx: int,
        external: bool,
        cut: D.Cut,
        ids: BlockIds,
        failure: str | None,
    ) -> Fallback:
        """What takes the place of ``cut``'s failed summary (``failure``: why it failed;
        ``no_lease``: the engine was not reached) in ``view.conversation``, a window of
        ``n_ctx`` tokens; ``external``: the conversation's last step went to an external
        preset (no COMPACT_TAIL_REUSE there); ``ids``: the recall id of each big part. Logs
        the choice (warning); never changes the view. Raises nothing of its own (a failed
        archive request: no index)."""
        conv = view.conversation
        reactive = view.trigger == "reactive"
        tail_first = layout.applies(
            self.settings.compact_tail_reuse, external, self.summaries.template
        )
        if tail_first and failure != "no_lease":
            indexed = await self.index(view, n_ctx, cut, ids)
            if indexed is not None:
                new, after, more = indexed
                log.warning(
                    "[compact] %s: summary failed (%s); torso indexed after the tail",
                    conv.id,
                    failure,
                )
                return Fallback("index", new, after, more)
        stripped = strip_torso(cut.torso, ids, self.summaries.cite)
        new = [*stripped, *cut.tail]
        after = conv.meter.view_tokens(self.settings.system_prompt, new)
        above = after > self.settings.compact_threshold * n_ctx
        # no lease: the engine was not reached (busy, restarting): nothing is dropped for that
        unreached = failure == "no_lease" and not reactive
        if unreached and stripped == cut.torso:
            return Fallback("none")
        if stripped != cut.torso and (reactive or not above or unreached):
            log.warning(
                "[compact] %s: summary failed (%s); torso stripped of big blocks", conv.id, failure
            )
            return Fallback("strip", new, after)
        log.warning(
            "[compact] %s: summary failed (%s) and stripping %s; archive and drop",
            conv.id,
            failure,
            "leaves the context above the threshold" if stripped != cut.torso else "saves nothing",
        )
        return Fallback("drop", new if stripped != cut.torso else [])

    async def index(
        self, view: ContextView, n_ctx: int, cut: D.Cut, ids: BlockIds
    ) -> tuple[list[ChatMessage], int, list[str]] | None:
        """COMPACT_TAIL_REUSE's fallback (:mod:`.digest`): the model view with the failed
        summary's place taken by an index of the torso, sent after the tail like a summary
        (the tail keeps its place and its cache), its size (tokens) and the ids it archived.
        None when an archive request failed, or when the result would still be above the
        threshold (not reactively): the key-off fallback follows."""
        conv = view.conversation

        async def archive(role: str, text: str, tool_name: str | None) -> str | None:
            return await self.archiver.archive(conv.id, role, text, tool_name)

        made = await digest(cut.torso, ids, budget_tokens(n_ctx), archive, self.summaries.cite)
        if made is None:
            return None
        text, more = made
        summary = D.summary_message(cut, text, ids, self.summaries.cite)
        if summary.loki is not None:
            summary.loki.sent_after = len(D.continued(cut.tail))
        new = [summary, *cut.tail]
        after = conv.meter.view_tokens(self.settings.system_prompt, new)
        if after > self.settings.compact_threshold * n_ctx and view.trigger != "reactive":
            return None
        return new, after, more
