"""``python -m loki_perf``: run the perf service until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import nats.errors

from loki_shared.logsetup import setup_logging

from .errors import MetricsPortInUse, PerfError
from .service import PerfService
from .settings import Settings


async def run(settings: Settings) -> int:
    """Run one :class:`PerfService` until a termination signal; return the exit status.

    NATS not reachable yet (a stack starting) is retried every second until a signal; a
    metrics port in use is fatal (exit status 1).
    """
    log = setup_logging("perf", settings.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while True:
        service = PerfService(settings, log)
        try:
            await service.start()
            break
        except MetricsPortInUse as exc:
            log.error("perf service cannot start: %s", exc)
            await service.stop()
            return 1
        except (PerfError, OSError, nats.errors.Error) as exc:
            log.warning("perf service not started yet (%s); retrying", exc)
            with contextlib.suppress(Exception):
                await service.stop()
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
            return 0
        except TimeoutError:
            continue
    await stop.wait()
    log.info("perf service stopping")
    await service.stop()
    return 0


def main() -> None:
    settings = Settings()
    sys.exit(asyncio.run(run(settings)))


if __name__ == "__main__":
    main()
