"""What the compaction policy remembers of each conversation (in memory only, per instance).

A restart forgets it: the generation guard starts from an empty history, a refusal may be
tried again, and no slot is assumed to hold a conversation's prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .failures import FailedSummaries

#: Generations remembered for the generation guard.
RECENT_GENERATIONS = 8


@dataclass
class Stamp:
    """The slot holds this conversation's prompt: the request ``body`` as sent (decoded),
    ``count`` model-view messages it carried, the engine it went to (``model``, ``n_ctx``,
    ``id_slot``), the :attr:`~.slot_watch.SlotWatch.epoch` it was taken at, and ``tokens``:
    what the slot held after it (``usage.prompt_tokens + completion_tokens``; None when the
    engine did not say)."""

    body: dict[str, Any]
    count: int
    model: str
    n_ctx: int
    id_slot: int | None
    epoch: int
    tokens: int | None = None


@dataclass
class ConvState:
    """One conversation's memory: the last generations' sizes (tokens), the context size at
    the last refusal (for lack of reduction, or a failed summary: the hold-off of
    :func:`~.decide.decide`), compactions since the last accepted step, whether a reactive
    compaction already ran since, the slot stamp, the fingerprints of the summaries that
    failed (:mod:`.failures`), and whether its last step went to an external preset (no
    PREWARM there, so no turn-end look-ahead)."""

    generations: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_GENERATIONS))
    refused_at: int | None = None
    since_step: int = 0
    reactive_done: bool = False
    stamp: Stamp | None = None
    failed: FailedSummaries = field(default_factory=FailedSummaries)
    summary_model: str | None = None  # the model of the last summary that failed
    external: bool = False  # the last step's lease was an external preset's
