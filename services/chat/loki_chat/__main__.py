"""``python -m loki_chat``: run the chat service until SIGTERM/SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.service_main`)."""

from __future__ import annotations

import logging

import httpx

from loki_shared import lifecycle, service_main
from loki_shared.nats import make_broker, stop_broker
from loki_shared.redis_client import redis_client
from loki_shared.sealing import service_sealer

from .service import ChatService, instance_id
from .settings import Settings
from .store import Store

log = logging.getLogger("loki.chat")


class ChatProcess:
    """One chat instance: its Redis client, NATS broker, engine HTTP client and
    :class:`ChatService`, started and stopped together (a :class:`service_main.Service`)."""

    def __init__(self, settings: Settings) -> None:
        secret = settings.secret_key.get_secret_value() if settings.secret_key else None
        self.instance = instance_id(settings)
        self.redis = redis_client(settings)
        store = Store(
            self.redis, service_sealer(settings.home, secret), self.instance, settings.lock_ttl_s
        )
        self.broker = make_broker(settings.nats_url, "chat", login=settings.nats_options())
        self.http = httpx.AsyncClient()
        self.service = ChatService(settings, self.broker, store, self.http)
        self.service.register()

    async def start(self) -> None:
        await self.broker.start()
        await self.service.start()
        log.info("chat instance %s ready", self.instance)

    async def stop(self, steps: lifecycle.Steps) -> None:
        """Stop the turns (partial replies persisted) and release the locks, stop the NATS
        subscribers, close the engine client and Redis, each step bounded."""
        await steps.run(
            "stop the turns and release the locks", self.service.close, steps.left() * 0.5
        )
        await stop_broker(self.broker, steps)
        await steps.run("close the engine client", self.http.aclose, 1.0)
        await steps.run("close Redis", self.redis.aclose, 1.0)


def main() -> None:
    settings = Settings()
    service_main.run_service("chat", settings, lambda: ChatProcess(settings))


if __name__ == "__main__":
    main()
