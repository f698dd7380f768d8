"""The memory key on the gateway side: unlock (derive and check), lock, state, hand-over.

The gateway is where the user types the passphrase. :class:`MemoryState` derives the memory
key with scrypt (:mod:`loki_shared.memkey`), keeps it in process memory only, and hands it to
the services over NATS:

- broadcast ``loki.memory.key`` (:class:`~loki_shared.messages.memory.MemoryKeyEvent`) on every
  unlock and lock, and once at start-up (state ``locked`` or ``off``, no key: after a restart
  the memory is locked until unlocked again, and services still holding a key forget it);
- answer ``loki.memory.status`` requests (queue group ``gateway``) with the state and, when
  unlocked, the key, so a service that (re)starts gets it.

The salt, scrypt parameters and check value live in Redis under
:data:`loki_shared.memkey.KDF_REDIS_KEY`; the key is never written anywhere.

Wiring (in the gateway app's lifespan, after the bus is connected)::

    memory = MemoryState(redis.asyncio.Redis.from_url(settings.redis_url), app.state.bus.client)
    await memory.start()
    app.state.memory = memory
    ...
    await memory.stop()
"""

from __future__ import annotations

import asyncio
import base64
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from redis.asyncio import Redis

from loki_shared import memkey, subjects
from loki_shared.errors import Forbidden
from loki_shared.messages.memory import MemoryKeyEvent, MemoryStatusReply
from loki_shared.messages.memory import MemoryState as State

from .errors import BadRequest

log = logging.getLogger("loki.gateway.memory")
QUEUE_GATEWAY = "gateway"


class WrongPassphraseError(Forbidden):
    """403 ``permission_error``: the passphrase does not open the memory (nothing changed)."""

    openai_type = "permission_error"
    code = "wrong_passphrase"


class MemoryState:
    """The memory's state and key, held by the gateway.

    Args:
        redis: asyncio Redis client (where the KDF record lives).
        nc: connected nats-py client (the gateway bus's ``client``).
        n, r, p: scrypt cost for a passphrase set for the first time (tests use a lower ``n``).
    """

    def __init__(
        self,
        redis: Redis,
        nc: Client,
        n: int = memkey.DEFAULT_N,
        r: int = memkey.DEFAULT_R,
        p: int = memkey.DEFAULT_P,
    ) -> None:
        self.redis = redis
        self.nc = nc
        self._cost = (n, r, p)
        self._key: bytes | None = None
        self._lock = asyncio.Lock()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Answer ``loki.memory.status`` and tell the services the memory is not unlocked."""
        self._sub = await self.nc.subscribe(
            subjects.MEMORY_STATUS, queue=QUEUE_GATEWAY, cb=self._on_status
        )
        await self._publish(await self.state())

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        self._key = None

    def key(self) -> bytes | None:
        """The memory key while it is held (unlocked), else None. Never logged or stored."""
        return self._key

    async def state(self) -> State:
        """``unlocked`` (key held), ``locked`` (passphrase set, key not held) or ``off``."""
        if self._key is not None:
            return "unlocked"
        return "locked" if await self.redis.exists(memkey.KDF_REDIS_KEY) else "off"

    async def unlock(self, passphrase: str) -> State:
        """Derive the key of ``passphrase`` and hold it; the first unlock sets the passphrase.

        Raises:
            BadRequest: empty passphrase.
            WrongPassphraseError: it does not match the stored check value (state unchanged).
        """
        if not passphrase:
            raise BadRequest("passphrase must not be empty", code="empty_passphrase")
        async with self._lock:
            raw = await self.redis.get(memkey.KDF_REDIS_KEY)
            if raw is None:
                n, r, p = self._cost
                params, key = await asyncio.to_thread(memkey.new_params, passphrase, n, r, p)
                if not await self.redis.set(memkey.KDF_REDIS_KEY, params.to_json(), nx=True):
                    raw = await self.redis.get(memkey.KDF_REDIS_KEY)  # set by someone else
            if raw is not None:
                params = memkey.KdfParams.from_json(raw)
                try:
                    key = await asyncio.to_thread(params.unlock, passphrase)
                except memkey.WrongPassphrase as exc:
                    raise WrongPassphraseError("wrong passphrase") from exc
            self._key = key
            await self._publish("unlocked")
            return "unlocked"

    async def lock(self) -> State:
        """Forget the key (the services are told to forget it too); the new state."""
        async with self._lock:
            self._key = None
            state = await self.state()
            await self._publish(state)
            return state

    def _key_fields(self) -> tuple[str | None, str | None]:
        key = self._key
        if key is None:
            return None, None
        return base64.b64encode(key).decode("ascii"), memkey.key_id(key)

    async def _publish(self, state: State) -> None:
        key_b64, key_id = self._key_fields() if state == "unlocked" else (None, None)
        event = MemoryKeyEvent(state=state, key_b64=key_b64, key_id=key_id)
        await self.nc.publish(subjects.MEMORY_KEY, event.model_dump_json().encode())
        await self.nc.flush()
        log.info("memory %s", state)

    async def _on_status(self, msg: NatsMsg) -> None:
        state = await self.state()
        key_b64, key_id = self._key_fields() if state == "unlocked" else (None, None)
        reply = MemoryStatusReply(state=state, key_b64=key_b64, key_id=key_id)
        await msg.respond(reply.model_dump_json().encode())
