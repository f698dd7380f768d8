"""Logging set-up: one line per record on stderr, prefixed by the service name."""

from __future__ import annotations

import logging
import sys


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    """Configure the root logger for ``service`` and return the service's logger.

    Records go to stderr as ``<time> <level> <service> <logger>: <message>``. Noisy
    third-party loggers (httpx, faststream's per-message access log) are lowered to WARNING.

    Raises:
        ValueError: ``level`` is not a logging level name.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore", "faststream.access", "faststream.access.nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"loki.{service}")
