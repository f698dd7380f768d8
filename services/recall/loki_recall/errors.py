"""The recall service's errors (each maps to a reply ``error.type``)."""

from __future__ import annotations


class RecallError(Exception):
    """Base of the recall service's errors; ``type`` is the reply's ``error.type``."""

    type = "internal"


class MemoryLocked(RecallError):
    """The memory is encrypted and locked: a block cannot be sealed with the memory key."""

    type = "locked"


class UnknownTool(RecallError):
    """A ``loki.recall.tool`` request named a tool other than recall / recall_search."""

    type = "invalid_request"


class StoreUnavailable(RecallError):
    """Redis did not answer."""

    type = "unavailable"


class BadRequest(RecallError):
    """A request that is not valid JSON for its message model."""

    type = "invalid_request"
