"""Logging set-up: one line per record on stderr, prefixed by the service name."""

from __future__ import annotations

import logging
import sys

#: FastStream's bookkeeping lines (one per message or per consumer task) that are DEBUG for
#: Loki even when FastStream logs them at INFO.
_CHATTER = ("Received", "Processed", "callback for ")


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    """Configure the root logger for ``service`` and return the service's logger.

    Records go to stderr as ``<time> <level> <service> <logger>: <message>``. Noisy
    third-party loggers (httpx, faststream's own access log) are lowered to WARNING; the
    brokers' per-message lines are DEBUG (see :func:`bus_logger`).

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
    handler.setLevel(numeric)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore", "faststream.access", "faststream.access.nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"loki.{service}")


class _BusChatter(logging.Filter):
    """Lowers FastStream's bookkeeping lines to DEBUG and names the subject in them; a broken
    connection is said in one line (its traceback tells nothing more: nats-py reconnects)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Connection broken with"):
            record.exc_info, record.exc_text = None, None
            return True
        if record.levelno <= logging.INFO and message.startswith(_CHATTER):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            subject = getattr(record, "subject", "")
            if subject:
                record.msg, record.args = f"{subject}: {message}", None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def bus_logger(name: str) -> logging.Logger:
    """The logger a service's FastStream broker writes to: ``loki.<name>.nats``, through the
    root handler. "Received" / "Processed" (one line each per message — four a second from
    the launcher's ``loki.engine.info`` polling alone) and the consumer-task lines are DEBUG,
    so ``LOKI_LOG_LEVEL=DEBUG`` shows them and INFO keeps Loki's own lines readable."""
    logger = logging.getLogger(f"loki.{name}.nats")
    if not any(isinstance(f, _BusChatter) for f in logger.filters):
        logger.addFilter(_BusChatter())
    return logger
