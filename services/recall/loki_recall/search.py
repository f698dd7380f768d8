"""The indexed ``recall_search``: candidates from the indexes in score-bound order, each checked
with the exact rule on its text, until no unchecked candidate can enter the top ``limit``.

The indexes only narrow (see :mod:`loki_recall.index`): the answer is always the rule's
(:func:`loki_recall.tools.reference_search` on the blocks ``keep`` accepts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import numpy as np

from loki_shared.messages.recall import Block

from .index import Index
from .text import go_lower, score

Fetch = Callable[[list[int]], Awaitable[list[Block | None]]]


async def best_blocks(
    kws: set[str],
    limit: int,
    indexes: Iterable[Index | None],
    fetch: Fetch,
    keep: Callable[[Block], bool] = lambda block: True,
) -> list[Block]:
    """The ``limit`` best blocks for ``kws`` (score, then seq, descending) among those the
    ``indexes`` hold (None: skipped), ``fetch`` returns (None: absent or unreadable) and
    ``keep`` accepts.

    Raises:
        whatever ``fetch`` raises.
    """
    bounds, seqs = [], []
    for index in indexes:
        if index is None or not len(index):
            continue
        b, s = index.candidates(kws)
        bounds.append(b)
        seqs.append(s)
    if not bounds:
        return []
    bound = np.concatenate(bounds)
    seq = np.concatenate(seqs)
    order = np.lexsort((seq, bound))[::-1]
    hits: list[tuple[int, int, Block]] = []
    pos, total = 0, len(order)
    step = max(limit, 8)
    while pos < total:
        if len(hits) >= limit:
            worst = hits[limit - 1]
            nxt = order[pos]
            if (worst[0], worst[1]) > (int(bound[nxt]), int(seq[nxt])):
                break
        chunk = [int(seq[i]) for i in order[pos : pos + step]]
        pos += len(chunk)
        for block in await fetch(chunk):
            if block is None or not keep(block):
                continue
            points = score(kws, go_lower(block.label), go_lower(block.content))
            if points > 0:
                hits.append((points, block.seq, block))
        hits.sort(key=lambda t: (t[0], t[1]), reverse=True)
        del hits[limit:]
    return [b for _, _, b in hits]
