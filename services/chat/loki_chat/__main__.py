"""``python -m loki_chat``: run the chat service until SIGTERM/SIGINT, then stop within
``LOKI_STOP_TIMEOUT_S`` (see :mod:`loki_shared.lifecycle`)."""

from __future__ import annotations

import sys

import httpx
import redis.asyncio as aioredis

from loki_shared import lifecycle
from loki_shared.logsetup import setup_logging
from loki_shared.nats import make_broker, stop_broker
from loki_shared.sealing import service_sealer

from .service import ChatService, instance_id
from .settings import Settings
from .store import Store


async def serve(settings: Settings, stop: lifecycle.Stop) -> int:
    """Serve until a termination signal; then stop the turns (partial replies persisted),
    release the locks, stop the NATS subscribers and close Redis, each step bounded."""
    log = stop.log
    stop.install()
    secret = settings.secret_key.get_secret_value() if settings.secret_key else None
    sealer = service_sealer(settings.home, secret)
    instance = instance_id(settings)
    client = aioredis.Redis.from_url(settings.redis_url, **settings.redis_options())
    store = Store(client, sealer, instance, settings.lock_ttl_s)
    broker = make_broker(settings.nats_url, "chat", login=settings.nats_options())
    async with httpx.AsyncClient() as http:
        service = ChatService(settings, broker, store, http)
        service.register()

        async def start() -> None:
            await broker.start()
            await service.start()
            log.info("chat instance %s ready", instance)

        if await stop.unless_stopped(start()):
            await stop.wait()
        steps = stop.steps()
        await steps.run("stop the turns and release the locks", service.close, steps.left() * 0.5)
        await stop_broker(broker, steps)
    await steps.run("close Redis", client.aclose, 1.0)
    return 0


def main() -> None:
    settings = Settings()
    log = setup_logging("chat", settings.log_level)
    sys.exit(lifecycle.run(lambda stop: serve(settings, stop), settings.stop_timeout_s, log))


if __name__ == "__main__":
    main()
