"""Messages of the recall service (``loki.recall.*``).

Error replies (``error.type``): ``locked`` (archive refused: the memory is encrypted and
locked, so the block could not be sealed with the memory key), ``not_found`` (archive refused:
its conversation or project was deleted), ``invalid_request`` (unknown tool name),
``unavailable`` (Redis not reachable), ``internal``. The tool texts themselves are
never errors: a bad argument gives an ``[error] ...`` text the model reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Msg, Reply

#: The project of every conversation until projects exist (and of a block archived without
#: one).
DEFAULT_PROJECT = "default"


class RecallScope(Msg):
    """The blocks a caller may see: those of ``project`` (a block archived without a project
    belongs to :data:`DEFAULT_PROJECT`). The chat service sends the conversation's project;
    until projects exist that is the default project for every conversation."""

    project: str = DEFAULT_PROJECT


class ArchiveRequest(Msg):
    """``loki.recall.archive``: store ``content`` verbatim (empty allowed). ``label`` is built
    by the caller with :func:`loki_shared.recall_label.recall_label`; an empty label is built
    by the recall service with the same rule."""

    label: str
    role: str
    tool_name: str | None = None
    content: str
    conversation: str | None = None
    project: str | None = None


class ArchiveReply(Reply):
    """The block's id ``"r<seq>"`` and its global sequence number (from 1, never reused)."""

    id: str = ""
    seq: int = 0


class ToolRequest(Msg):
    """``loki.recall.tool``: ``name`` is ``recall`` or ``recall_search``; ``arguments`` is the
    decoded JSON object the model sent (any JSON value is accepted and checked by the tool).

    ``scope``: the blocks the tool sees (a block outside it is "no archived block"); None
    (tests, admin): the whole archive."""

    name: str
    arguments: Any = None
    scope: RecallScope | None = None


class ToolReply(Reply):
    """The tool result text exactly as the model sees it."""

    text: str = ""


class Block(Msg):
    """An archived block. ``created`` is a Unix time in seconds; ``project`` None is the
    default project."""

    seq: int
    id: str
    label: str
    role: str
    tool_name: str | None = None
    content: str
    created: float
    conversation: str | None = None
    project: str | None = None


class BlockRequest(Msg):
    """``loki.recall.block``."""

    seq: int


class BlockReply(Reply):
    """``block`` is None when absent or unreadable while the memory is locked."""

    block: Block | None = None


class BlocksRequest(Msg):
    """``loki.recall.blocks``: readable blocks with ``seq > after``, in increasing seq, one
    page of at most about ``max_bytes`` of JSON (at least one block; NATS payloads are
    limited to 1 MiB by default). ``conversation`` / ``project``: only the blocks archived by
    that conversation / of that project (both: both hold)."""

    after: int = 0
    max_bytes: int = 512_000
    conversation: str | None = None
    project: str | None = None


class BlocksReply(Reply):
    """One page of readable blocks, in increasing seq. ``next_after`` is the ``after`` of the
    next page, or None when this page ends the list (every readable block is then listed)."""

    blocks: list[Block] = Field(default_factory=list)
    next_after: int | None = None


class PurgeRequest(Msg):
    """``loki.recall.purge``: delete every block of ``conversation`` or of ``project``
    (exactly one is set) — content and index entries; their seqs are never given out again.
    The deletion is recorded first (see :mod:`loki_shared.recall_purge`), so a purge the
    recall service could not apply at once is applied when it next runs."""

    conversation: str | None = None
    project: str | None = None


class PurgeReply(Reply):
    """The seqs deleted by this request (those deleted before are not listed again)."""

    seqs: list[int] = Field(default_factory=list)
