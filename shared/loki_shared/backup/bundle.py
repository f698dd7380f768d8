"""Create and restore a backup: one sealed file holding Redis, JetStream and ``LOKI_HOME``.

The payload inside the sealed file (:mod:`.sealed_file`) is a gzip-compressed tar archive::

    manifest.json                  format version, creation time, what is inside (counts)
    keys/service.key               the service key (base64), the one every stored value is
                                   sealed with; it exists only inside the sealed payload
    redis/keys.jsonl               one line per key (:mod:`.redis_part`)
    jetstream/<stream>.json        one per stream or bucket: configuration, identity, messages
                                   (:mod:`.jetstream_part`)
    home/<path>                    the data files of LOKI_HOME (:mod:`.home_part`)

:func:`create_backup` reads a running stack (nothing is stopped); :func:`restore_backup`
writes into an empty one (empty Redis, no Loki stream holding messages, a ``LOKI_HOME`` without
another key): restores never merge.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import nats
from nats.aio.client import Client as NATS

from ..credentials import redact, url_login
from ..nats import nats_servers
from ..redis_client import redis_from_url
from . import home_part, jetstream_part, redis_part
from .sealed_file import (
    BACKUP_SCRYPT_N,
    BackupFileError,
    SealedReader,
    SealedWriter,
    check_new_passphrase,
)

FORMAT = 1
SUFFIX = ".lokibak"


class BackupError(Exception):
    """A backup or a restore could not be done; the message says why and what to do."""


@dataclass
class BackupSummary:
    """What a backup holds (also the manifest's ``contents``)."""

    redis_keys: int = 0
    redis_volatile_skipped: int = 0
    streams: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "redis_keys": self.redis_keys,
            "redis_volatile_skipped": self.redis_volatile_skipped,
            "streams": self.streams,
            "files": self.files,
        }


@dataclass
class Target:
    """Where the data lives: the stack's Redis and NATS, its ``LOKI_HOME`` and, when set,
    ``LOKI_SECRET_KEY``."""

    redis_url: str
    nats_url: str
    home: Path
    secret_key: str | None = None


async def create_backup(
    dest: Path | BinaryIO, passphrase: str, source: Target, scrypt_n: int = BACKUP_SCRYPT_N
) -> BackupSummary:
    """Write a backup of the running stack ``source`` to ``dest``: a file path, or a binary
    stream (standard output, for a backup piped out of a container).

    A file is written beside ``dest`` under a temporary name (mode 0600) and renamed when
    complete, so a failed backup never leaves a file that looks whole.

    Raises:
        BackupError: ``dest`` exists, the passphrase is too short, no service key, a server is
            unreachable, or a Redis key has a type a backup cannot copy.
    """
    _refuse_existing(dest)
    try:
        check_new_passphrase(passphrase)
        key = home_part.service_key(source.home, source.secret_key)
        redis_snap, streams = await _read_stores(source)
        files = home_part.data_files(source.home)
    except (BackupFileError, home_part.HomeBackupError, redis_part.RedisBackupError) as exc:
        raise BackupError(str(exc)) from exc
    summary = BackupSummary(
        redis_keys=len(redis_snap.keys),
        redis_volatile_skipped=redis_snap.volatile,
        streams={c.name: len(c.messages) for c in streams},
        files=files,
        created=time.time(),
    )

    def write(out: BinaryIO) -> None:
        manifest = {"format": FORMAT, "created": summary.created, "contents": summary.to_json()}
        sealed = SealedWriter(out, passphrase, scrypt_n=scrypt_n)
        with sealed, tarfile.open(fileobj=sealed, mode="w|gz") as tar:
            _add(tar, "manifest.json", json.dumps(manifest, indent=1).encode())
            _add(tar, "keys/service.key", base64.b64encode(key) + b"\n")
            lines = (json.dumps(k.to_json(), separators=(",", ":")) for k in redis_snap.keys)
            _add(tar, "redis/keys.jsonl", "".join(f"{line}\n" for line in lines).encode())
            for copy in streams:
                body = {
                    "name": copy.name,
                    "config": copy.config,
                    "identity": copy.identity,
                    "messages": [m.to_json() for m in copy.messages],
                }
                _add(tar, f"jetstream/{copy.name}.json", json.dumps(body).encode())
            for rel in files:
                try:
                    data = (source.home / rel).read_bytes()
                except OSError:
                    continue  # removed since it was listed
                _add(tar, f"home/{rel}", data)
        out.flush()

    if not isinstance(dest, str | Path):
        write(dest)
        return summary
    path = Path(dest)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            write(out)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:  # no partial file left, whatever ends the write; re-raised
        tmp.unlink(missing_ok=True)
        raise
    return summary


def _refuse_existing(dest: Path | BinaryIO) -> None:
    # A command-line tool: blocking on the file system is fine here (nothing else runs).
    if isinstance(dest, str | Path) and Path(dest).exists():
        raise BackupError(f"{dest} exists: choose a new file name")


async def _read_stores(
    source: Target,
) -> tuple[redis_part.RedisSnapshot, list[jetstream_part.StreamCopy]]:
    client = redis_from_url(source.redis_url)
    try:
        redis_snap = await redis_part.snapshot(client)
    except redis_part.RedisBackupError:
        raise
    except Exception as exc:  # any Redis client failure is the backup's error, said as such
        raise BackupError(f"cannot read Redis at {redact(source.redis_url)}: {exc}") from exc
    finally:
        await client.aclose()
    nc = await _connect_nats(source.nats_url)
    try:
        streams = await jetstream_part.snapshot(nc.jetstream())
    finally:
        await nc.close()
    return redis_snap, streams


