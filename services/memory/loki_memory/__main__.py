"""``python -m loki_memory``: run the memory service until SIGTERM or SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.lifecycle`)."""

from __future__ import annotations

import sys

from loki_shared import lifecycle
from loki_shared.logsetup import setup_logging

from .service import MemoryService
from .settings import Settings


async def serve(settings: Settings, stop: lifecycle.Stop) -> int:
    """Serve until a termination signal; then stop, each step bounded."""
    stop.install()
    service = MemoryService(settings)
    if await stop.unless_stopped(service.start()):
        await stop.wait()
    await service.stop(stop.steps())
    return 0


def main() -> None:
    settings = Settings()
    log = setup_logging("memory", settings.log_level)
    sys.exit(lifecycle.run(lambda stop: serve(settings, stop), settings.stop_timeout_s, log))


if __name__ == "__main__":
    main()
