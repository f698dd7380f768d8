"""Paired devices in Redis: their names, dates, revocation, sealed keys and request counters.

Redis layout (one hash per device, a set of ids, one counter per device)::

    loki:e2e:devices            set of device ids
    loki:e2e:device:<id>        hash: name, created, last_seen, revoked (unix seconds, "" none),
                                key (the 32-byte device key sealed with the service key,
                                loki_shared.sealing, associated data = this Redis key)
    loki:e2e:counter:<id>       the highest request counter accepted from the device

A revoked device keeps its hash (the list shows it revoked) but loses its key: nothing can
open or seal for it any more. Keys leave this module only through :meth:`DeviceStore.key`
(the e2e routes) and once, at :meth:`DeviceStore.create`.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis

from loki_shared.e2e_envelope import KEY_BYTES
from loki_shared.errors import LokiError
from loki_shared.sealing import Sealer, SealError

from ..errors import NotFound

SET_KEY = "loki:e2e:devices"
#: What :meth:`DeviceStore.create` makes; any other id is refused before Redis is asked.
DEVICE_ID = re.compile(r"dev_[0-9a-f]{16}")
MAX_NAME = 80

# Accept ARGV[1] only when above the stored counter (atomically: two requests racing with
# the same counter cannot both pass) and the device still has its key (KEYS[2]: a request
# opened just before a revocation is refused, and leaves no counter behind): 1 accepted,
# 0 a replay, -1 revoked.
_COUNTER_LUA = """
if redis.call('HEXISTS', KEYS[2], 'key') == 0 then return -1 end
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
if now > last then redis.call('SET', KEYS[1], ARGV[1]) return 1 end
return 0
"""


def _hash_key(device: str) -> str:
    return f"loki:e2e:device:{device}"


def _counter_key(device: str) -> str:
    return f"loki:e2e:counter:{device}"


class DeviceRefused(LokiError):
    """401 ``invalid_device``: no such device, or it was revoked (the e2e routes)."""

    http_status = 401
    openai_type = "invalid_request_error"
    code = "invalid_device"


@dataclass
class Device:
    """What the list shows of a device (never its key). Times in unix seconds."""

    id: str
    name: str
    created: float
    last_seen: float | None
    revoked: float | None

    def public(self) -> dict[str, Any]:
        """The JSON object of ``GET /api/e2e/devices``."""
        return asdict(self)


def _device(device: str, raw: dict[bytes, bytes]) -> Device:
    def num(field: bytes) -> float | None:
        value = raw.get(field, b"")
        return float(value) if value else None

    return Device(
        id=device,
        name=raw.get(b"name", b"").decode(),
        created=num(b"created") or 0.0,
        last_seen=num(b"last_seen"),
        revoked=num(b"revoked"),
    )


class DeviceStore:
    """The devices of this Loki.

    Args:
        redis: asyncio Redis client (bytes answers).
        sealer: the service key's sealer (``LOKI_SECRET_KEY``), for the device keys at rest.
    """

    def __init__(self, redis: Redis, sealer: Sealer) -> None:
        self.redis = redis
        self.sealer = sealer

    async def create(self, name: str) -> tuple[Device, bytes]:
        """A new device named ``name`` (1 to :data:`MAX_NAME` characters, checked by the
        route) with a fresh random 256-bit key: ``(device, key)``; the key is never given
        out again."""
        device = "dev_" + secrets.token_hex(8)
        key = secrets.token_bytes(KEY_BYTES)
        hkey = _hash_key(device)
        sealed = self.sealer.seal(key, hkey.encode())
        now = time.time()
        fields = {"name": name, "created": repr(now), "last_seen": "", "revoked": "", "key": sealed}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(hkey, mapping=fields)
            pipe.sadd(SET_KEY, device)
            await pipe.execute()
        return Device(device, name, now, None, None), key

    async def list(self) -> list[Device]:
        """Every device, revoked ones included, oldest first."""
        ids = sorted(i.decode() for i in await self.redis.smembers(SET_KEY))
        out = []
        for device in ids:
            raw = await self.redis.hgetall(_hash_key(device))
            if raw:
                out.append(_device(device, raw))
        return sorted(out, key=lambda d: d.created)

    async def get(self, device: str) -> Device:
        """One device.

        Raises:
            NotFound: no such device id.
        """
        raw = await self.redis.hgetall(_hash_key(device))
        if not raw:
            raise NotFound(f"no device {device!r}", code="device_not_found", param="device")
        return _device(device, raw)

    async def rename(self, device: str, name: str) -> Device:
        """Rename ``device`` (revoked ones too). Raises NotFound."""
        await self.get(device)
        await self.redis.hset(_hash_key(device), "name", name)
        return await self.get(device)

    async def revoke(self, device: str) -> Device:
        """Revoke ``device``: its key is deleted, every e2e request and stream of it is
        refused from now on. Idempotent. Raises NotFound."""
        found = await self.get(device)
        if found.revoked is None:
            hkey = _hash_key(device)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(hkey, "revoked", repr(time.time()))
                pipe.hdel(hkey, "key")
                pipe.delete(_counter_key(device))
                await pipe.execute()
        return await self.get(device)

    async def key(self, device: str) -> bytes:
        """The key of an active device.

        Raises:
            DeviceRefused: unknown or revoked device, an id not of :data:`DEVICE_ID`'s form
                (or its sealed key does not open: a changed service key).
        """
        if not DEVICE_ID.fullmatch(device):
            raise DeviceRefused("unknown device id (ids look like dev_ and 16 hex digits)")
        hkey = _hash_key(device)
        sealed = await self.redis.hget(hkey, "key")
        if not sealed:
            raise DeviceRefused("unknown or revoked device: pair it again")
        try:
            return self.sealer.open(bytes(sealed), hkey.encode())
        except SealError as exc:
            raise DeviceRefused("the device key does not open here: pair it again") from exc

    async def active(self, device: str) -> bool:
        """Whether ``device`` still has a key (not revoked)."""
        return bool(await self.redis.hexists(_hash_key(device), "key"))

    async def accept_counter(self, device: str, counter: int) -> bool:
        """Record ``counter`` as the device's latest request and return True when it is above
        the last accepted one; False (nothing changed) otherwise: a replay.

        Raises:
            DeviceRefused: the device was revoked since its key was read (nothing changed).
        """
        ok = await self.redis.eval(
            _COUNTER_LUA, 2, _counter_key(device), _hash_key(device), str(counter)
        )
        if ok == -1:
            raise DeviceRefused("the device was revoked: pair it again")
        return ok == 1

    async def seen(self, device: str) -> None:
        """Set ``last_seen`` to now (an accepted request)."""
        await self.redis.hset(_hash_key(device), "last_seen", repr(time.time()))
