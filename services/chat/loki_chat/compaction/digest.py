"""COMPACT_TAIL_REUSE's fallback: an index of the archived torso in place of a failed summary.

When a summary fails (continuation, its retry and the transcript path all degenerate, empty
or refused), the fallback with the key off puts the torso back, stripped of its big blocks,
*before* the tail: the prompt then differs from the slot's right after the first stripped
block, so llama-server recomputes everything after it — the tail included — and a prewarm
has that much to compute. With the key on the tail must keep its place after *every*
compaction, so the failed summary's place is taken by this index, sent after the tail like a
summary (:mod:`.layout`) and never longer than a summary could have been
(:func:`~.rules.budget_tokens` of the window):

- the newest torso messages, one line each, ``[<role>]: <text>`` (:func:`~.summariser.head_of`);
  a text longer than :data:`LINE_CHARS` is cut there and names its recall id;
- the older ones, when the lines would pass the budget, as one line listing their ids;
- every part that is cut or left out is archived verbatim first (big blocks already were);
  when an archive request fails nothing is installed (the caller falls back as with the key
  off: nothing is lost);
- Loki's reminders and PROJ_SNAPSHOT's update blocks are left out (Loki writes them again).

What it costs: the model sees the start of each earlier message and must ``recall`` the rest
(a summary, when it passes, keeps more). The key is off by default (docs/behaviour.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from loki_shared.messages.chat import ChatMessage

from ..meter import estimate_tokens
from ..project.snapshot import is_update
from .rules import is_reminder, text_of
from .shrink import ArchiveFn
from .summariser import head_of

#: A digest line's text is cut after this many characters (the rest: recall).
LINE_CHARS = 240
#: Ids listed by name in the line of older messages; more are counted.
LISTED_IDS = 24
#: The index's first line (under the summary header, which says it was written by Loki).
INTRO = "Summarising these messages failed; an index of them (each archived verbatim):"
INTRO_NO_TOOLS = "Summarising these messages failed; an index of them (each archived):"


@dataclass
class _Part:
    """One part of a torso message: its line head, text, role and tool name for the archive,
    and its recall id when it is a big block archived already."""

    head: str
    text: str
    role: str
    tool_name: str | None
    block: str | None


def _parts(torso: list[ChatMessage], ids: dict[tuple[int, str], str | None]) -> list[_Part]:
    parts: list[_Part] = []
    for i, message in enumerate(torso):
        if is_update(message) or is_reminder(message):
            continue
        text = text_of(message)
        if text.strip():
            name = message.name if message.role == "tool" else None
            parts.append(_Part(head_of(message), text, message.role, name, ids.get((i, text))))
        for call in message.tool_calls or []:
            args = call.function.arguments
            if args.strip() and args.strip() != "{}":
                head = f"[assistant calls {call.function.name}]"
                block = ids.get((i, args))
                parts.append(_Part(head, args, "assistant", call.function.name, block))
    return parts


async def digest(
    torso: list[ChatMessage],
    ids: dict[tuple[int, str], str | None],
    budget: int,
    archive: ArchiveFn,
    cite: bool = True,
) -> tuple[str, list[str]] | None:
    """The index of ``torso`` (the compaction's torso as it was, before any strip).

    Args:
        torso: the messages a failed summary should have covered.
        ids: the big parts archived already, ``(torso index, text) -> id`` (None: failed).
        budget: at most this many tokens for the whole index (the meter's estimate,
            :func:`~loki_chat.meter.estimate_tokens`).
        archive: ``await archive(role, text, tool_name)`` → the block's id, or None.
        cite: False when the model cannot call ``recall`` (:func:`~.rules.cites_ids`): no id
            is named, only that the text was archived.

    Returns:
        ``(text, archived)``: the index text (its intro first) and the ids it archived; None
        when an archive request failed or a big block was never archived (nothing may be
        left out that recall cannot give back).
    """
    archived: list[str] = []

    async def block_of(part: _Part) -> str | None:
        if part.block:
            return part.block
        block = await archive(part.role, part.text, part.tool_name)
        if block:
            archived.append(block)
        return block

    def mark(block: str) -> str:
        return f"recall:{block}" if cite else "archived verbatim"

    parts = _parts(torso, ids)
    intro = INTRO if cite else INTRO_NO_TOOLS
    left = budget - estimate_tokens(intro) - 2
    lines: list[str] = []
    older = len(parts)
    for part in reversed(parts):
        if len(part.text) <= LINE_CHARS:
            line = f"{part.head}: {part.text}"
        else:
            block = await block_of(part)
            if block is None:
                return None
            line = f"{part.head}: {part.text[:LINE_CHARS]} […] ({mark(block)})"
        # room kept for the line that lists the older messages (when there are some)
        reserve = 0 if older == 1 else 12 + 4 * min(older - 1, LISTED_IDS)
        if estimate_tokens(line) + 1 + reserve > left:
            break
        left -= estimate_tokens(line) + 1
        lines.append(line)
        older -= 1
    earlier = parts[:older]
    if earlier:
        blocks: list[str] = []
        for part in earlier:
            block = await block_of(part)
            if block is None:
                return None
            if block not in blocks:
                blocks.append(block)
        if cite:
            named = ", ".join(f"recall:{b}" for b in blocks[:LISTED_IDS])
            more = len(blocks) - LISTED_IDS
            rest = f" and {more} more (recall_search finds them)" if more > 0 else ""
            lines.append(f"[{len(earlier)} earlier messages, archived verbatim: {named}{rest}]")
        else:
            lines.append(f"[{len(earlier)} earlier messages, archived verbatim]")
    return "\n\n".join([intro, *reversed(lines)]), archived
