"""How the memory service seals what it stores, and the memory key it may hold.

Every value is sealed with the service key (AES-256-GCM, :mod:`loki_shared.sealing`; the
associated data is the record's own name, so a blob moved elsewhere does not open). A
*private* record (page, tracker, project description and instructions) holds one kind byte
inside: ``P`` then its JSON, or ``M`` then its JSON sealed again with the user's memory key
(associated data: the name + ``:memory``) — the case for every private record written while
the memory is encrypted (:data:`loki_shared.memkey.KDF_REDIS_KEY` exists).

Memory states as this service sees them: *off* (no KDF record: private records are ``P``),
*unlocked* (the key is held: written as ``M``, both kinds read), *locked* (a KDF record and
no key: no private record is read or written — :class:`loki_shared.errors.Locked`).

Hash field names are keyed hashes of the page file or tracker slug (:meth:`Vault.field`), so
Redis holds no page or tracker name in the clear; project ids are in key names, as in the
recall service's owner sets.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.errors import Locked, Unavailable
from loki_shared.memkey import KDF_REDIS_KEY
from loki_shared.sealing import Sealer, SealError

KIND_PLAIN = b"P"
KIND_MEMORY = b"M"
LOCKED_MESSAGE = "the memory is locked: unlock it (passphrase) to read or write project memory"


class Vault:
    """Seals and opens the records of the memory service.

    Args:
        redis: the store (asked whether the memory is encrypted).
        service_key: the 32-byte service key.
    """

    def __init__(self, redis: Redis, service_key: bytes) -> None:
        self.redis = redis
        self._sealer = Sealer(service_key)
        self._field_key = hashlib.sha256(b"loki:projects:field\0" + service_key).digest()
        #: The memory key's sealer while held (None: not held).
        self.memory: Sealer | None = None

    # --- names -------------------------------------------------------------------------------
    def field(self, project_id: str, name: str) -> str:
        """The hash field of page file or tracker slug ``name`` in ``project_id`` (32 hex)."""
        mac = hmac.new(self._field_key, f"{project_id}\0{name}".encode(), hashlib.sha256)
        return mac.hexdigest()[:32]

    # --- records sealed with the service key only ---------------------------------------------
    def seal(self, aad: str, record: Any) -> bytes:
        """``record`` (JSON-able) sealed with the service key under ``aad``."""
        return self._sealer.seal(_dump(record), aad.encode())

    def open(self, aad: str, blob: bytes) -> Any:
        """The record of :meth:`seal`.

        Raises:
            SealError: the blob does not open under ``aad`` (moved, tampered, other key).
        """
        return json.loads(self._sealer.open(blob, aad.encode()))

    # --- private records ---------------------------------------------------------------------
    async def encrypted(self) -> bool:
        """Whether the memory is encrypted (a KDF record exists).

        Raises:
            Unavailable: Redis does not answer.
        """
        try:
            return bool(await self.redis.exists(KDF_REDIS_KEY))
        except RedisError as exc:
            raise Unavailable(f"redis: {exc}") from exc

    async def locked(self) -> bool:
        """Whether private records can be neither read nor written now."""
        return self.memory is None and await self.encrypted()

    async def require_open(self) -> Sealer | None:
        """The sealer a private record is written with now (None: service key only).

        Raises:
            Locked: the memory is encrypted and the key is not held.
        """
        memory = self.memory
        if memory is None and await self.encrypted():
            raise Locked(LOCKED_MESSAGE)
        return memory

    def seal_private(self, aad: str, record: Any, memory: Sealer | None) -> bytes:
        """``record`` as a private blob: ``M`` sealed with ``memory`` when given, else ``P``."""
        body = _dump(record)
        if memory is not None:
            inner = KIND_MEMORY + memory.seal(body, (aad + ":memory").encode())
        else:
            inner = KIND_PLAIN + body
        return self._sealer.seal(inner, aad.encode())

    def open_private(self, aad: str, blob: bytes) -> Any:
        """The record of :meth:`seal_private`.

        Raises:
            Locked: an ``M`` record and the memory key is not held.
            SealError: the blob does not open (moved, tampered, another key).
        """
        inner = self._sealer.open(blob, aad.encode())
        kind, body = inner[:1], inner[1:]
        if kind == KIND_MEMORY:
            memory = self.memory
            if memory is None:
                raise Locked(LOCKED_MESSAGE)
            body = memory.open(body, (aad + ":memory").encode())
        elif kind != KIND_PLAIN:
            raise SealError(f"{aad}: unknown kind {kind!r}")
        return json.loads(body)


def _dump(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
