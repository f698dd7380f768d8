"""``python -m loki_memory``: run the memory service until SIGTERM or SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.service_main`)."""

from __future__ import annotations

from loki_shared import service_main

from .service import MemoryService
from .settings import Settings


def main() -> None:
    settings = Settings()
    service_main.run_service("memory", settings, lambda: MemoryService(settings))


if __name__ == "__main__":
    main()
