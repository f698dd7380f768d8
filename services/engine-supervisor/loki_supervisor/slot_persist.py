"""SLOT_PERSIST (the seeds' grey-zone key, off by default): slot 0's state survives an
engine restart.

With the key on, for a launched engine with ``--slot-save-path``:

- after a ``main`` lease of a conversation is released, once the engine stayed idle for
  :data:`IDLE_S` (no lease held or waited for, nothing else ran on slot 0 since), slot 0 is
  saved with llama.cpp's ``POST /slots/0?action=save`` ``{"filename": ...}`` under the name
  :mod:`loki_supervisor.slot_files` gives (model file, ``n_ctx``, conversation, prompt
  fingerprint); leases wait while it runs;
- before a planned stop (``loki up`` stopped, a preset applied) the same save runs when the
  slot holds a turn not saved yet;
- when a launched engine becomes ready (first start, a restart after a crash, a preset
  applied), stale files are deleted (:func:`~loki_supervisor.slot_files.stale_files`) and the
  file of the conversation that owned the slot is restored with ``action=restore`` before
  any lease is granted.

Off: nothing is saved or restored, and the slot directory is emptied at every launch (as
before the key existed). A failed save or restore is logged and never blocks a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import slot_files
from .engine_process import slot_action
from .lease_book import LeaseManager

log = logging.getLogger(__name__)

#: Seconds without any lease after a turn before slot 0 is saved (a tool call's next step or
#: the user's next message usually comes sooner or much later).
IDLE_S = 2.0
#: Bound of one save or restore request (s): a large slot is written at disk speed.
SAVE_TIMEOUT_S = 60.0
#: llama-server writes a save under this prefix; the file is renamed once complete (a name
#: with it is a foreign file for :func:`~loki_supervisor.slot_files.stale_files`).
PART_PREFIX = "part-"


@dataclass(frozen=True)
class PersistConfig:
    """SLOT_PERSIST for one launch: the slot directory (``--slot-save-path``), the model
    file's key, and the size limit of all kept files (bytes)."""

    slot_dir: Path
    model: str
    max_bytes: int


@dataclass
class Owner:
    """The conversation whose prompt slot 0 holds: its hex keys, the ``generation`` of the
    slot when its turn ended, and whether that state is on disk."""

    conversation: str
    fingerprint: str
    generation: int
    saved: bool = False


