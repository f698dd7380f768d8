"""``python -m loki_supervisor``: run the engine supervisor until SIGTERM/SIGINT, then stop
llama-server and the service within ``LOKI_STOP_TIMEOUT_S`` (see
:mod:`loki_shared.service_main`)."""

from __future__ import annotations

import logging

from loki_shared import lifecycle, service_main, subjects
from loki_shared.messages.engine import EngineState
from loki_shared.nats import make_broker, stop_broker
from loki_shared.redis_client import redis_client
from loki_shared.sealing import service_sealer

from .service import Supervisor, build_broker
from .settings import Settings

log = logging.getLogger("loki.engine-supervisor")


class SupervisorProcess:
    """The supervisor with its Redis client and NATS broker (a
    :class:`service_main.Service`): started, it applies the active preset (launches the
    engine); stopped, llama-server goes first, whatever happened before."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.secret_key.get_secret_value() if settings.secret_key else None
        self.redis = redis_client(settings)
        self.sup = Supervisor(
            settings, self.redis, service_sealer(settings.home, secret), self._publish_state
        )
        self.broker = make_broker(
            settings.nats_url,
            "engine-supervisor",
            health_check=self._health,
            login=settings.nats_options(),
        )
        build_broker(self.sup, self.broker)

    async def _publish_state(self, event: EngineState) -> None:
        await self.broker.publish(event, subjects.ENGINE_STATE)

    async def _health(self) -> dict[str, str]:
        return self.sup.health()

    async def start(self) -> None:
        await self.broker.start()
        log.info("supervisor connected to %s", self.settings.nats_url)
        await self.sup.start()

    async def stop(self, steps: lifecycle.Steps) -> None:
        """Stop llama-server (SIGTERM, SIGKILL when it does not go), then the NATS
        subscribers and Redis, each step bounded."""
        # The engine first: it holds the memory (RAM or VRAM) and must never outlive us.
        if not await steps.run("stop the engine", self.sup.close, max(1.0, steps.left() - 3.0)):
            self.sup.runner.kill()
        await stop_broker(self.broker, steps)
        await steps.run("close Redis", self.redis.aclose, 1.0)
        log.info("stopped")


def main() -> None:
    settings = Settings()
    service_main.run_service("engine-supervisor", settings, lambda: SupervisorProcess(settings))


if __name__ == "__main__":
    main()
