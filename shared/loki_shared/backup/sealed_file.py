"""The backup file: a byte stream sealed with a key derived from a passphrase.

Layout::

    MAGIC (16 bytes)
    header length (4 bytes, big-endian) | header (JSON, UTF-8)
    frames: length (4 bytes, big-endian) | sealed chunk       (repeated)

The header holds the key derivation (:class:`loki_shared.memkey.KdfParams`: scrypt, its cost,
a random salt and a check value, so a wrong passphrase is told apart from a damaged file) and
the chunk size. The payload is cut into chunks of at most ``chunk_bytes``; each is sealed with
:class:`loki_shared.sealing.Sealer` (AES-256-GCM, random nonce) under the derived key, with the
associated data ``SHA-256(header) | chunk index (8 bytes) | last flag (1 byte)``: a chunk moved,
dropped, replayed from another file, or a file cut at a chunk boundary fails to open. The last
frame carries the flag (it may be empty), so a truncated file is refused, not half-read.

Why hand-written: no library for passphrase-sealed files (age, for one) is installable here,
and the pieces are the project's own (scrypt parameters of the memory key, the at-rest sealer).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from typing import Any, BinaryIO

from ..memkey import BadKdf, KdfParams, WrongPassphrase, new_params
from ..sealing import Sealer, SealError

MAGIC = b"LOKI-BACKUP\x00\x00\x00v1"
#: scrypt cost of a backup's key: N=2**17, r=8 (128 MiB, under a second), stronger than the
#: memory key's because a backup file may be attacked offline for as long as it exists.
BACKUP_SCRYPT_N = 2**17
CHUNK_BYTES = 1 << 20
#: Shortest passphrase accepted for a new backup (it protects the service key).
MIN_PASSPHRASE_CHARS = 12
_U32 = struct.Struct(">I")
_MAX_HEADER = 64 * 1024


class BackupFileError(Exception):
    """The file is not a Loki backup, is damaged or truncated, or the passphrase is wrong."""


def check_new_passphrase(passphrase: str) -> None:
    """Refuse a passphrase too short to protect a backup.

    Raises:
        BackupFileError: fewer than :data:`MIN_PASSPHRASE_CHARS` characters.
    """
    if len(passphrase) < MIN_PASSPHRASE_CHARS:
        raise BackupFileError(
            f"the backup passphrase must have at least {MIN_PASSPHRASE_CHARS} characters"
        )


def _aad(header_digest: bytes, index: int, last: bool) -> bytes:
    return header_digest + index.to_bytes(8, "big") + (b"\x01" if last else b"\x00")


class SealedWriter(io.RawIOBase):
    """A writable stream that seals what is written into ``out`` (see the module docstring).

    Args:
        out: the binary file to write (left open on :meth:`close`).
        passphrase: the backup passphrase (checked by :func:`check_new_passphrase`).
        scrypt_n: scrypt's N (tests may lower it; the header records it).

    Raises:
        BackupFileError: the passphrase is too short.
    """

    def __init__(self, out: BinaryIO, passphrase: str, scrypt_n: int = BACKUP_SCRYPT_N) -> None:
        super().__init__()
        check_new_passphrase(passphrase)
        params, key = new_params(passphrase, n=scrypt_n)
        header = json.dumps(
            {"kdf": json.loads(params.to_json()), "chunk_bytes": CHUNK_BYTES}, sort_keys=True
        ).encode()
        self._out = out
        self._sealer = Sealer(key)
        self._digest = hashlib.sha256(header).digest()
        self._buf = bytearray()
        self._index = 0
        out.write(MAGIC + _U32.pack(len(header)) + header)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed backup file")
        self._buf += data
        while len(self._buf) > CHUNK_BYTES:
            self._frame(bytes(self._buf[:CHUNK_BYTES]), last=False)
            del self._buf[:CHUNK_BYTES]
        return len(data)

    def _frame(self, chunk: bytes, last: bool) -> None:
        sealed = self._sealer.seal(chunk, _aad(self._digest, self._index, last))
        self._out.write(_U32.pack(len(sealed)) + sealed)
        self._index += 1

    def close(self) -> None:
        """Write the last frame (the rest of the buffer, flagged last)."""
        if not self.closed:
            self._frame(bytes(self._buf), last=True)
            self._buf.clear()
            self._out.flush()
        super().close()


class SealedReader(io.RawIOBase):
    """A readable stream of the payload of a file written by :class:`SealedWriter`.

    Raises (at construction or while reading):
        BackupFileError: not a Loki backup, a damaged or truncated file, or a wrong passphrase.
    """

    def __init__(self, src: BinaryIO, passphrase: str) -> None:
        super().__init__()
        if src.read(len(MAGIC)) != MAGIC:
            raise BackupFileError("not a Loki backup file (or a version this Loki cannot read)")
        size = _read_u32(src, "header")
        if size > _MAX_HEADER:
            raise BackupFileError("damaged backup file: header too large")
        header = _read_exact(src, size, "header")
        try:
            params = KdfParams.from_json(json.dumps(json.loads(header)["kdf"]))
            key = params.unlock(passphrase)
        except WrongPassphrase as exc:
            raise BackupFileError("wrong passphrase for this backup") from exc
        except (BadKdf, ValueError, KeyError, TypeError) as exc:
            raise BackupFileError(f"damaged backup file header: {exc}") from exc
        self._src = src
        self._sealer = Sealer(key)
        self._digest = hashlib.sha256(header).digest()
        self._index = 0
        self._buf = b""
        self._pos = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def _next_frame(self) -> None:
        size = _read_u32(self._src, "frame")
        sealed = _read_exact(self._src, size, "frame")
        for last in (False, True):
            try:
                chunk = self._sealer.open(sealed, _aad(self._digest, self._index, last))
            except SealError:
                continue
            self._index += 1
            self._buf, self._pos = chunk, 0
            if last:
                self._done = True
                if self._src.read(1):
                    raise BackupFileError("damaged backup file: data after the last frame")
            return
        raise BackupFileError(f"damaged backup file: frame {self._index} does not open")

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._buf) and not self._done:
            self._next_frame()
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n


def _read_exact(src: BinaryIO, n: int, what: str) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise BackupFileError(f"truncated backup file (in a {what})")
    return data


def _read_u32(src: BinaryIO, what: str) -> int:
    value: int = _U32.unpack(_read_exact(src, _U32.size, what))[0]
    return value
