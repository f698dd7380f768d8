"""Common base of every NATS message model and the error shape of replies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: Request kinds, used for slot routing, perf records and metric labels.
RequestKind = Literal[
    "main", "subagent", "verify", "task", "compact", "bench", "foreign", "prewarm"
]


class Msg(BaseModel):
    """Base of every message: unknown fields from a newer peer are ignored, not refused."""

    model_config = ConfigDict(extra="ignore")


#: The values of a reply's ``error.type``; :mod:`loki_shared.errors` has one exception class
#: per value (and the HTTP status the gateway answers with).
ErrorType = Literal[
    "invalid_request",
    "forbidden",
    "not_found",
    "conflict",
    "busy",
    "locked",
    "unavailable",
    "internal",
]


class ErrorInfo(Msg):
    """Why a request failed.

    ``type`` is a short machine name (:data:`ErrorType`, raised as the
    :mod:`loki_shared.errors` class of that name); ``message`` is for a person.
    """

    type: ErrorType
    message: str


class Reply(Msg):
    """Base of every reply: ``error`` is set instead of the payload when the request failed."""

    error: ErrorInfo | None = None
