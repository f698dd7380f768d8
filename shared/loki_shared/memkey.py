"""The user's memory key: derived from a passphrase with scrypt, checked, never stored.

The gateway derives the key when the user unlocks the memory and hands it to the services over
NATS (``loki.memory.key``); services keep it in process memory only and never write it to disk
or logs. What is stored (in Redis under :data:`KDF_REDIS_KEY`, as JSON) is only what is needed
to derive and recognise the key again: the scrypt parameters, a random salt, and a check value
(an HMAC-SHA256 of a fixed text under the key), so a wrong passphrase is told apart without
storing anything that opens data.

Memory states: ``off`` (no passphrase set: no :data:`KDF_REDIS_KEY`), ``locked`` (passphrase
set, key not held), ``unlocked`` (key held).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

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
