"""When to compact, what to cut, and which summary path fits: pure rules (no I/O).

Sizes are tokens (a ``count`` function: the engine's counts, :mod:`loki_chat.tokens`, when
known; else estimates by :func:`loki_chat.meter.estimate_tokens`); ``n_ctx`` is the window.
Tests: ``tests/compaction/test_compaction_decide.py``
(these functions alone) and ``test_compaction_policy.py`` (the policy around them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from loki_shared.messages.chat import ChatMessage, LokiMeta

from ..context import OverflowInfo
from ..meter import estimate_tokens
from . import summariser as S
from .rules import (
    BIG_BLOCK_CHARS,
    SUMMARY_KIND,
    excerpt,
    is_real_request,
    last_request,
    tail_start,
    text_of,
)
from .state import Stamp

SUMMARY_HEADER = (
    "[Summary of the earlier conversation, written by Loki when it was "
    "compacted. Archived blocks come back verbatim with recall(id).]\n"
)
#: The header for a model whose template drops ``tools`` (it cannot call ``recall``).
SUMMARY_HEADER_NO_TOOLS = (
    "[Summary of the earlier conversation, written by Loki when it was compacted.]\n"
)
REQUEST_HEADER = "\n\n[The request in progress]\n"

#: Max compactions between two accepted completion steps.
MAX_PER_STEP = 2
#: A compaction must save at least this share of the context (else it is refused).
MIN_GAIN_SHARE = 0.2
#: The last-resort shrink aims at this share of the window.
SHRINK_SHARE = 0.6
#: Past this share of the window a refused summary goes on to archive-then-drop (the
#: request would not fit, or would leave no room to answer).
FULL_SHARE = 0.9
#: The turn-end look-ahead (with PREWARM): real user requests it looks back at ...
LOOKAHEAD_REQUESTS = 6
#: ... and the most it expects of the next one, as a share of the window.
LOOKAHEAD_SHARE = 0.10


@dataclass(frozen=True)
class Decision:
    """Why to compact now (``threshold``, ``generation``, ``lookahead``, ``manual``,
    ``reactive``; None: not now), and whether the remembered refusal is to be forgotten (the
    context dropped below it)."""

    why: str | None
    forget_refusal: bool = False


def decide(
    trigger: str,
    used: int,
    n_ctx: int,
    *,
    threshold: float,
    since_step: int,
    refused_at: int | None,
    generations: Iterable[int] = (),
    lookahead: int = 0,
) -> Decision:
    """Whether to compact at ``trigger`` with ``used`` tokens of an ``n_ctx`` window.

    - ``manual`` and ``reactive`` always try;
    - never more than :data:`MAX_PER_STEP` compactions between two completion steps, nor
      with an unknown window;
    - after a refusal at ``refused_at`` tokens, no new try before the context grows 10%
      more, except at 90% of the window; the refusal is forgotten when the context drops;
    - compact past ``threshold`` × ``n_ctx``, or when 1.2 × the longest of the recent
      ``generations`` no longer fits in what is left — never below half the window;
    - at turn end only, the look-ahead (``lookahead`` tokens expected of the user's next
      message, :func:`lookahead_tokens`; 0: none): compact when ``used + lookahead`` passes
      the threshold — never below half the window. The compaction the next message would
      have set off at turn start, with the user waiting for its summary, runs while the user
      reads, and PREWARM fills the slot behind it.
    """
    if trigger in ("manual", "reactive"):
        return Decision(trigger)
    if n_ctx <= 0 or since_step >= MAX_PER_STEP:
        return Decision(None)
    forget = False
    if refused_at is not None:
        if used < refused_at:
            forget = True
        elif used < refused_at * 1.1 and used < 0.9 * n_ctx:
            return Decision(None)
    if used > threshold * n_ctx:
        return Decision("threshold", forget)
    half = used >= 0.5 * n_ctx
    if trigger == "end" and lookahead > 0 and half and used + lookahead > threshold * n_ctx:
        return Decision("lookahead", forget)
    longest = max(generations, default=0)
    if half and 1.2 * longest > n_ctx - used:
        return Decision("generation", forget)
    return Decision(None, forget)


def lookahead_tokens(
    messages: Iterable[ChatMessage], n_ctx: int, count: Callable[[ChatMessage], int]
) -> int:
    """What the turn-end look-ahead expects of the user's next message (tokens): the largest
    of the last :data:`LOOKAHEAD_REQUESTS` real user requests of ``messages`` (the model
    view; reminders and summaries are not requests), sized by ``count``, and never more than
    :data:`LOOKAHEAD_SHARE` of an ``n_ctx`` window (a rare huge paste still compacts at turn
    start rather than cutting every turn short). 0 when there is none or the window is
    unknown."""
    if n_ctx <= 0:
        return 0
    recent: list[int] = []
    for message in reversed(list(messages)):
        if is_real_request(message):
            recent.append(count(message))
            if len(recent) == LOOKAHEAD_REQUESTS:
                break
    return min(max(recent, default=0), int(LOOKAHEAD_SHARE * n_ctx))


def generation_tokens(usage: dict[str, Any] | None, generated_chars: int) -> int:
    """The size of one generation: ``usage.completion_tokens``, else characters / 4."""
    completion = (usage or {}).get("completion_tokens")
    return completion if isinstance(completion, int) else generated_chars // 4


@dataclass
class Cut:
    """Where a compaction cuts the model view: the ``torso`` (summarised) before index
    ``boundary`` and the verbatim ``tail``; the torso's last real ``request`` and whether it
    is re-injected after the summary (the tail holds no user request); ``gain``: what an
    empty summary would save (tokens)."""

    boundary: int
    torso: list[ChatMessage]
    tail: list[ChatMessage]
    request: ChatMessage | None
    reinject: bool
    gain: int

    def saves_enough(self, before: int) -> bool:
        """Whether the cut can reduce a context of ``before`` tokens by
        :data:`MIN_GAIN_SHARE` (re-measured before anything is summarised)."""
        return self.gain >= MIN_GAIN_SHARE * max(before, 1)


#: Tokens of one message: the engine's count when known, else the estimate.
Count = Callable[[ChatMessage], int]


def plan_cut(messages: list[ChatMessage], count: Count = estimate_tokens) -> Cut | None:
    """The cut of ``messages`` (the model view without the system message): the tail by
    :func:`~.rules.tail_start`; None when nothing can be compacted. Sizes by ``count``."""
    b = tail_start(messages, count=count)
    if b is None:
        return None
    torso, tail = messages[:b], messages[b:]
    request = last_request(torso)
    reinject = request is not None and not any(is_real_request(m) for m in tail)
    wrapper = SUMMARY_HEADER
    if reinject and request is not None:
        text = text_of(request)  # a big request is re-injected as its excerpt (sized here)
        wrapper += REQUEST_HEADER + (
            excerpt(text, "r0000000") if len(text) >= BIG_BLOCK_CHARS else text
        )
    torso_est = sum(count(m) for m in torso)
    gain = torso_est - count(ChatMessage(role="user", content=wrapper))
    return Cut(b, torso, tail, request, reinject, gain)


def summary_message(
    cut: Cut,
    summary: str,
    ids: dict[tuple[int, str], str | None] | None = None,
    cite: bool = True,
) -> ChatMessage:
    """The message installed before the tail: a user message marked
    ``loki.injected="summary"``, holding the torso's last request re-injected when
    ``cut.reinject`` — as its excerpt and recall id when it is a big block that was archived
    (``ids``: the archived parts by torso index and text), never a second verbatim copy of a
    long paste; whole when it could not be archived (nothing lost). ``cite`` False (the
    model's template drops ``tools``, :func:`~.rules.cites_ids`): the header does not offer
    ``recall(id)`` and the excerpt names no id."""
    content = (SUMMARY_HEADER if cite else SUMMARY_HEADER_NO_TOOLS) + summary
    if cut.reinject and cut.request is not None:
        text = text_of(cut.request)
        index = next((i for i, m in enumerate(cut.torso) if m is cut.request), -1)
        block = (ids or {}).get((index, text))
        if block and len(text) >= BIG_BLOCK_CHARS:
            text = excerpt(text, block, cite)
        content += REQUEST_HEADER + text
    return ChatMessage(role="user", content=content, loki=LokiMeta(injected=SUMMARY_KIND))


def continued(after: list[ChatMessage]) -> list[ChatMessage]:
    """The messages accepted since the slot's last request that a continuation request
    carries: all but the trailing user messages — those are not in the slot's cache (they
    would be prefilled for nothing), the demand must not be read as their answer, and a
    strict template never sees two user messages in a row. They stay in the verbatim tail."""
    end = len(after)
    while end and after[end - 1].role == "user":
        end -= 1
    return after[:end]


def continuation_fits(
    stamp: Stamp,
    messages: list[ChatMessage],
    ctx_used: int,
    n_ctx: int,
    budget: int,
    count: Count = estimate_tokens,
) -> bool:
    """Whether a continuation request fits the window: the slot's prompt (``stamp.tokens``
    when the engine counted it, else ``ctx_used`` less the messages accepted since and the
    trailing user messages), plus the messages accepted since and the demand (``count`` ×
    1.05), plus the summary ``budget``."""
    after = continued(messages[stamp.count :])
    accepted = sum(count(m) for m in after)
    if count is estimate_tokens:  # the demand's text alone, as it always was estimated
        demand = estimate_tokens(S.CONTINUATION_DEMAND) + 40
    else:
        demand = count(ChatMessage(role="user", content=S.CONTINUATION_DEMAND)) + 40
    if stamp.tokens is not None:
        held = stamp.tokens
    else:  # the whole view, less what was accepted since and the trailing user messages
        left_out = messages[stamp.count + len(after) :]
        held = max(ctx_used - sum(count(m) for m in left_out) - accepted, 0)
    return held + (accepted + demand) * 1.05 + budget <= n_ctx


def continuation_allowed(
    *,
    enabled: bool,
    trigger: str,
    stamp: Stamp | None,
    epoch: int,
    suspended: set[str],
    messages: list[ChatMessage],
    ctx_used: int,
    n_ctx: int,
    budget: int,
    count: Count = estimate_tokens,
) -> bool:
    """Whether to try the continuation path (``COMPACT_CONTINUATION``): at turn start,
    mid-turn or turn end only; the slot still holds this conversation's last request
    (``stamp`` taken at the current ``epoch``), its model is not ``suspended``, the window
    did not change, and the request :func:`continuation_fits`."""
    if not enabled or trigger not in ("start", "mid", "end"):
        return False
    if stamp is None or stamp.epoch != epoch or stamp.model in suspended:
        return False
    if n_ctx and stamp.n_ctx and stamp.n_ctx != n_ctx:
        return False
    if stamp.count > len(messages):
        return False
    return continuation_fits(stamp, messages, ctx_used, n_ctx, budget, count)


def overflow_factor(overflow: OverflowInfo | None, estimate: int) -> float:
    """Real size / estimate, read from an overflow error's ``n_prompt_tokens`` (1 when
    unknown or smaller)."""
    real = overflow.n_prompt_tokens if overflow else None
    if real and estimate > 0:
        return max(1.0, real / estimate)
    return 1.0


def leaves_no_room(used: int, n_ctx: int, reply_cap: int | None) -> bool:
    """Whether a request of ``used`` tokens leaves no room to answer in a window of ``n_ctx``
    tokens (then archive-then-drop follows a compaction at any trigger): the room wanted is
    the smaller of the step's reply cap (``max_tokens``, None: unknown) and
    ``1 - FULL_SHARE`` of the window — so a small cap lets a long paste in the verbatim tail
    stay whole (issue 23: a 1,700-token paste in a 2,048-token window with replies capped at
    64 tokens fits, and is not to be dropped). False for an unknown window (``n_ctx`` 0)."""
    if n_ctx <= 0:
        return False
    room = (1 - FULL_SHARE) * n_ctx
    if reply_cap is not None and reply_cap > 0:
        room = min(room, float(reply_cap))
    return used + room > n_ctx


def shrink_target(n_ctx: int, factor: float) -> float:
    """What the last-resort shrink aims at, in estimated tokens: :data:`SHRINK_SHARE` of
    the window, corrected by the real/estimate ``factor``."""
    return SHRINK_SHARE * n_ctx / factor


def still_too_big(after: int, factor: float, n_ctx: int) -> bool:
    """After a reactive compaction: whether ``after`` estimated tokens (× ``factor``) are
    still above :data:`SHRINK_SHARE` of the window (then the shrink follows)."""
    return after * factor > SHRINK_SHARE * n_ctx
