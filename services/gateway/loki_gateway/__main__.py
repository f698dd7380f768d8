"""``python -m loki_gateway``: read the settings, set up logging, serve with uvicorn.

uvicorn handles SIGTERM/SIGINT: it stops accepting, closes open streams and runs the
lifespan shutdown (HTTP client and NATS connection closed).
"""

from __future__ import annotations

import uvicorn

from loki_shared.logsetup import setup_logging

from .app import create_app
from .settings import Settings


def main() -> None:
    settings = Settings()
    log = setup_logging("gateway", settings.log_level)
    host = settings.listen_host()
    if settings.key() is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no LOKI_API_KEY and listening on %s: anyone who reaches it can use Loki", host)
    app = create_app(settings)
    log.info("listening on http://%s:%d", host, settings.web_port)
    uvicorn.run(
        app,
        host=host,
        port=settings.web_port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
