"""``python -m loki_recall``: run the recall service until SIGTERM or SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.lifecycle`)."""

from __future__ import annotations

import sys

from loki_shared import lifecycle
from loki_shared.logsetup import setup_logging

from .service import RecallService
from .settings import Settings


async def serve(settings: Settings, stop: lifecycle.Stop) -> int:
    """Load the archive and serve until a termination signal; then stop, each step bounded."""
    stop.install()
    service = RecallService(settings)
    if await stop.unless_stopped(service.start()):
        await stop.wait()
    await service.stop(stop.steps())
    return 0


def main() -> None:
    settings = Settings()
    log = setup_logging("recall", settings.log_level)
    sys.exit(lifecycle.run(lambda stop: serve(settings, stop), settings.stop_timeout_s, log))


if __name__ == "__main__":
    main()
