"""The index snapshot: the index of service-key blocks saved to one file, so a restart reads
only the blocks stored since.

The file holds :meth:`loki_recall.index.Index.to_arrays` plus ``private`` (the seqs of memory
blocks, never their words) as an ``npz``, sealed with the service key under associated data
``loki:recall:index-snapshot:<archive id>``; the archive id is a random name kept in Redis
``loki:recall:archive_id``, so a snapshot is never used on another archive. It is written to a
temporary file and renamed: a crash leaves the previous snapshot.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
from redis.asyncio import Redis

from loki_shared.sealing import Sealer, SealError

from .index import Index

#: A random name of this archive, so an index snapshot is never used on another archive.
ARCHIVE_ID_KEY = "loki:recall:archive_id"
#: An index snapshot is written after this many newly indexed blocks, and at stop.
SNAPSHOT_EVERY = 20_000

log = logging.getLogger("loki.recall.archive")


async def archive_id(redis: Redis) -> str:
    """This archive's random name (created on first use). Raises ``RedisError``."""
    await redis.set(ARCHIVE_ID_KEY, secrets.token_hex(16), nx=True)
    return cast(bytes, await redis.get(ARCHIVE_ID_KEY)).decode("ascii")


class Snapshot:
    """The snapshot file of one archive, and when to write it.

    Args:
        path: the file (None: no snapshot; every method is then a no-op).
        sealer: the service key's sealer.
        arrays: returns the arrays to save (called on the event loop; the file is written in
            a worker thread).
    """

    def __init__(
        self,
        path: Path | None,
        sealer: Sealer,
        arrays: Callable[[], dict[str, np.ndarray]],
    ) -> None:
        self.path = path
        self.sealer = sealer
        self.arrays = arrays
        self.archive_id = ""
        #: Blocks indexed since the last save.
        self.since = 0
        self._saving: asyncio.Task[None] | None = None

    def _aad(self) -> bytes:
        return b"loki:recall:index-snapshot:" + self.archive_id.encode("ascii")

    def read(self) -> tuple[Index, set[int]] | None:
        """The saved index and memory-block seqs, or None (absent, other archive, damaged)."""
        if self.path is None or not self.path.exists():
            return None
        try:
            raw = self.sealer.open(self.path.read_bytes(), self._aad())
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            private = {int(x) for x in arrays.pop("private")}
            return Index.from_arrays(arrays), private
        except (OSError, SealError, KeyError, ValueError) as exc:
            log.warning("index snapshot not used: %s", exc)
            return None

    async def save(self) -> None:
        """Write the snapshot now (no-op without a path or before the archive id is known).

        Raises:
            OSError: the file could not be written.
        """
        if self.path is None or not self.archive_id:
            return
        self.since = 0
        arrays = self.arrays()
        aad, path, sealer = self._aad(), self.path, self.sealer

        def write() -> None:
            buf = io.BytesIO()
            np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy types ** as allow_pickle
            blob = sealer.seal(buf.getvalue(), aad)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, path)

        t0 = time.monotonic()
        await asyncio.to_thread(write)
        log.info(
            "index snapshot saved: %d blocks, %.1f s",
            len(arrays.get("seqs", ())),
            time.monotonic() - t0,
        )

    def maybe(self) -> None:
        """Start a save in the background after :data:`SNAPSHOT_EVERY` newly indexed blocks
        (one save at a time)."""
        if (
            self.path is not None
            and self.since >= SNAPSHOT_EVERY
            and (self._saving is None or self._saving.done())
        ):
            self._saving = asyncio.create_task(self.save())

    def after_load(self) -> None:
        """After a start-up that indexed a quarter of :data:`SNAPSHOT_EVERY` or more blocks
        itself, save soon (the next restart reads fewer)."""
        if self.since >= SNAPSHOT_EVERY // 4:
            self.since = SNAPSHOT_EVERY
            self.maybe()

    async def close(self) -> None:
        """Wait for a save in flight; save again when blocks were indexed since."""
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)
        if self.since:
            try:
                await self.save()
            except OSError as exc:
                log.warning("index snapshot not saved: %s", exc)
