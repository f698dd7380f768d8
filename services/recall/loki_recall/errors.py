"""The recall service's errors, in :mod:`loki_shared.errors`' tree: each class says the reply's
``error.type``; a handler raises them and the broker's exception middleware answers
(:func:`loki_shared.errors.exception_middleware`)."""

from __future__ import annotations

from loki_shared import errors


class RecallError(errors.LokiError):
    """Base of the recall service's errors (``internal`` unless the class says otherwise)."""


class MemoryLocked(errors.Locked, RecallError):
    """The memory is encrypted and locked: a block cannot be sealed with the memory key."""


class UnknownTool(errors.InvalidRequest, RecallError):
    """A ``loki.recall.tool`` request named a tool other than recall / recall_search."""


class StoreUnavailable(errors.Unavailable, RecallError):
    """Redis did not answer."""


class BadRequest(errors.InvalidRequest, RecallError):
    """A request its message model takes but the service refuses (a purge naming both a
    conversation and a project, or neither); one not valid for its model is refused by
    :func:`loki_shared.serve.decode`."""


class Deleted(errors.NotFound, RecallError):
    """An archive for a conversation or project that was deleted (a compaction in flight)."""
