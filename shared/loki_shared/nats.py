"""NATS helpers shared by the services: the broker and the JetStream streams Loki declares."""

from __future__ import annotations

import logging

from faststream.nats import JStream, NatsBroker

from . import health, subjects
from .logsetup import bus_logger


def make_broker(url: str, name: str, health_check: health.Check | None = None) -> NatsBroker:
    """A FastStream NATS broker for service ``name`` that reconnects forever and answers the
    health subjects ``loki.health.<name>`` (see :mod:`loki_shared.health`; the compose
    healthchecks ask them). ``health_check``, when given, runs on each health request: a
    non-empty dict it returns (or an exception) makes the answer unhealthy.

    FastStream's per-message "Received" / "Processed" lines go to
    :func:`~loki_shared.logsetup.bus_logger` at DEBUG (shown with ``LOKI_LOG_LEVEL=DEBUG``);
    its warnings and errors keep their level.

    The connection is opened by ``broker.start()`` / ``FastStream(broker).run()``.
    """
    broker = NatsBroker(
        url,
        name=f"loki-{name}",
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        logger=bus_logger(name),
        log_level=logging.DEBUG,
    )
    health.attach(broker, name, check=health_check)
    return broker


def perf_stream() -> JStream:
    """The perf ring: ``loki.perf.record`` kept in JetStream, at most 5000 messages."""
    return JStream(
        name=subjects.STREAM_PERF,
        subjects=[subjects.PERF_RECORD],
        max_msgs=subjects.STREAM_PERF_MAX_MSGS,
    )


def events_stream() -> JStream:
    """Audit events (compactions, archives), kept in JetStream."""
    return JStream(
        name=subjects.STREAM_EVENTS,
        subjects=[subjects.EVENTS_COMPACTION, subjects.EVENTS_ARCHIVE],
        max_msgs=100_000,
    )
