"""The path that always reduces: archive, then drop the oldest exchanges.

Used reactively, when the engine still refuses after a compaction (or nothing could be
summarised), and at any trigger when a summary failed (or would repeat one that failed) and
the fallback leaves the context above the threshold (issue 26): big tool results are cut to
their excerpt and id (archived first), then the oldest exchanges are dropped — every part of
them archived verbatim first (message texts, tool-call arguments; not Loki's reminders, nor a
text that is already an excerpt of an archived block), so ``recall`` still has all of it —
until the estimate reaches a target (:func:`~.decide.shrink_target`: 60% of the window,
corrected by the real size read in an overflow error). The last exchange always stays.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loki_shared.messages.chat import ChatMessage

from ..meter import estimate_tokens
from .rules import ARCHIVED_QUIET, BIG_BLOCK_CHARS, REMINDER_KINDS, excerpt, text_of

#: ``await archive(role, text, tool_name)``: archive one block verbatim; its id or None.
ArchiveFn = Callable[[str, str, str | None], Awaitable[str | None]]

#: What an excerpt of an archived block says (such a text is not archived again).
ARCHIVED_MARK = "(archived verbatim as recall:"


async def archive_dropped(message: ChatMessage, archive: ArchiveFn) -> list[str]:
    """Archive every part of ``message`` before it is dropped: its text (a tool result under
    its tool's name) and each tool call's arguments (under the function's name). Loki's
    reminders and excerpts of blocks already archived are skipped. Returns the ids."""
    if message.loki and message.loki.injected in REMINDER_KINDS:
        return []
    ids: list[str] = []
    text = text_of(message)
    if text.strip() and ARCHIVED_MARK not in text and not text.endswith(ARCHIVED_QUIET):
        tool_name = message.name if message.role == "tool" else None
        block = await archive(message.role, text, tool_name)
        if block:
            ids.append(block)
    for call in message.tool_calls or []:
        args = call.function.arguments
        already = "recall:" in args or args.startswith('{"archived": "verbatim"')
        if args.strip() and args.strip() != "{}" and not already:
            block = await archive("assistant", args, call.function.name)
            if block:
                ids.append(block)
    return ids


#: ``size(messages)``: tokens of the prompt with this model view (system included).
SizeFn = Callable[[list[ChatMessage]], int]


def estimate_view(system: str, messages: list[ChatMessage]) -> int:
    """The estimate (tokens) of the model view ``messages`` behind the ``system`` prompt."""
    return estimate_tokens({"role": "system", "content": system}) + sum(
        estimate_tokens(m) for m in messages
    )


async def shrink(
    messages: list[ChatMessage],
    size_of: SizeFn,
    target: float,
    archive: ArchiveFn,
    cite: bool = True,
) -> tuple[list[ChatMessage], list[str]]:
    """Last resort: bring ``size_of`` the model view (the engine's counts when known, else
    estimates; system prompt included) to ``target`` tokens.

    First big tool results (oldest first) are archived and cut to their excerpt and id;
    then the oldest exchanges (from one user message to the next) are dropped, every part
    archived verbatim first (:func:`archive_dropped`); the last exchange always stays.
    ``cite`` False (:func:`~.rules.cites_ids`): the excerpts name no recall id.
    Returns the new view and the ids archived.
    """
    out = list(messages)
    archived: list[str] = []

    def size() -> int:
        return size_of(out)

    for i, message in enumerate(out):
        if size() <= target:
            break
        text = text_of(message)
        if message.role == "tool" and len(text) >= BIG_BLOCK_CHARS:
            block = await archive(message.role, text, message.name)
            if block:  # a block that could not be archived is never cut
                archived.append(block)
                out[i] = message.model_copy(update={"content": excerpt(text, block, cite)})
    while size() > target:
        starts = [
            i
            for i, m in enumerate(out)
            if m.role == "user" and i > 0 and not (m.loki and m.loki.injected in REMINDER_KINDS)
        ]
        if not starts:
            break
        cut = starts[0]
        for message in out[:cut]:
            archived += await archive_dropped(message, archive)
        out = out[cut:]
    return out, archived
