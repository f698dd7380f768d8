"""The perf service's errors."""

from __future__ import annotations


class PerfError(Exception):
    """Base of the perf service's errors."""


class StreamUnavailable(PerfError):
    """The ``LOKI_PERF`` JetStream stream cannot be created or read."""


class CheckpointError(PerfError):
    """The metrics checkpoint in the key-value bucket cannot be read or written."""


class MetricsPortInUse(PerfError):
    """``LOKI_PERF_METRICS_PORT`` is taken by another process."""
