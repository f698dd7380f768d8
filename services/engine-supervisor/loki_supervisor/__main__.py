"""``python -m loki_supervisor``: run the engine supervisor until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal

from redis.asyncio import Redis

from loki_shared import subjects
from loki_shared.logsetup import setup_logging
from loki_shared.messages.engine import EngineState
from loki_shared.nats import make_broker
from loki_shared.sealing import service_sealer

from .service import Supervisor, build_broker
from .settings import Settings


async def main() -> None:
    """Start the broker, apply the active preset (launch the engine), serve until a signal,
    then stop llama-server cleanly."""
    settings = Settings()
    log = setup_logging("engine-supervisor", settings.log_level)
    sealer = service_sealer(
        settings.home, settings.secret_key.get_secret_value() if settings.secret_key else None
    )
    redis = Redis.from_url(settings.redis_url)
    broker = make_broker(settings.nats_url, "engine-supervisor")

    async def publish_state(event: EngineState) -> None:
        await broker.publish(event, subjects.ENGINE_STATE)

    sup = Supervisor(settings, redis, sealer, publish_state)
    build_broker(sup, broker)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    await broker.start()
    log.info("supervisor connected to %s", settings.nats_url)
    try:
        await sup.start()
        await stop.wait()
    finally:
        log.info("stopping")
        await sup.close()
        await broker.stop()
        await redis.aclose()
        log.info("stopped")


if __name__ == "__main__":
    asyncio.run(main())