class SlotPersister:
    """Saves and restores slot 0 for the supervisor (see the module docstring).

    Args:
        leases: the lease manager (a save waits for no lease held or waited for, and
            pauses it while it runs).
        client: the HTTP client the saves and restores use.
    """

    def __init__(self, leases: LeaseManager, client: httpx.AsyncClient | None = None) -> None:
        self.leases = leases
        self._client = client or httpx.AsyncClient(timeout=SAVE_TIMEOUT_S)
        self.config: PersistConfig | None = None
        self.base_url = ""
        self.api_key: str | None = None
        self.n_ctx = 0
        self.owner: Owner | None = None
        self.generation = 0
        self.last: dict[str, Any] = {}
        self._idle: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ configuration
    def configure(self, config: PersistConfig | None) -> None:
        """Use ``config`` for the next launch (None: SLOT_PERSIST off or impossible)."""
        self.cancel_idle()
        self.config = config
        self.owner = None

    @property
    def enabled(self) -> bool:
        return self.config is not None

    # ------------------------------------------------------------------ events
    def slot_used(self) -> None:
        """Something other than the owner's turn ran on slot 0 (a side job, a compaction,
        an erase): its content is no longer the owner's, so it is not saved as theirs."""
        self.generation += 1
        self.cancel_idle()

    def turn_done(self, conversation: str | None, fingerprint: str | None) -> None:
        """A ``main`` lease of ``conversation`` was released: slot 0 holds its prompt and
        reply; save it once the engine is idle."""
        self.generation += 1
        if not self.enabled or not conversation:
            self.owner = None
            return
        self.owner = Owner(
            slot_files.conversation_key(conversation),
            slot_files.fingerprint_key(fingerprint),
            self.generation,
        )
        self.cancel_idle()
        self._idle = asyncio.create_task(self._save_when_idle(), name="slot-persist-idle")

    def cancel_idle(self) -> None:
        task, self._idle = self._idle, None
        if task is not None and not task.done():
            task.cancel()

    async def _save_when_idle(self) -> None:
        await asyncio.sleep(IDLE_S)
        if self.leases.in_flight or self.leases.waiting:
            return  # a request runs or waits: its release decides again
        await self.save("idle")

    # ------------------------------------------------------------------ engine
    def engine_ready(self, base_url: str, api_key: str | None, n_ctx: int) -> None:
        """Where the engine answers now, and slot 0's ``n_ctx``."""
        self.base_url = base_url
        self.api_key = api_key
        self.n_ctx = n_ctx

    def key(self, owner: Owner) -> slot_files.SlotKey | None:
        if self.config is None or self.n_ctx <= 0:
            return None
        return slot_files.SlotKey(
            self.config.model, self.n_ctx, owner.conversation, owner.fingerprint
        )

    async def _post(self, action: str, filename: str, timeout: float) -> dict[str, Any]:
        return await slot_action(
            self._client, self.base_url, self.api_key, 0, action, filename, timeout
        )

    async def save(self, why: str, timeout: float = SAVE_TIMEOUT_S) -> str | None:
        """Save slot 0 as its owner's file when it holds a turn not saved yet (leases
        paused meanwhile), then delete that conversation's older files and the stale ones.
        Returns None when saved, else why not (logged at INFO for a failure)."""
        async with self._lock:
            owner = self.owner
            if self.config is None:
                return "SLOT_PERSIST off"
            if owner is None:
                return "no conversation owns slot 0"
            if owner.saved:
                return "already saved"
            if owner.generation != self.generation:
                return "slot 0 was used since the turn"
            key = self.key(owner)
            if key is None or not self.base_url:
                return "engine not ready"
            self.leases.pause()
            started = time.monotonic()
            try:
                if self.leases.in_flight:
                    return "a request is running on the engine"
                body = await self._post("save", PART_PREFIX + key.filename, timeout)
                # written under a temporary name, then renamed: a save cut short (a crash,
                # a stop) never leaves a truncated file under a name that would be restored
                os.replace(
                    self.config.slot_dir / (PART_PREFIX + key.filename),
                    self.config.slot_dir / key.filename,
                )
            except (httpx.HTTPError, RuntimeError, ValueError, OSError) as exc:
                reason = f"save failed ({why}): {exc.__class__.__name__}: {exc}"
                log.info("slot 0 %s", reason)
                self.last = {"action": "save", "error": reason}
                return reason
            finally:
                self.leases.resume()
            owner.saved = True
            self.last = {
                "action": "save",
                "why": why,
                "file": key.filename,
                "n_saved": body.get("n_saved"),
                "n_written": body.get("n_written"),
                "ms": round((time.monotonic() - started) * 1000, 1),
            }
            log.info(
                "slot 0 saved (%s): %s tokens, %s bytes in %s",
                why,
                body.get("n_saved"),
                body.get("n_written"),
                key.filename,
            )
            await asyncio.to_thread(self.cleanup)
            return None

    def cleanup(self) -> dict[str, str]:
        """Delete the stale files of the slot directory (see
        :func:`~loki_supervisor.slot_files.stale_files`); returns name → reason."""
        if self.config is None or self.n_ctx <= 0:
            return {}
        files = slot_files.list_dir(self.config.slot_dir)
        doomed = slot_files.stale_files(
            files, self.config.model, self.n_ctx, time.time(), self.config.max_bytes
        )
        for name, reason in doomed.items():
            with contextlib.suppress(OSError):
                (self.config.slot_dir / name).unlink()
            log.info("slot file %s deleted: %s", name, reason)
        return doomed

    async def restore(self) -> str | None:
        """After a launch: delete stale files, then restore the owner's file into slot 0
        (leases paused meanwhile by the caller). Returns None when restored, else why not."""
        async with self._lock:
            if self.config is None:
                return "SLOT_PERSIST off"
            await asyncio.to_thread(self.cleanup)
            found = slot_files.owner_file(
                slot_files.list_dir(self.config.slot_dir), self.config.model, self.n_ctx
            )
            if found is None:
                self.last = {"action": "restore", "error": "no slot file to restore"}
                return "no slot file to restore"
            key = slot_files.parse(found.name)
            assert key is not None
            started = time.monotonic()
            try:
                body = await self._post("restore", found.name, SAVE_TIMEOUT_S)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                reason = f"restore failed: {exc.__class__.__name__}: {exc}"
                log.warning("slot 0 %s", reason)
                self.last = {"action": "restore", "error": reason}
                return reason
            self.generation += 1
            self.owner = Owner(key.conversation, key.fingerprint, self.generation, saved=True)
            self.last = {
                "action": "restore",
                "file": found.name,
                "n_restored": body.get("n_restored"),
                "n_read": body.get("n_read"),
                "ms": round((time.monotonic() - started) * 1000, 1),
            }
            log.info("slot 0 restored: %s tokens from %s", body.get("n_restored"), found.name)
            return None

    async def close(self) -> None:
        self.cancel_idle()
        await self._client.aclose()
