"""``python -m loki_workspace``: run the workspace service until SIGTERM or SIGINT, then stop
within ``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.service_main`)."""

from __future__ import annotations

from loki_shared import service_main

from .service import WorkspaceService
from .settings import Settings


def main() -> None:
    settings = Settings()
    service_main.run_service("workspace", settings, lambda: WorkspaceService(settings))


if __name__ == "__main__":
    main()
