"""The one runner of a service process (``python -m loki_<service>``): logging set up under
the service's name, the service started unless a signal comes first, served until SIGTERM or
SIGINT, then stopped within ``LOKI_STOP_TIMEOUT_S`` (the rules are :mod:`.lifecycle`'s).

A service's ``__main__`` is then one call::

    def main() -> None:
        settings = Settings()
        service_main.run_service("memory", settings, lambda: MemoryService(settings))

``build`` is called on the running event loop (a service may create tasks, clients and
brokers in its constructor). A service whose start-up is not "start, then wait for the
signal" (perf retries its start) passes its own coroutine to :func:`run`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn, Protocol

from . import lifecycle
from .logsetup import setup_logging
from .settings import LokiSettings


class Service(Protocol):
    """What :func:`serve` drives: one process's connections and handlers."""

    async def start(self) -> None:
        """Connect and begin serving (may wait for a peer; cancelled by a stop)."""

    async def stop(self, steps: lifecycle.Steps) -> None:
        """Stop serving and close every connection, each step bounded by ``steps``."""


async def serve(stop: lifecycle.Stop, service: Service) -> int:
    """Start ``service`` unless a stop is requested first, serve until one is, then stop it
    with what is left of the budget. The stop also runs when the start-up raised (nothing
    it opened, an engine above all, outlives the process); that exception is then raised.

    Returns:
        0, the exit status of a clean stop.
    """
    stop.install()
    try:
        if await stop.unless_stopped(service.start()):
            await stop.wait()
    finally:
        await service.stop(stop.steps())
    return 0


def run(
    name: str,
    settings: LokiSettings,
    main: Callable[[lifecycle.Stop], Awaitable[int | None]],
) -> NoReturn:
    """Set up logging as ``name`` (``LOKI_LOG_LEVEL``), run ``main(stop)`` with the stop
    budget ``LOKI_STOP_TIMEOUT_S`` (:func:`.lifecycle.run`) and exit with its status."""
    log = setup_logging(name, settings.log_level)
    sys.exit(lifecycle.run(main, settings.stop_timeout_s, log))


def run_service(name: str, settings: LokiSettings, build: Callable[[], Service]) -> NoReturn:
    """:func:`run` of :func:`serve` on the service ``build()`` makes (on the event loop)."""

    async def main(stop: lifecycle.Stop) -> int:
        return await serve(stop, build())

    run(name, settings, main)
