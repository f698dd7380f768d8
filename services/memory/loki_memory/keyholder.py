"""The memory key as the memory service holds it: taken from ``loki.memory.key`` events and
``loki.memory.status`` answers (the gateway's), checked against the stored check value, kept
in process memory only and never logged."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable

from redis.exceptions import RedisError

from loki_shared.memkey import KDF_REDIS_KEY, BadKdf, KdfParams, key_id
from loki_shared.sealing import Sealer

from .vault import Vault

log = logging.getLogger("loki.memory")


class KeyHolder:
    """Holds (or not) the memory key in ``vault.memory``.

    Args:
        vault: the vault whose :attr:`~loki_memory.vault.Vault.memory` is set.
        on_change: called after the key is taken or forgotten (to drop what was opened).
    """

    def __init__(self, vault: Vault, on_change: Callable[[], None] | None = None) -> None:
        self.vault = vault
        self.on_change = on_change
        self._key_id: str | None = None

    async def apply(self, state: str, key_b64: str | None) -> None:
        """Take the memory state the gateway reports: hold the key when ``unlocked`` and it
        matches the stored check value (a key that does not is refused, the state kept);
        forget it for any other state."""
        key: bytes | None = None
        if state == "unlocked" and key_b64:
            try:
                key = base64.b64decode(key_b64, validate=True)
                raw = await self.vault.redis.get(KDF_REDIS_KEY)
                if raw is None or not KdfParams.from_json(raw).verify(key):
                    log.warning("memory key refused: it does not match the stored check value")
                    return
            except (binascii.Error, BadKdf, RedisError) as exc:
                log.warning("memory key refused: %s", type(exc).__name__)
                return
        new_id = key_id(key) if key is not None else None
        if new_id == self._key_id:
            return
        self._key_id = new_id
        self.vault.memory = Sealer(key) if key is not None else None
        if self.on_change is not None:
            self.on_change()
        log.info("memory %s", "unlocked" if key is not None else state)
