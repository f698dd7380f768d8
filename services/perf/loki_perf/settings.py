"""Settings of the perf service (environment, ``LOKI_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from loki_shared.settings import LokiSettings


class Settings(LokiSettings):
    """The perf service's configuration, beyond :class:`LokiSettings`:

    - ``LOKI_PERF_METRICS_HOST`` — address ``/metrics`` listens on (default ``127.0.0.1``; the
      compose file sets ``0.0.0.0`` so Prometheus can scrape it).
    - ``LOKI_PERF_METRICS_PORT`` — port of ``/metrics`` (default 9464; 0 disables it).
    - ``LOKI_PERF_LOG`` — when set to anything non-empty, one ``[perf]`` line per completion
      on stderr.
    - ``LOKI_PERF_LOSS_MIN_TOKENS`` — a strict extension losing at most this many tokens is
      not flagged (default 8: the last generated token never enters the slot and a reply may
      re-tokenise slightly differently when sent back).
    - ``LOKI_PERF_CHECKPOINT_S`` — seconds between metrics checkpoints (default 5).
    """

    perf_metrics_host: str = Field(default="127.0.0.1")
    perf_metrics_port: int = Field(default=9464, ge=0, le=65535)
    perf_log: str | None = Field(default=None)
    perf_loss_min_tokens: int = Field(default=8, ge=0)
    perf_checkpoint_s: float = Field(default=5.0, gt=0)
