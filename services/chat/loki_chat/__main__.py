"""``python -m loki_chat``: run the chat service until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal

import httpx
import redis.asyncio as aioredis

from loki_shared.logsetup import setup_logging
from loki_shared.nats import make_broker
from loki_shared.sealing import service_sealer

from .service import ChatService, instance_id
from .settings import Settings
from .store import Store


async def main() -> None:
    settings = Settings()
    log = setup_logging("chat", settings.log_level)
    secret = settings.secret_key.get_secret_value() if settings.secret_key else None
    sealer = service_sealer(settings.home, secret)
    instance = instance_id(settings)
    client = aioredis.Redis.from_url(settings.redis_url)
    store = Store(client, sealer, instance, settings.lock_ttl_s)
    broker = make_broker(settings.nats_url, "chat")
    async with httpx.AsyncClient() as http:
        service = ChatService(settings, broker, store, http)
        service.register()
        await broker.start()
        await service.start()
        log.info("chat instance %s ready", instance)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
        await service.close()
        await broker.stop()
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
