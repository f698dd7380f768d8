"""Loki's perf service: the ring of the last 5000 completion records (JetStream ``LOKI_PERF``),
prompt-cache loss analysis, summaries over NATS and Prometheus metrics on ``/metrics``.

Modules: :mod:`.decode` (tolerant record decoding), :mod:`.ring` (ring, losses, summary,
CACHE_RAM advice), :mod:`.metrics` (restart-safe Prometheus collector), :mod:`.service`
(NATS wiring), :mod:`.settings`, :mod:`.errors`.
"""

__version__ = "0.1.0"
