"""The archived blocks of a conversation or project, read from the recall service over NATS
(for the conversation export; the ``/api/recall`` routes stream theirs page by page)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from loki_shared import subjects
from loki_shared.messages.recall import Block, BlocksReply, BlocksRequest

from .bus import Bus


async def archived_blocks(
    bus: Bus, conversation: str | None = None, project: str | None = None
) -> AsyncIterator[Block]:
    """Every readable block archived by ``conversation`` / of ``project`` (None: any), in
    increasing seq, page by page from ``loki.recall.blocks``.

    Raises:
        GatewayError: the recall service did not answer or answered an error.
    """
    after: int | None = 0
    while after is not None:
        page = await bus.request_ok(
            subjects.RECALL_BLOCKS,
            BlocksRequest(after=after, conversation=conversation, project=project),
            BlocksReply,
        )
        for block in page.blocks:
            yield block
        after = page.next_after
