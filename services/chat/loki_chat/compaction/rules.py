"""Pure rules of compaction: where the tail starts, which parts are big, how a torso is
stripped of them, how a summary is cleaned, what counts as degenerate, and the summary
budget.

Everything here works on the model view (``list[ChatMessage]`` without the system message)
and on token counts (a ``count`` function: the engine's counts, :mod:`loki_chat.tokens`, or
the estimate :func:`loki_chat.meter.estimate_tokens`); nothing does I/O.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loki_shared.messages.chat import REMINDER_KINDS, ChatMessage
from loki_shared.messages.engine import TemplateProbe

from ..meter import estimate_tokens

#: A message part of at least this many characters is archived verbatim before summarising.
BIG_BLOCK_CHARS = 800
#: What the summariser (and a stripped torso) keeps of a big part: its first characters.
EXCERPT_CHARS = 400
#: Share of the context kept verbatim at the end (the tail).
TAIL_SHARE = 0.20
#: ``loki.injected`` of the summary message compaction installs.
SUMMARY_KIND = "summary"
#: Marker appended to a summary cut by ``finish_reason: length`` or by the safety net.
CUT_MARK = "[…]"


def text_of(message: ChatMessage) -> str:
    """The text of a message (content parts of type ``text`` joined; an image part is named
    ``[image]``)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            out.append(str(part.get("text", "")))
        else:
            out.append("[image]")
    return "\n".join(out)


def is_reminder(message: ChatMessage) -> bool:
    """A reminder Loki injected (recognised by ``loki.injected``, never by its text)."""
    return bool(message.loki and message.loki.injected in REMINDER_KINDS)


def is_real_request(message: ChatMessage) -> bool:
    """A user message the user wrote (not a reminder, not a summary)."""
    return message.role == "user" and not (message.loki and message.loki.injected)


