"""``/api/recall``: read the archive (the recall service answers over NATS).

- ``GET /api/recall/block?seq=N`` → the block (200) or 404 when absent or unreadable while
  the memory is locked; a ``seq`` that is not decimal digits is a 400;
- ``GET /api/recall/blocks`` → ``{"blocks": [...]}``, every readable block in increasing seq
  (streamed page by page from ``loki.recall.blocks``); ``after=N`` starts after seq N;
  ``conversation=<id>`` / ``project=<id>`` keep only the blocks that conversation archived /
  of that project.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from loki_shared import subjects
from loki_shared.messages.recall import (
    BlockReply,
    BlockRequest,
    BlocksReply,
    BlocksRequest,
)

from ..bus import Bus
from ..deps import get_bus
from ..errors import BadRequest, NotFound
from .chat import CONV_PATTERN

router = APIRouter()


def _parse_seq(text: str, name: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise BadRequest(f"{name} must be a decimal integer", code="invalid_seq")
    return int(text)


@router.get("/api/recall/block")
async def recall_block(seq: str, bus: Bus = Depends(get_bus)) -> dict:
    n = _parse_seq(seq, "seq")
    reply = await bus.request_ok(subjects.RECALL_BLOCK, BlockRequest(seq=n), BlockReply)
    if reply.block is None:
        raise NotFound(f"no archived block r{n}", code="block_not_found")
    return reply.block.model_dump(mode="json")


@router.get("/api/recall/blocks")
async def recall_blocks(
    after: str = "0",
    conversation: Annotated[str | None, Query(pattern=CONV_PATTERN)] = None,
    project: Annotated[str | None, Query(pattern=CONV_PATTERN)] = None,
    bus: Bus = Depends(get_bus),
) -> StreamingResponse:
    conversation, project = conversation or None, project or None
    first = await bus.request_ok(
        subjects.RECALL_BLOCKS,
        BlocksRequest(after=_parse_seq(after, "after"), conversation=conversation, project=project),
        BlocksReply,
    )

    async def body() -> AsyncIterator[bytes]:
        page: BlocksReply | None = first
        sep = b""
        yield b'{"blocks":['
        while page is not None:
            for block in page.blocks:
                yield sep + block.model_dump_json().encode()
                sep = b","
            if page.next_after is None:
                break
            page = await bus.request_ok(
                subjects.RECALL_BLOCKS,
                BlocksRequest(after=page.next_after, conversation=conversation, project=project),
                BlocksReply,
            )
        yield b"]}"

    return StreamingResponse(body(), media_type="application/json")
