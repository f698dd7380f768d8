"""Messages of the perf service (``loki.perf.*``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Msg, Reply, RequestKind


class PerfRecord(Msg):
    """One completion, published on ``loki.perf.record`` (JetStream) by whoever ran it.

    ``timings`` and ``usage`` are the final chunk's objects as llama-server (or an external
    API) sent them, undecoded: the perf service decodes them tolerantly. Times the client
    measured are in milliseconds (``ttft_ms``: first delta of any type). ``fingerprints[i]``
    is the cumulative hash of the messages sent up to ``i`` (see
    :func:`loki_shared.fingerprint.fingerprints`). No message text ever goes here.
    """

    ts: float
    conversation: str | None = None
    kind: RequestKind
    model: str = ""
    preset: str = "local"  # "local" or "external"
    slot: int | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str | None = None
    cut: bool = False
    fingerprints: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)


class SummaryRequest(Msg):
    """``loki.perf.summary``."""


class PerfSummary(Reply):
    """Aggregates over the ring: at least the count of completions and the sums of
    ``prompt_n`` and ``cache_n`` (unknown values are not counted as 0); ``detail`` holds the
    rest (hit rate, per-kind figures, speeds by depth, losses by cause)."""

    completions: int = 0
    prompt_n: int = 0
    cache_n: int = 0
    detail: dict[str, Any] = Field(default_factory=dict)


class LossesRequest(Msg):
    """``loki.perf.losses``."""

    limit: int = 100


class LossesReply(Reply):
    losses: list[dict[str, Any]] = Field(default_factory=list)
