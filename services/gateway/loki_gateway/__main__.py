"""``python -m loki_gateway``: read the settings, set up logging, serve with uvicorn.

uvicorn handles SIGTERM/SIGINT: it stops accepting, gives open requests and streams
``LOKI_STOP_TIMEOUT_S`` × :data:`GRACEFUL_SHARE`, then runs the lifespan shutdown, whose steps
(HTTP client, NATS connection) share what is left of the budget (see
:mod:`loki_shared.lifecycle`). A second signal ends the process at once.
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from loki_shared import lifecycle, service_main

from .app import create_app
from .settings import Settings

#: Share of the stop budget uvicorn gives the requests and streams still open.
GRACEFUL_SHARE = 0.4


class _Server(uvicorn.Server):
    """uvicorn's server, telling Loki's :class:`~loki_shared.lifecycle.Stop` of each signal
    (watchdog, second signal)."""

    stop: lifecycle.Stop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stop is not None:
            self.stop.on_signal(sig)
        super().handle_exit(sig, frame)


async def serve(settings: Settings, stop: lifecycle.Stop) -> int:
    """Serve the app with uvicorn until it stops (after a signal); returns 0."""
    log = stop.log
    host = settings.listen_host()
    if settings.key() is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no LOKI_API_KEY and listening on %s: anyone who reaches it can use Loki", host)
    app = create_app(settings)
    log.info("listening on http://%s:%d", host, settings.web_port)
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=settings.web_port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, round(settings.stop_timeout_s * GRACEFUL_SHARE)),
            proxy_headers=False,
        )
    )
    # uvicorn raises the signal it caught again once it has stopped; with this handler in place
    # that is a no-op, and the exit status is the gateway's (0), not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: None)
    server.stop = stop
    app.state.stop = stop
    await server.serve()
    return 0


def main() -> None:
    settings = Settings()
    service_main.run("gateway", settings, lambda stop: serve(settings, stop))


if __name__ == "__main__":
    main()