@dataclass
class _Contents:
    manifest: dict[str, Any]
    key: bytes
    redis_keys: list[redis_part.RedisKey]
    streams: list[jetstream_part.StreamCopy]
    files: dict[str, bytes]


def read_backup(src: Path | BinaryIO, passphrase: str) -> _Contents:
    """Open, check and decode a backup: a file path, or a binary stream (standard input).

    Raises:
        BackupError: not a Loki backup, wrong passphrase, damaged or truncated, or a format
            this version does not know.
    """
    manifest: dict[str, Any] | None = None
    key = b""
    redis_keys: list[redis_part.RedisKey] = []
    streams: list[jetstream_part.StreamCopy] = []
    files: dict[str, bytes] = {}
    path = src if isinstance(src, str | Path) else "the backup"
    try:
        with contextlib.ExitStack() as stack:
            if isinstance(src, str | Path):
                src = stack.enter_context(open(src, "rb"))
            reader = io.BufferedReader(SealedReader(src, passphrase), buffer_size=1 << 16)
            with tarfile.open(fileobj=reader, mode="r|gz") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    fh = tar.extractfile(member)
                    data = fh.read() if fh else b""
                    name = member.name
                    if name == "manifest.json":
                        manifest = json.loads(data)
                        if manifest.get("format") != FORMAT:
                            raise BackupError(
                                f"backup format {manifest.get('format')} is not {FORMAT}"
                            )
                    elif name == "keys/service.key":
                        key = base64.b64decode(data.strip(), validate=True)
                    elif name == "redis/keys.jsonl":
                        redis_keys = [
                            redis_part.RedisKey.from_json(json.loads(line))
                            for line in data.splitlines()
                            if line.strip()
                        ]
                    elif name.startswith("jetstream/"):
                        body = json.loads(data)
                        streams.append(
                            jetstream_part.StreamCopy(
                                body["name"],
                                body["config"],
                                body.get("identity", ""),
                                [jetstream_part.StoredMsg.from_json(m) for m in body["messages"]],
                            )
                        )
                    elif name.startswith("home/"):
                        files[name[len("home/") :]] = data
            # The tar stream ends before the sealed file does: reading on checks the end.
            while reader.read(1 << 16):
                pass
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc}") from exc
    except BackupFileError as exc:
        raise BackupError(str(exc)) from exc
    except (tarfile.TarError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"damaged backup {path}: {exc}") from exc
    if manifest is None or len(key) != 32:
        raise BackupError(f"{path} lacks its manifest or its service key")
    return _Contents(manifest, key, redis_keys, streams, files)


async def restore_backup(src: Path | BinaryIO, passphrase: str, target: Target) -> BackupSummary:
    """Restore the backup ``src`` (a file path, or a binary stream) into the empty stack
    ``target``.

    Every precondition is checked before anything is written: Redis holds no ``loki:*`` key,
    no Loki stream of the backup holds messages, and ``LOKI_HOME`` holds no other key and no
    other file of the same name. Then the service key (``secret.key``, unless the target's
    ``LOKI_SECRET_KEY`` is the backup's key), the Redis keys (one transaction), the streams and
    the files are written.

    Raises:
        BackupError: the file cannot be read (see :func:`read_backup`) or the target is not
            empty; nothing was written. A failure while writing says what was written.
    """
    contents = read_backup(src, passphrase)
    client = redis_from_url(target.redis_url)
    nc = await _connect_nats(target.nats_url)
    try:
        js = nc.jetstream()
        try:
            write_key = home_part.check_target(
                target.home, target.secret_key, contents.key, contents.files
            )
            await redis_part.ensure_empty(client)
            await jetstream_part.ensure_empty(js, [c.name for c in contents.streams])
        except (
            home_part.HomeBackupError,
            redis_part.RedisBackupError,
            jetstream_part.JetStreamBackupError,
        ) as exc:
            raise BackupError(f"{exc} (nothing was restored)") from exc
        step = "the service key"
        try:
            home_part.write_files(target.home, {}, contents.key if write_key else None)
            step = "Redis"
            await redis_part.load(client, contents.redis_keys)
            step = "JetStream"
            await jetstream_part.load(js, contents.streams)
            step = "LOKI_HOME files"
            home_part.write_files(target.home, contents.files, None)
        except Exception as exc:  # whatever fails mid-restore: the step is named, not hidden
            raise BackupError(
                f"restore failed while writing {step}: {exc}; the target is partly restored: "
                "empty it before trying again"
            ) from exc
    finally:
        await client.aclose()
        await nc.close()
    c = contents.manifest.get("contents", {})
    return BackupSummary(
        redis_keys=len(contents.redis_keys),
        redis_volatile_skipped=int(c.get("redis_volatile_skipped", 0)),
        streams={s.name: len(s.messages) for s in contents.streams},
        files=sorted(contents.files),
        created=float(contents.manifest.get("created", 0.0)),
    )


async def _connect_nats(url: str) -> NATS:
    try:
        return await nats.connect(
            nats_servers(url), connect_timeout=5, max_reconnect_attempts=0, **url_login(url)
        )
    except Exception as exc:  # any connect failure is the backup's error, said as such
        raise BackupError(f"cannot reach NATS at {redact(url)}: {exc}") from exc


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))
