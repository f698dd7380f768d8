"""The memory service: NATS handlers (FastStream) over a :class:`~loki_memory.store.Store`.

Subjects served (queue group ``memory``): every ``loki.projects.*`` request subject (see
:class:`~loki_memory.handlers.Handlers`). Published: ``loki.projects.changed`` after every
change. Subscribed by every instance: ``loki.memory.key`` (the gateway hands over or withdraws
the memory key); at start, and every ``LOKI_MEMORY_POLL_S``, it asks ``loki.memory.status``.
"""

from __future__ import annotations

import asyncio
import logging

from faststream.nats import NatsBroker
from redis.exceptions import RedisError

from loki_shared import lifecycle, subjects
from loki_shared.errors import Unavailable
from loki_shared.memkey import MemoryKeyFollower
from loki_shared.messages.projects import ActiveProjectRequest, ProjectChangedEvent
from loki_shared.nats import broker_client, make_broker, stop_broker, until_routable
from loki_shared.redis_client import redis_client
from loki_shared.sealing import load_service_key
from loki_shared.serve import serve

from .handlers import Handlers
from .settings import Settings
from .store import Store

log = logging.getLogger("loki.memory")


class MemoryService:
    """One memory service instance. Use ``await start()`` then ``await stop()``;
    :attr:`store` is the state it serves."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secret = settings.secret_key.get_secret_value() if settings.secret_key else None
        self.redis = redis_client(settings)
        self.store = Store(self.redis, load_service_key(settings.home, secret))
        self.broker: NatsBroker = make_broker(
            settings.nats_url, "memory", health_check=self._health, login=settings.nats_options()
        )
        self.keys = MemoryKeyFollower(self.broker, self.redis, self.store.set_memory_key, log)
        self.keys.subscribe()
        self.handlers = Handlers(self.store, self._announce, self._max_payload)
        self._poller: asyncio.Task[None] | None = None
        self._register()

    # --- wiring ------------------------------------------------------------------------------
    def _register(self) -> None:
        """Answer every request subject of :meth:`Handlers.table` with
        :func:`loki_shared.serve.serve` (queue group ``memory``)."""
        for subject, handler in self.handlers.table().items():
            serve(
                self.broker,
                subject,
                handler,
                queue=subjects.QUEUE_PROJECTS,
                max_workers=self.settings.memory_workers,
            )

    async def _announce(self, event: ProjectChangedEvent) -> None:
        try:
            await self.broker.publish(event, subjects.PROJECTS_CHANGED)
        except Exception as exc:  # noqa: BLE001 - an event is best effort
            log.warning("change event not published: %s", exc)

    def _max_payload(self) -> int:
        """The largest message the server takes (its ``max_payload``; 1 MiB by default)."""
        nc = broker_client(self.broker)
        return int(nc.max_payload) if nc is not None else 1 << 20

    async def _health(self) -> dict[str, str]:
        try:
            await self.redis.ping()
        except RedisError as exc:
            return {"redis": type(exc).__name__}
        return {}

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Make sure the default project exists, then serve. Waits (retrying every second)
        while Redis does not answer."""
        while True:
            try:
                await self.store.projects.ensure_default()
                break
            except Unavailable as exc:
                log.warning("Redis not reachable (%s); retrying", exc)
                await asyncio.sleep(1.0)
        await self.broker.start()
        probe = ActiveProjectRequest().model_dump_json().encode()
        await until_routable(self.broker.connection, subjects.PROJECTS_ACTIVE, probe, log)
        self._poller = asyncio.create_task(self.keys.follow(self.settings.memory_poll_s))
        log.info("memory service serving")

    async def stop(self, steps: lifecycle.Steps | None = None) -> None:
        """Stop serving, each step bounded by ``steps`` (default: a budget of
        ``LOKI_STOP_TIMEOUT_S``): the NATS subscribers (requests running get the time left),
        then Redis."""
        steps = steps or lifecycle.Steps(self.settings.stop_timeout_s, log)
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        await stop_broker(self.broker, steps, steps.left() * 0.5)
        await steps.run("close Redis", self.redis.aclose, 1.0)