def budget_tokens(n_ctx: int) -> int:
    """``max_tokens`` of a summary request, indexed on the window: ``n_ctx / 40`` clamped to
    256..2048 tokens (1,638 at 65,536; 256 at 2,048)."""
    return max(256, min(2048, n_ctx // 40))


def tail_start(
    messages: list[ChatMessage],
    share: float = TAIL_SHARE,
    count: Callable[[ChatMessage], int] = estimate_tokens,
) -> int | None:
    """Index where the verbatim tail starts, or None when nothing can be compacted.

    Rules: about the last ``share`` of the tokens (``count``: the engine's counts when
    known, else estimates) stay; the tail starts on an
    assistant message — so it never starts on a reminder or another user message (the
    summary message before it is a user message: no two consecutive user messages) and
    never on a tool result (a tool call is never separated from its results). When the
    share lands inside a group, the start moves back to the group's assistant message; when
    no assistant message is found before, forward to the next one. The torso (before the
    start) must hold at least one message.
    """
    n = len(messages)
    if n < 2:
        return None
    total = sum(count(m) for m in messages)
    want = total * share
    acc = 0
    i = n
    while i > 0 and acc < want:
        i -= 1
        acc += count(messages[i])
    # move back to an assistant message
    j = i
    while j > 0 and messages[j].role != "assistant":
        j -= 1
    if j > 0 and messages[j].role == "assistant":
        return j
    # none before: forward to the next assistant message
    j = i
    while j < n and messages[j].role != "assistant":
        j += 1
    if 0 < j < n:
        return j
    return None


def last_request(torso: list[ChatMessage]) -> ChatMessage | None:
    """The last real user request of the torso (reminders and summaries skipped)."""
    for message in reversed(torso):
        if is_real_request(message):
            return message
    return None


@dataclass
class BigPart:
    """A big part of a torso message: ``index`` in the torso, its ``text``, who wrote it,
    and the recall id once archived."""

    index: int
    text: str
    role: str
    tool_name: str | None = None
    id: str | None = None


def big_parts(torso: list[ChatMessage], threshold: int = BIG_BLOCK_CHARS) -> list[BigPart]:
    """Parts of at least ``threshold`` characters: message texts and tool-call argument
    texts, in order. A summary message Loki installed is never re-archived (its blocks are
    archived already)."""
    out: list[BigPart] = []
    for i, message in enumerate(torso):
        if message.loki and message.loki.injected == SUMMARY_KIND:
            continue
        text = text_of(message)
        if len(text) >= threshold:
            out.append(
                BigPart(i, text, message.role, message.name if message.role == "tool" else None)
            )
        for call in message.tool_calls or []:
            if len(call.function.arguments) >= threshold:
                out.append(BigPart(i, call.function.arguments, "assistant", call.function.name))
    return out


#: What an excerpt says of a block archived for a model that cannot call ``recall``.
ARCHIVED_QUIET = "(archived verbatim)"


def cites_ids(template: TemplateProbe | None) -> bool:
    """Whether compaction may cite ``recall:r<N>`` ids to the model: False only when the
    template probe says the chat template drops ``tools`` (``supports_tools`` False: the model
    never sees ``recall``, issue 16); True when it renders them or was not probed."""
    return not (template is not None and template.supports_tools is False)


def excerpt(text: str, block_id: str | None, cite: bool = True) -> str:
    """A big part as the summariser sees it: the first 400 characters, then its id — or,
    when ``cite`` is False (the model cannot call ``recall``), only that it was archived."""
    head = text[:EXCERPT_CHARS]
    if block_id and cite:
        return f"{head} […] (archived verbatim as recall:{block_id})"
    if block_id:
        return f"{head} […] {ARCHIVED_QUIET}"
    return f"{head} […]"


def strip_torso(
    torso: list[ChatMessage],
    ids: dict[tuple[int, str], str | None],
    cite: bool = True,
) -> list[ChatMessage]:
    """The torso with each archived big part replaced by its excerpt and id (a part that
    could not be archived stays whole: nothing is lost); ``cite`` False: no id
    (:func:`cites_ids`), an archived tool call's arguments say ``"archived": "verbatim"``."""
    out: list[ChatMessage] = []
    for i, message in enumerate(torso):
        text = text_of(message)
        update: dict[str, Any] = {}
        block = ids.get((i, text))
        if block and isinstance(message.content, str):
            update["content"] = excerpt(text, block, cite)
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                cid = ids.get((i, call.function.arguments))
                if cid:
                    # arguments stay valid JSON (templates re-parse them)
                    mark = f"recall:{cid}" if cite else "verbatim"
                    args = json.dumps({"archived": mark, "excerpt": call.function.arguments[:400]})
                    call = call.model_copy(
                        update={"function": call.function.model_copy(update={"arguments": args})}
                    )
                calls.append(call)
            update["tool_calls"] = calls
        out.append(message.model_copy(update=update) if update else message)
    return out


# --------------------------------------------------------------------------- cleaning
_LEAD_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_TOOL_MARKUP = re.compile(r"<tool_call>|<\|tool_call|<function=|\[TOOL_CALLS\]", re.IGNORECASE)


class SummaryError(ValueError):
    """A summary that must not be installed as memory (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Cleaned:
    """A cleaned summary; ``cut`` says whether it was marked ``[…]`` (and why)."""

    text: str
    cut: str | None = None


def clean_summary(
    content: str | None,
    *,
    reasoning: str | None = None,
    tool_calls: Any = None,
    finish_reason: str | None = None,
    budget: int = 256,
) -> Cleaned:
    """Clean a summariser answer.

    - Reasoning is removed only at the head: one or more leading ``<think>…</think>``
      blocks, or everything up to a ``</think>`` that has no ``<think>`` before it (a
      template that opens the block in the prompt). A tag quoted later stays.
    - ``finish_reason: "length"`` keeps the text, marked ``[…]``.
    - Safety net for an API that ignores ``max_tokens``: cut at ``budget × 6`` characters,
      marked ``[…]``.

    Raises:
        SummaryError: a ``<think>`` opened and never closed (``unclosed_think``); empty
            content beside a ``reasoning_content`` (``reasoning_only``); tool calls,
            structured or written as text (``tool_call``); an empty or mostly repeated
            summary (``empty`` / ``degenerate``).
    """
    if tool_calls:
        raise SummaryError("tool_call")
    text = content or ""
    if not text.strip() and (reasoning or "").strip():
        raise SummaryError("reasoning_only")
    close = text.find("</think>")
    open_ = text.find("<think>")
    if close >= 0 and (open_ < 0 or open_ > close):
        text = text[close + len("</think>") :]
    else:
        while True:
            m = _LEAD_THINK.match(text)
            if not m:
                break
            text = text[m.end() :]
    if text.lstrip().startswith("<think>"):
        raise SummaryError("unclosed_think")
    if _TOOL_MARKUP.search(text):
        raise SummaryError("tool_call")
    text = text.strip()
    if not text:
        raise SummaryError("empty")
    if is_degenerate(text):
        raise SummaryError("degenerate")
    cut = None
    limit = budget * 6
    if len(text) > limit:
        text = text[:limit].rstrip()
        cut = "safety_net"
    elif finish_reason == "length":
        cut = "length"
    if cut:
        text = f"{text} {CUT_MARK}"
    return Cleaned(text, cut)


def is_degenerate(text: str) -> bool:
    """Mostly repetition: a text of 200+ characters that zlib compresses below 15% of its
    size, or 4+ non-empty lines of which one line makes more than half."""
    raw = text.encode("utf-8")
    if len(raw) >= 200 and len(zlib.compress(raw, 9)) < 0.15 * len(raw):
        return True
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 4:
        _, count = Counter(lines).most_common(1)[0]
        if count * 2 > len(lines):
            return True
    return False
