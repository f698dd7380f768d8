"""``python -m loki_perf``: run the perf service until SIGTERM or SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.service_main`;
its start is retried while NATS is not there)."""

from __future__ import annotations

import nats.errors

from loki_shared import lifecycle, service_main

from .errors import MetricsPortInUse, PerfError
from .service import PerfService
from .settings import Settings


async def run(settings: Settings, stop: lifecycle.Stop) -> int:
    """Run one :class:`PerfService` until a termination signal; return the exit status.

    NATS not reachable yet (a stack starting) is retried every second until a signal; a
    metrics port in use is fatal (exit status 1).
    """
    log = stop.log
    stop.install()
    while True:
        service = PerfService(settings, log)
        try:
            if not await stop.unless_stopped(service.start()):
                await service.stop(stop.steps())
                return 0
            break
        except MetricsPortInUse as exc:
            log.error("perf service cannot start: %s", exc)
            await service.stop(lifecycle.Steps(1.0, log))
            return 1
        except (PerfError, OSError, nats.errors.Error) as exc:
            log.warning("perf service not started yet (%s); retrying", exc)
            await service.stop(lifecycle.Steps(1.0, log))
        if await stop.sleep(1.0):
            return 0
    await stop.wait()
    await service.stop(stop.steps())
    return 0


def main() -> None:
    settings = Settings()
    service_main.run("perf", settings, lambda stop: run(settings, stop))


if __name__ == "__main__":
    main()
