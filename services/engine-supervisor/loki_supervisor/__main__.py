"""``python -m loki_supervisor``: run the engine supervisor until SIGTERM/SIGINT, then stop
llama-server and the service within ``LOKI_STOP_TIMEOUT_S`` (see
:mod:`loki_shared.lifecycle`)."""

from __future__ import annotations

import sys

from redis.asyncio import Redis

from loki_shared import lifecycle, subjects
from loki_shared.logsetup import setup_logging
from loki_shared.messages.engine import EngineState
from loki_shared.nats import make_broker, stop_broker
from loki_shared.sealing import service_sealer

from .service import Supervisor, build_broker
from .settings import Settings


async def serve(settings: Settings, stop: lifecycle.Stop) -> int:
    """Start the broker, apply the active preset (launch the engine), serve until a signal,
    then stop llama-server (SIGTERM, SIGKILL when it does not go), the NATS subscribers and
    Redis, each step bounded."""
    log = stop.log
    stop.install()
    sealer = service_sealer(
        settings.home, settings.secret_key.get_secret_value() if settings.secret_key else None
    )
    redis = Redis.from_url(settings.redis_url, **settings.redis_options())
    sup: Supervisor | None = None

    async def publish_state(event: EngineState) -> None:
        await broker.publish(event, subjects.ENGINE_STATE)

    async def health() -> dict[str, str]:
        return sup.health() if sup is not None else {}

    broker = make_broker(
        settings.nats_url,
        "engine-supervisor",
        health_check=health,
        login=settings.nats_options(),
    )
    sup = Supervisor(settings, redis, sealer, publish_state)
    build_broker(sup, broker)

    async def start() -> None:
        await broker.start()
        log.info("supervisor connected to %s", settings.nats_url)
        await sup.start()

    try:
        if await stop.unless_stopped(start()):
            await stop.wait()
    finally:
        steps = stop.steps()
        # The engine first: it holds the memory (RAM or VRAM) and must never outlive us.
        if not await steps.run("stop the engine", sup.close, max(1.0, steps.left() - 3.0)):
            sup.runner.kill()
        await stop_broker(broker, steps)
        await steps.run("close Redis", redis.aclose, 1.0)
        log.info("stopped")
    return 0


def main() -> None:
    settings = Settings()
    log = setup_logging("engine-supervisor", settings.log_level)
    sys.exit(lifecycle.run(lambda stop: serve(settings, stop), settings.stop_timeout_s, log))


if __name__ == "__main__":
    main()
