"""The user's memory key: derived from a passphrase with scrypt, checked, never stored.

The gateway derives the key when the user unlocks the memory and hands it to the services over
NATS (``loki.memory.key``); services keep it in process memory only and never write it to disk
or logs. What is stored (in Redis under :data:`KDF_REDIS_KEY`, as JSON) is only what is needed
to derive and recognise the key again: the scrypt parameters, a random salt, and a check value
(an HMAC-SHA256 of a fixed text under the key), so a wrong passphrase is told apart without
storing anything that opens data.

Memory states: ``off`` (no passphrase set: no :data:`KDF_REDIS_KEY`), ``locked`` (passphrase
set, key not held), ``unlocked`` (key held).

A service that needs the key (memory, recall) follows it with one :class:`MemoryKeyFollower`:
the ``loki.memory.key`` events, and a ``loki.memory.status`` question at start and every few
seconds (an event missed while the service was away is caught up).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from faststream.nats.annotations import NatsMessage  # at run time: FastStream reads the annotation
from pydantic import ValidationError
from redis.exceptions import RedisError

from . import subjects
from .messages.memory import MemoryKeyEvent, MemoryStatusReply, MemoryStatusRequest

if TYPE_CHECKING:  # pragma: no cover
    from faststream.nats import NatsBroker
    from redis.asyncio import Redis

#: Redis key holding the JSON of :class:`KdfParams` (present = memory encryption is on).
KDF_REDIS_KEY = "loki:memory:kdf"
KEY_BYTES = 32
SALT_BYTES = 16
#: scrypt cost (N=2**15, r=8, p=1: about 32 MiB and a tenth of a second per derivation).
DEFAULT_N = 2**15
DEFAULT_R = 8
DEFAULT_P = 1
_CHECK_TEXT = b"loki memory key check v1"


class WrongPassphrase(Exception):
    """The passphrase does not derive the key the check value was made with."""


class BadKdf(ValueError):
    """The stored KDF record cannot be read."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def check_value(key: bytes) -> bytes:
    """HMAC-SHA256 of a fixed text under ``key`` (32 bytes): recognises the key, opens nothing."""
    return hmac.new(key, _CHECK_TEXT, hashlib.sha256).digest()


def key_id(key: bytes) -> str:
    """A short public name of ``key`` (16 hex characters of its check value)."""
    return check_value(key)[:8].hex()


