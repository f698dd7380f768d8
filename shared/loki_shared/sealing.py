"""AES-256-GCM sealing of blobs stored at rest (Redis values, archive blocks).

Format of a sealed blob (bytes)::

    version (1 byte, 0x01) | nonce (12 bytes, random) | ciphertext || tag (16 bytes)

The associated data (AAD) is chosen by the caller, normally the Redis key the blob is stored
under, so a blob copied under another key fails to open.

The service key comes from ``LOKI_SECRET_KEY`` or, when unset, from ``LOKI_HOME/secret.key``,
created with mode 0600 on first start (exclusive create, so services starting at once agree on
one key).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 0x01
NONCE_BYTES = 12
KEY_BYTES = 32
KEY_FILE = "secret.key"


class SealError(Exception):
    """A blob could not be opened: wrong key, wrong associated data, truncated or tampered."""


class Sealer:
    """Seals and opens blobs with one 256-bit AES-GCM key.

    Args:
        key: exactly 32 bytes.

    Raises:
        ValueError: the key is not 32 bytes.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"sealing key must be {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, aad: bytes = b"") -> bytes:
        """Return ``plaintext`` sealed (see the module docstring for the layout)."""
        nonce = os.urandom(NONCE_BYTES)
        return bytes([VERSION]) + nonce + self._aead.encrypt(nonce, plaintext, aad or None)

    def open(self, blob: bytes, aad: bytes = b"") -> bytes:
        """Return the plaintext of a blob made by :meth:`seal` with the same key and ``aad``.

        Raises:
            SealError: unknown version, truncated blob, wrong key or ``aad``, or tampering.
        """
        if len(blob) < 1 + NONCE_BYTES + 16 or blob[0] != VERSION:
            raise SealError("not a sealed blob of a known version")
        nonce = blob[1 : 1 + NONCE_BYTES]
        try:
            return self._aead.decrypt(nonce, blob[1 + NONCE_BYTES :], aad or None)
        except InvalidTag as exc:
            raise SealError("blob does not open with this key and associated data") from exc


def key_from_text(text: str) -> bytes:
    """Turn ``LOKI_SECRET_KEY`` into 32 key bytes.

    A standard or URL-safe base64 text of exactly 32 bytes is used as is; any other text is
    hashed with SHA-256 (so a long random passphrase also works).
    """
    stripped = text.strip()
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(stripped + "=" * (-len(stripped) % 4))
        except (binascii.Error, ValueError):
            continue
        if len(raw) == KEY_BYTES:
            return raw
    return hashlib.sha256(stripped.encode("utf-8")).digest()


def load_service_key(home: Path, secret_key: str | None) -> bytes:
    """Return the service key: from ``secret_key`` when given, else from ``home/secret.key``.

    The file is created on first use with 32 random bytes (base64 text), mode 0600, by an
    exclusive create; a service that loses that race reads the winner's file.

    Raises:
        OSError: ``home`` cannot be created or the key file cannot be read.
        ValueError: the key file exists but does not hold a valid key.
    """
    if secret_key:
        return key_from_text(secret_key)
    home.mkdir(parents=True, exist_ok=True)
    path = home / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii") + "\n")
    # A racing creator may not have written yet: read until the file holds a full key.
    for _ in range(50):
        text = path.read_text().strip()
        if text:
            raw = base64.b64decode(text)
            if len(raw) != KEY_BYTES:
                raise ValueError(f"{path} does not hold a {KEY_BYTES}-byte base64 key")
            return raw
        time.sleep(0.02)
    raise ValueError(f"{path} stayed empty")


def service_sealer(home: Path, secret_key: str | None) -> Sealer:
    """Build the :class:`Sealer` for the service key (see :func:`load_service_key`)."""
    return Sealer(load_service_key(home, secret_key))
