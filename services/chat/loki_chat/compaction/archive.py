"""Archiving big blocks verbatim before they are summarised (``loki.recall.archive``).

Each block is archived with its label (:func:`loki_shared.recall_label.recall_label`), role,
tool name and conversation; the recall service answers its id (``r<seq>``). Recall
unreachable or refusing: no id (logged), and the compaction goes on without ids — nothing is
lost, the block then stays whole wherever it would have been cut.
"""

from __future__ import annotations

import logging

from loki_shared import subjects
from loki_shared.messages.recall import ArchiveReply, ArchiveRequest
from loki_shared.recall_label import recall_label

from ..bus import ChatBus
from .rules import BigPart

log = logging.getLogger("loki.chat.compaction")

#: Big part → its recall id (None: not archived), keyed by (torso index, text).
BlockIds = dict[tuple[int, str], str | None]


class Archiver:
    """Archives blocks through the recall service.

    Args:
        bus: the NATS bus.
        timeout_s: bound of one archive request (``LOKI_RECALL_TIMEOUT_S``).
    """

    def __init__(self, bus: ChatBus, timeout_s: float) -> None:
        self.bus = bus
        self.timeout_s = timeout_s

    async def archive(
        self, conversation: str, role: str, text: str, tool_name: str | None
    ) -> str | None:
        """Archive one block; its recall id, or None when it could not be archived."""
        req = ArchiveRequest(
            label=recall_label(role, text, tool_name),
            role=role,
            tool_name=tool_name,
            content=text,
            conversation=conversation,
        )
        try:
            reply = await self.bus.request(
                subjects.RECALL_ARCHIVE, req, ArchiveReply, self.timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - recall unreachable: summarise without ids
            log.warning(
                "[compact] archive failed (%s); summarising without archiving", type(exc).__name__
            )
            return None
        if reply.error is not None or not reply.id:
            log.warning("[compact] archive refused: %s", reply.error)
            return None
        return reply.id

    async def archive_parts(
        self, conversation: str, parts: list[BigPart]
    ) -> tuple[BlockIds, list[str]]:
        """Archive ``parts`` in order (each gets its ``id``); after the first failure the
        rest are not tried (recall is unreachable). Returns the ids by (index, text) and the
        ids archived, in order."""
        ids: BlockIds = {}
        archived: list[str] = []
        reachable = True
        for part in parts:
            block_id = None
            if reachable:
                block_id = await self.archive(conversation, part.role, part.text, part.tool_name)
                reachable = block_id is not None
            part.id = block_id
            ids[(part.index, part.text)] = block_id
            if block_id:
                archived.append(block_id)
        return ids, archived