@dataclass(frozen=True)
class KdfParams:
    """What is stored to derive and recognise the memory key again (no secret in it)."""

    salt: bytes
    check: bytes
    n: int = DEFAULT_N
    r: int = DEFAULT_R
    p: int = DEFAULT_P

    def derive(self, passphrase: str) -> bytes:
        """The 32-byte key of ``passphrase`` under these parameters (CPU and memory bound)."""
        kdf = Scrypt(salt=self.salt, length=KEY_BYTES, n=self.n, r=self.r, p=self.p)
        return kdf.derive(passphrase.encode("utf-8"))

    def verify(self, key: bytes) -> bool:
        """Whether ``key`` is the key these parameters were made with (constant time)."""
        return len(key) == KEY_BYTES and hmac.compare_digest(check_value(key), self.check)

    def unlock(self, passphrase: str) -> bytes:
        """Derive and check the key of ``passphrase``.

        Raises:
            WrongPassphrase: the derived key does not match the check value.
        """
        key = self.derive(passphrase)
        if not self.verify(key):
            raise WrongPassphrase("wrong passphrase")
        return key

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "kdf": "scrypt",
                "n": self.n,
                "r": self.r,
                "p": self.p,
                "salt": b64(self.salt),
                "check": b64(self.check),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> KdfParams:
        """Read a stored record.

        Raises:
            BadKdf: not a version-1 scrypt record.
        """
        try:
            data = json.loads(text)
            if data.get("v") != 1 or data.get("kdf") != "scrypt":
                raise BadKdf("unknown memory KDF record version")
            return cls(
                salt=unb64(data["salt"]),
                check=unb64(data["check"]),
                n=int(data["n"]),
                r=int(data["r"]),
                p=int(data["p"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadKdf(f"unreadable memory KDF record: {exc}") from exc


def new_params(
    passphrase: str, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> tuple[KdfParams, bytes]:
    """Fresh parameters (random salt) for ``passphrase``, and the key they derive."""
    salt = os.urandom(SALT_BYTES)
    probe = KdfParams(salt=salt, check=b"", n=n, r=r, p=p)
    key = probe.derive(passphrase)
    return KdfParams(salt=salt, check=check_value(key), n=n, r=r, p=p), key


class MemoryKeyFollower:
    """Follows the memory key the gateway holds, for one service instance.

    The key is taken from ``loki.memory.key`` events (:meth:`subscribe`) and
    ``loki.memory.status`` answers (:meth:`ask`, :meth:`follow`), checked against the stored
    check value (:data:`KDF_REDIS_KEY`), and handed to ``on_key`` only when it changes. It is
    kept in process memory only and never logged.

    Args:
        broker: the service's FastStream broker (:meth:`subscribe` before it starts,
            :meth:`ask` once it is connected).
        redis: the asyncio Redis holding :data:`KDF_REDIS_KEY`.
        on_key: awaited with the 32-byte key when it is taken, with None when it is
            forgotten (locked, off), once per change.
        log: the service's logger (``memory unlocked`` / ``memory locked``, refusals).
    """

    def __init__(
        self,
        broker: NatsBroker,
        redis: Redis,
        on_key: Callable[[bytes | None], Awaitable[None]],
        log: logging.Logger | None = None,
    ) -> None:
        self.broker = broker
        self.redis = redis
        self.on_key = on_key
        self.log = log or logging.getLogger("loki.memkey")
        self._key_id: str | None = None

    @property
    def key_id(self) -> str | None:
        """The :func:`key_id` of the key held; None when none is held."""
        return self._key_id

    async def apply(self, state: str, key_b64: str | None) -> None:
        """Take the memory state the gateway reports: hold the key (base64 of 32 bytes) when
        ``state`` is ``unlocked`` and it matches the stored check value (a key that does not,
        or that cannot be checked, is refused with a WARNING and the state kept); forget it
        for any other state. Never raises for a bad key or Redis away; what ``on_key``
        raises goes to the caller."""
        key: bytes | None = None
        if state == "unlocked" and key_b64:
            try:
                key = base64.b64decode(key_b64, validate=True)
                raw = await self.redis.get(KDF_REDIS_KEY)
                if raw is None or not KdfParams.from_json(raw).verify(key):
                    self.log.warning("memory key refused: it does not match the stored check value")
                    return
            except (binascii.Error, BadKdf, RedisError) as exc:
                self.log.warning("memory key refused: %s", type(exc).__name__)
                return
        new_id = key_id(key) if key is not None else None
        if new_id == self._key_id:
            return
        self._key_id = new_id
        await self.on_key(key)
        self.log.info("memory %s", "unlocked" if key is not None else state)

    def subscribe(self) -> None:
        """Subscribe ``loki.memory.key`` (every instance, no queue group) on the broker; call
        it before the broker starts. An unreadable event is ignored with a WARNING."""

        @self.broker.subscriber(subjects.MEMORY_KEY)
        async def on_memory_key(msg: NatsMessage) -> None:
            try:
                event = MemoryKeyEvent.model_validate_json(msg.body)
            except ValidationError:
                self.log.warning("unreadable loki.memory.key event ignored")
                return
            await self.apply(event.state, event.key_b64)

    async def ask(self, timeout: float = 2.0) -> None:
        """Ask ``loki.memory.status`` (the gateway answers) and :meth:`apply` the answer.
        No answer (gateway absent, timeout, NATS away) or an error reply keeps the current
        state (logged at DEBUG); never raises for the bus."""
        try:
            msg = await self.broker.request(
                MemoryStatusRequest(), subjects.MEMORY_STATUS, timeout=timeout
            )
            reply = MemoryStatusReply.model_validate_json(msg.body)
        except Exception as exc:  # noqa: BLE001 - gateway absent, or any bus failure: keep the state
            self.log.debug("memory status unknown: %s", type(exc).__name__)
            return
        if reply.error is None:
            await self.apply(reply.state, reply.key_b64)

    async def follow(
        self, every_s: float, then: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Forever: :meth:`ask`, await ``then`` (when given: the service's own periodic
        catch-up), sleep ``every_s`` seconds. Run it as a task; it ends by cancellation."""
        while True:
            await self.ask()
            if then is not None:
                await then()
            await asyncio.sleep(every_s)
