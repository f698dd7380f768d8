"""``python -m loki_perf``: run the perf service until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys

from loki_shared.logsetup import setup_logging

from .errors import PerfError
from .service import PerfService
from .settings import Settings


async def run(settings: Settings) -> int:
    """Run one :class:`PerfService` until a termination signal; return the exit status."""
    log = setup_logging("perf", settings.log_level)
    service = PerfService(settings, log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except PerfError as exc:
        log.error("perf service cannot start: %s", exc)
        await service.broker.stop()
        return 1
    await stop.wait()
    log.info("perf service stopping")
    await service.stop()
    return 0


def main() -> None:
    settings = Settings()
    sys.exit(asyncio.run(run(settings)))


if __name__ == "__main__":
    main()
