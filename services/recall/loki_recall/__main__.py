"""``python -m loki_recall``: run the recall service until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal

from loki_shared.logsetup import setup_logging

from .service import RecallService
from .settings import Settings


async def main() -> None:
    settings = Settings()
    log = setup_logging("recall", settings.log_level)
    service = RecallService(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    await stop.wait()
    log.info("stopping")
    await service.stop()


if __name__ == "__main__":
    asyncio.run(main())
