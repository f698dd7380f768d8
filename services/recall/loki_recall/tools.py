"""The ``recall`` and ``recall_search`` tools: argument checks and the exact result texts.

The archive is reached through a :class:`Reader`; these functions own only the rules and the
texts the model sees. :func:`reference_search` is the plain full scan the rules describe (the
specification the indexed search in :mod:`loki_recall.archive` must always agree with).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from loki_shared.messages.recall import Block

from .text import excerpt, go_lower, go_trim, keywords, parse_id, parse_limit, quote_id, score

RECALL = "recall"
RECALL_SEARCH = "recall_search"
TOOL_NAMES = (RECALL, RECALL_SEARCH)

ERR_RECALL_ID = '[error] recall needs an id such as "r7"'
ERR_SEARCH_QUERY = "[error] recall_search needs a query"
NO_MATCH = "[no archived block matches]"
HITS_HEADER = "Archived blocks (bring one back with recall(id)):"


class Reader(Protocol):
    """What the tools read: readable blocks only (absent and locked look the same)."""

    async def get(self, seq: int) -> Block | None: ...

    async def search(self, kws: set[str], limit: int) -> list[Block]: ...


def not_found_text(raw_id: str) -> str:
    """Text for an id that names no readable block; ``raw_id`` is the id as received."""
    return (
        f"[error] no archived block {quote_id(raw_id)} — check the id, or find it with "
        "recall_search"
    )


def found_text(block: Block) -> str:
    """``[r<seq> · <label> · verbatim]``, a newline, then the content exactly."""
    return f"[r{block.seq} \u00b7 {block.label} \u00b7 verbatim]\n{block.content}"


def hits_text(hits: Iterable[Block]) -> str:
    """The search result text: header, then per hit ``- r<seq> · <label>`` and two spaces
    plus the excerpt; joined with ``\\n``; :data:`NO_MATCH` when there is no hit."""
    lines = [HITS_HEADER]
    for block in hits:
        lines.append(f"- r{block.seq} \u00b7 {block.label}")
        lines.append("  " + excerpt(block.content))
    return NO_MATCH if len(lines) == 1 else "\n".join(lines)


def _arg(arguments: Any, key: str) -> Any:
    return arguments.get(key) if isinstance(arguments, dict) else None


async def recall(arguments: Any, reader: Reader) -> str:
    """``recall(id)``: the block's text, or one of the two error texts.

    A malformed id (see :func:`loki_recall.text.parse_id`) and 0 never read the archive.
    """
    raw = _arg(arguments, "id")
    if not isinstance(raw, str) or not go_trim(raw):
        return ERR_RECALL_ID
    seq = parse_id(raw)
    if not seq:
        return not_found_text(raw)
    block = await reader.get(seq)
    return not_found_text(raw) if block is None else found_text(block)


async def recall_search(arguments: Any, reader: Reader) -> str:
    """``recall_search(query, limit?)``: the hits text, :data:`NO_MATCH` or the query error."""
    query = _arg(arguments, "query")
    if not isinstance(query, str) or not go_trim(query):
        return ERR_SEARCH_QUERY
    kws = keywords(query)
    if not kws:
        return NO_MATCH
    limit = parse_limit(_arg(arguments, "limit"))
    return hits_text(await reader.search(kws, limit))


def reference_search(blocks: Iterable[Block], kws: set[str], limit: int) -> list[Block]:
    """The rule itself, by a full scan: score every block, drop zeros, sort by score then
    seq (both descending), keep ``limit``."""
    scored = []
    for block in blocks:
        s = score(kws, go_lower(block.label), go_lower(block.content))
        if s > 0:
            scored.append((s, block.seq, block))
    scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [b for _, _, b in scored[:limit]]


class ListReader:
    """A :class:`Reader` over a list of blocks in memory, by full scan (tests, baseline)."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self.blocks = {b.seq: b for b in blocks}

    async def get(self, seq: int) -> Block | None:
        return self.blocks.get(seq)

    async def search(self, kws: set[str], limit: int) -> list[Block]:
        return reference_search(self.blocks.values(), kws, limit)
