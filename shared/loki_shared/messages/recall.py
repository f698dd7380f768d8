"""Messages of the recall service (``loki.recall.*``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Msg, Reply


class ArchiveRequest(Msg):
    """``loki.recall.archive``: store ``content`` verbatim (empty allowed)."""

    label: str
    role: str
    tool_name: str | None = None
    content: str
    conversation: str | None = None


class ArchiveReply(Reply):
    """The block's id ``"r<seq>"`` and its global sequence number (from 1, never reused)."""

    id: str = ""
    seq: int = 0


class ToolRequest(Msg):
    """``loki.recall.tool``: ``name`` is ``recall`` or ``recall_search``; ``arguments`` is the
    decoded JSON object the model sent (any JSON value is accepted and checked by the tool)."""

    name: str
    arguments: Any = None


class ToolReply(Reply):
    """The tool result text exactly as the model sees it."""

    text: str = ""


class Block(Msg):
    """An archived block. ``created`` is a Unix time in seconds."""

    seq: int
    id: str
    label: str
    role: str
    tool_name: str | None = None
    content: str
    created: float
    conversation: str | None = None


class BlockRequest(Msg):
    """``loki.recall.block``."""

    seq: int


class BlockReply(Reply):
    """``block`` is None when absent or unreadable while the memory is locked."""

    block: Block | None = None


class BlocksRequest(Msg):
    """``loki.recall.blocks``."""


class BlocksReply(Reply):
    """Every readable block, in increasing seq."""

    blocks: list[Block] = Field(default_factory=list)
