"""COMPACT_TAIL_REUSE (``LOKI_COMPACT_TAIL_REUSE``, off by default): the order a compacted
conversation is sent in.

The stored model view stays chronological — the summary message first, then the verbatim
tail — so the next compaction's torso, its transcript and its archive see the old summary
first, as before. With the key on, a summary installed by a compaction carries
``loki.sent_after = k``: when sent, it goes after the ``k`` messages that follow it (the
tail as it was when compacted, less its trailing user messages). The tail then keeps its
bytes and its place right after the system prompt — llama-server's ``--cache-reuse`` shifts
its cached KV instead of computing it again — and the summary follows it, joined by
:func:`~loki_chat.request.wire_messages` to the next user message (never two user messages
in a row), under a header saying it covers what came *before* the messages above it.

Not applied (the summary goes first, as with the key off): on an external API (its cache is
not llama.cpp's; logged once by the caller), to a template the probe says refuses two user
messages in a row (``strict_alternation``: such templates also want the conversation to open
with a user message), or when the key is off. A summary without the mark (compacted with the
key off) is always sent first.
"""

from __future__ import annotations

import logging

from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease, TemplateProbe

from .decide import SUMMARY_HEADER, SUMMARY_HEADER_NO_TOOLS
from .rules import SUMMARY_KIND

#: The header of a summary sent after the tail (it covers what came before the messages above).
TAIL_FIRST_HEADER = (
    "[Summary of the conversation before the messages above, written by Loki when it was "
    "compacted. Archived blocks come back verbatim with recall(id).]\n"
)
#: The same for a model whose template drops ``tools`` (it cannot call ``recall``).
TAIL_FIRST_HEADER_NO_TOOLS = (
    "[Summary of the conversation before the messages above, written by Loki when it was "
    "compacted.]\n"
)


def applies(enabled: bool, external: bool, template: TemplateProbe | None) -> bool:
    """Whether the tail-first order is used for a request: the key is on, the engine is the
    local llama-server, and its template does not refuse two user messages in a row."""
    strict = template is not None and template.strict_alternation is True
    return enabled and not external and not strict


_logged_external = False


def for_lease(enabled: bool, lease: Lease) -> bool:
    """:func:`applies` for a request sent under ``lease``; on an external API with the key on,
    says once (per process) in the log that the key has no effect there."""
    global _logged_external
    if enabled and lease.external and not _logged_external:
        _logged_external = True
        logging.getLogger("loki.chat.compaction").info(
            "[compact] COMPACT_TAIL_REUSE has no effect on an external API: summaries are "
            "sent first there"
        )
    return applies(enabled, lease.external, lease.template)


def summary_after(message: ChatMessage) -> int | None:
    """The mark of a summary installed with the key on (messages it is sent after), or None
    (not a summary, or installed with the key off)."""
    if message.loki is None or message.loki.injected != SUMMARY_KIND:
        return None
    return message.loki.sent_after


def reheaded(summary: ChatMessage) -> ChatMessage:
    """The summary message as sent after the tail: its header says it covers what came before
    the messages above (a text that does not start with a known header is left as is)."""
    text = summary.content
    if not isinstance(text, str):
        return summary
    for old, new in (
        (SUMMARY_HEADER, TAIL_FIRST_HEADER),
        (SUMMARY_HEADER_NO_TOOLS, TAIL_FIRST_HEADER_NO_TOOLS),
    ):
        if text.startswith(old):
            return summary.model_copy(update={"content": new + text[len(old) :]})
    return summary


def order(messages: list[ChatMessage], tail_first: bool) -> list[int]:
    """Indices of ``messages`` (the stored model view) in the order they are sent: the
    identity unless ``tail_first`` and ``messages[0]`` is a marked summary; then the ``k``
    messages after it (fewer when the view is shorter), the summary, the rest."""
    n = len(messages)
    after = summary_after(messages[0]) if tail_first and messages else None
    if after is None:
        return list(range(n))
    k = max(0, min(after, n - 1))
    return [*range(1, 1 + k), 0, *range(1 + k, n)]


def laid_out(messages: list[ChatMessage], tail_first: bool) -> list[ChatMessage]:
    """The model view in its send order (:func:`order`), the moved summary re-headed
    (:func:`reheaded`). The same list when nothing moves."""
    idx = order(messages, tail_first)
    if idx == list(range(len(messages))):
        return messages
    return [reheaded(messages[i]) if i == 0 else messages[i] for i in idx]


def wire_number(messages: list[ChatMessage], tail_first: bool, index: int) -> int:
    """The 1-based number, among the sent messages after the system message, of the message
    that carries stored message ``index`` (consecutive user messages are sent as one,
    :func:`~loki_chat.request.wire_messages`)."""
    number = 0
    prev: str | None = None
    for i in order(messages, tail_first):
        role = messages[i].role
        if not (role == "user" and prev == "user"):
            number += 1
        prev = role
        if i == index:
            return number
    return number + 1
