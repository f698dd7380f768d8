"""The last resort: shrink a conversation the engine still refuses.

Used reactively, when the engine still refuses after a compaction (or nothing could be
summarised): big tool results are cut to their excerpt and id (archived first), then the
oldest exchanges are dropped (their big parts archived first), until the estimate reaches a
target (:func:`~.decide.shrink_target`: 60% of the window corrected by the real size read in
the error). The last exchange always stays.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loki_shared.messages.chat import ChatMessage

from ..meter import estimate_tokens
from .rules import BIG_BLOCK_CHARS, excerpt, text_of

#: ``await archive(message, text)``: archive one block of ``message``; its id or None.
ArchiveFn = Callable[[ChatMessage, str], Awaitable[str | None]]


async def shrink(
    messages: list[ChatMessage], system: str, target: float, archive: ArchiveFn
) -> tuple[list[ChatMessage], list[str]]:
    """Last resort: bring the estimate of ``[system, *messages]`` to ``target`` tokens.

    First big tool results (oldest first) are archived and cut to their excerpt and id;
    then the oldest exchanges (from one user message to the next) are dropped, their big
    parts archived first; the last exchange always stays. Returns the new view and the ids
    archived.
    """
    out = list(messages)
    archived: list[str] = []

    def size() -> int:
        return estimate_tokens({"role": "system", "content": system}) + sum(
            estimate_tokens(m) for m in out
        )

    for i, message in enumerate(out):
        if size() <= target:
            break
        text = text_of(message)
        if message.role == "tool" and len(text) >= BIG_BLOCK_CHARS:
            block = await archive(message, text)
            if block:
                archived.append(block)
            out[i] = message.model_copy(update={"content": excerpt(text, block)})
    while size() > target:
        starts = [
            i
            for i, m in enumerate(out)
            if m.role == "user" and i > 0 and not (m.loki and m.loki.injected in ("budget", "act"))
        ]
        if not starts:
            break
        cut = starts[0]
        for message in out[:cut]:
            text = text_of(message)
            if len(text) >= BIG_BLOCK_CHARS and "(archived verbatim as recall:" not in text:
                block = await archive(message, text)
                if block:
                    archived.append(block)
        out = out[cut:]
    return out, archived
