"""Messages of the recall service (``loki.recall.*``).

Error replies (``error.type``): ``locked`` (archive refused: the memory is encrypted and
locked, so the block could not be sealed with the memory key), ``invalid_request`` (unknown
tool name), ``unavailable`` (Redis not reachable), ``internal``. The tool texts themselves are
never errors: a bad argument gives an ``[error] ...`` text the model reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Msg, Reply


class ArchiveRequest(Msg):
    """``loki.recall.archive``: store ``content`` verbatim (empty allowed). ``label`` is built
    by the caller with :func:`loki_shared.recall_label.recall_label`; an empty label is built
    by the recall service with the same rule."""

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
    """``loki.recall.blocks``: readable blocks with ``seq > after``, in increasing seq, one
    page of at most about ``max_bytes`` of JSON (at least one block; NATS payloads are
    limited to 1 MiB by default)."""

    after: int = 0
    max_bytes: int = 512_000


class BlocksReply(Reply):
    """One page of readable blocks, in increasing seq. ``next_after`` is the ``after`` of the
    next page, or None when this page ends the list (every readable block is then listed)."""

    blocks: list[Block] = Field(default_factory=list)
    next_after: int | None = None
