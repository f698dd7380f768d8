"""Slot transfer between pooled engines (issue 44; only with ``LOKI_ENGINE_SLOT_DIR``, the
directory every followed engine got as ``--slot-save-path``, seen by the supervisor under
the same path).

A conversation's prompt cache moves with it through files of that directory, written and
read by llama.cpp's ``POST /slots/{id_slot}?action=save|restore`` ``{"filename": ...}``
(answers: ``n_saved``/``n_written``/``timings.save_ms``, ``n_restored``/``n_read``/
``timings.restore_ms``). Files are named by :class:`~loki_supervisor.slot_files.SlotKey`
(model: :attr:`EngineRef.file_model`, the engine's ``model_path`` and slot count;
the slot's ``n_ctx``; the conversation; the prompt's last cumulative fingerprint).

- *evict-save* (:meth:`SlotTransfer.before_grant`): a grant about to run another
  conversation on a slot holding conversation X's ``main`` prompt not yet on disk saves the
  slot as X's file first;
- *restore* (same call): a ``main``-like grant (:data:`MAIN_LIKE`) of a conversation on a
  slot sharing fewer messages with the request than one of the conversation's files does
  (the file's fingerprint is in the request's list, at index ``i``, and ``i + 1 > prefix``)
  restores that file into the slot: ``transfer = "restored"``; a moved grant
  (``moved_from``) that no file helps is ``"recomputed"``;
- *idle-save* (:meth:`SlotTransfer.after_release`): a slot idle :data:`IDLE_S` seconds
  after a ``main`` turn is saved (insurance against losing its engine).

One file per conversation is kept (the newest) and all files together stay below
``max_bytes`` (oldest deleted): :func:`~loki_supervisor.slot_files.pool_stale_files`. A
save is written under a temporary name and renamed once complete. A failed save or restore
is logged and returned as ``TransferOutcome.error``; it never fails the grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from . import slot_files
from .engine_process import slot_action

log = logging.getLogger(__name__)

#: Seconds a slot stays without a grant after a ``main`` turn before it is saved (as
#: SLOT_PERSIST's ``IDLE_S``: a tool call's next step or the user's next message usually
#: comes sooner or much later).
IDLE_S = 2.0
#: Bound of one save or restore request (s): a large slot is written at disk speed.
SAVE_TIMEOUT_S = 60.0
PART_PREFIX = slot_files.PART_PREFIX

__all__ = [
    "IDLE_S",
    "MAIN_LIKE",
    "EngineRef",
    "GrantFacts",
    "Occupant",
    "SlotTransfer",
    "TransferOutcome",
]

#: Lease kinds whose grant restores the conversation's file (the continuation of a
#: conversation's prompt); side kinds never do.
MAIN_LIKE = frozenset({"main", "prewarm", "compact"})


@dataclass(frozen=True)
class EngineRef:
    """A pooled engine as the transfer sees it: its id (name, else ``host:port``), base URL,
    API key (None: none), model name (``/props`` ``model_path``), per-slot ``n_ctx``
    (tokens) and ``total_slots`` (``/props``; 0: unknown).

    A slot file restores only into an engine of the same model, per-slot ``n_ctx`` and number
    of slots: llama-server refuses a file saved on an engine with another slot count even when
    the slot's ``n_ctx`` is the same (HTTP 400 "invalid slot save file", seen with 4 slots
    against 2), and the slot it was restored into is then left empty. :attr:`file_model` keys
    the files by all three."""

    id: str
    base_url: str
    api_key: str | None
    model: str
    n_ctx: int
    total_slots: int = 0

    @property
    def file_model(self) -> str:
        """The model part of this engine's slot file names (12 hex characters): the model's
        name and, when known, the engine's slot count."""
        layout = f"{self.model}|slots={self.total_slots}" if self.total_slots else self.model
        return slot_files.model_name_key(layout)


@dataclass(frozen=True)
class Occupant:
    """The conversation whose ``main`` prompt a slot holds: its id, the cumulative
    fingerprints of that prompt (:mod:`loki_shared.fingerprint`), and whether that state is
    already on disk."""

    conversation: str
    fingerprints: tuple[str, ...]
    saved: bool


@dataclass(frozen=True)
class GrantFacts:
    """What the pool decided for one grant: the engine and ``id_slot`` it runs on, the
    lease ``kind``, the conversation and the request's cumulative fingerprints, ``prefix``
    (how many leading messages the slot's last prompt shares with the request), what the
    slot holds (``occupant``; None: empty, side-only or this conversation's), and the engine
    the conversation was moved from (None: not moved)."""

    engine: EngineRef
    id_slot: int
    kind: str
    conversation: str | None
    fingerprints: tuple[str, ...]
    prefix: int
    occupant: Occupant | None
    moved_from: str | None


@dataclass
class TransferOutcome:
    """What :meth:`SlotTransfer.before_grant` did: whether the occupant's state is now on
    disk (``saved_occupant``), ``transfer`` for ``Placement.transfer`` (None: nothing to
    say), the tokens a restore put in the slot, the file restored, and the errors met
    (``; ``-joined; the grant goes on regardless)."""

    saved_occupant: bool = False
    transfer: Literal["restored", "recomputed"] | None = None
    restored_tokens: int | None = None
    file: str | None = None
    error: str | None = None

    def add_error(self, reason: str) -> None:
        """Append ``reason`` to :attr:`error`."""
        self.error = reason if self.error is None else f"{self.error}; {reason}"


class SlotTransfer:
    """Saves and restores pooled slots through the shared slot directory (see the module
    docstring).

    Args:
        slot_dir: the directory (None: transfer off, every call does nothing).
        client: the HTTP client for the slot actions (default: one of this object's, closed
            by :meth:`close`); each call is bounded by ``SAVE_TIMEOUT_S`` seconds.
        max_bytes: the bound of all Loki slot files of the directory together (bytes).
    """

    def __init__(
        self,
        slot_dir: Path | None,
        client: httpx.AsyncClient | None = None,
        max_bytes: int = slot_files.DEFAULT_MAX_MB * 1024 * 1024,
    ) -> None:
        self.slot_dir = slot_dir
        self.max_bytes = max_bytes
        self.enabled = slot_dir is not None
        #: why the transfer turned itself off (None: it did not; see :meth:`_not_shared`)
        self.off_reason: str | None = None
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=SAVE_TIMEOUT_S)
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._idle: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._running: set[asyncio.Task[None]] = set()
        #: (conversation key, fingerprint key) a slot's present content is saved as.
        self._saved: dict[tuple[str, int], tuple[str, str]] = {}
        self._in_use: set[str] = set()
        #: the last save or restore (for the supervisor's info and the logs).
        self.last: dict[str, Any] = {}
        #: counts: ``saves``, ``restores``, ``failures``.
        self.counts: dict[str, int] = {"saves": 0, "restores": 0, "failures": 0}

    # ------------------------------------------------------------------ grant
    async def before_grant(self, facts: GrantFacts) -> TransferOutcome:
        """Evict-save, then restore, for one grant about to run on ``facts.id_slot`` (the
        lease is held meanwhile: nothing else runs there). Never raises for an engine or
        file error: see ``TransferOutcome.error``."""
        out = TransferOutcome()
        if not self.enabled:
            return out
        slot = (facts.engine.id, facts.id_slot)
        self._cancel_idle(slot)
        async with self._lock(slot):
            occupant = facts.occupant
            if (
                occupant is not None
                and not occupant.saved
                and occupant.conversation != facts.conversation
                and occupant.fingerprints
            ):
                key = self._key(facts.engine, occupant.conversation, occupant.fingerprints[-1])
                if self._saved.get(slot) == (key.conversation, key.fingerprint):
                    out.saved_occupant = True  # the idle-save got there first
                else:
                    err = await self._save(facts.engine, facts.id_slot, key, "evict")
                    if err is None:
                        out.saved_occupant = True
                    else:
                        out.add_error(err)
            self._saved.pop(slot, None)  # the slot is about to run something else
            if facts.kind in MAIN_LIKE and facts.conversation and facts.fingerprints:
                await self._restore_best(facts, out)
                if out.transfer is None and facts.moved_from is not None:
                    out.transfer = "recomputed"
        return out

    def best_file(self, facts: GrantFacts) -> tuple[str, int] | None:
        """The file of ``facts.conversation`` (same model and ``n_ctx`` as the engine)
        whose fingerprint is at the greatest index of ``facts.fingerprints``, with the
        number of messages it covers (index + 1); None when there is none."""
        if self.slot_dir is None or not facts.conversation:
            return None
        model = facts.engine.file_model
        conversation = slot_files.conversation_key(facts.conversation)
        index = {slot_files.fingerprint_key(fp): i for i, fp in enumerate(facts.fingerprints)}
        index.pop(slot_files.NO_FINGERPRINT, None)
        best: tuple[str, int] | None = None
        for f in slot_files.list_dir(self.slot_dir):
            key = slot_files.parse(f.name)
            if (
                key is None
                or key.model != model
                or key.n_ctx != facts.engine.n_ctx
                or key.conversation != conversation
                or key.fingerprint not in index
            ):
                continue
            covered = index[key.fingerprint] + 1
            if best is None or covered > best[1]:
                best = (f.name, covered)
        return best

    async def _restore_best(self, facts: GrantFacts, out: TransferOutcome) -> None:
        found = await asyncio.to_thread(self.best_file, facts)
        if found is None or found[1] <= facts.prefix:
            return
        name, _covered = found
        self._in_use.add(name)
        started = time.monotonic()
        try:
            body = await self._post(facts.engine, facts.id_slot, "restore", name)
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            reason = (
                f"restore of {name} on {facts.engine.id} slot {facts.id_slot} failed: {_why(exc)}"
            )
            log.warning("%s", reason)
            self.counts["failures"] += 1
            self.last = {"action": "restore", "engine": facts.engine.id, "error": reason}
            out.add_error(reason)
            return
        finally:
            self._in_use.discard(name)
        n_restored = body.get("n_restored")
        if n_restored == 0:
            # an empty file (saved from an empty slot by an older supervisor): nothing was
            # restored, and it never will be
            log.info("slot file %s restored no token: deleted", name)
            if self.slot_dir is not None:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread((self.slot_dir / name).unlink)
            return
        out.transfer = "restored"
        out.restored_tokens = n_restored if isinstance(n_restored, int) else None
        out.file = name
        self.counts["restores"] += 1
        self.last = {
            "action": "restore",
            "engine": facts.engine.id,
            "id_slot": facts.id_slot,
            "file": name,
            "n_restored": n_restored,
            "n_read": body.get("n_read"),
            "ms": round((time.monotonic() - started) * 1000, 1),
        }
        log.info(
            "slot %s/%d restored: %s tokens from %s",
            facts.engine.id,
            facts.id_slot,
            n_restored,
            name,
        )

    # ------------------------------------------------------------------ release
    def after_release(
        self,
        engine: EngineRef,
        id_slot: int,
        conversation: str,
        fingerprints: tuple[str, ...],
        still_idle: Callable[[], bool],
        on_saved: Callable[[str], None],
    ) -> None:
        """A ``main`` turn of ``conversation`` (prompt ``fingerprints``) ended on the slot:
        after :data:`IDLE_S` seconds, if ``still_idle()`` (no grant on the slot since), save
        it as the conversation's file, then call ``on_saved`` with the prompt's last
        fingerprint. A grant on the slot meanwhile cancels it (:meth:`before_grant`). Does
        nothing when off or without a conversation or fingerprints."""
        if not self.enabled or not conversation or not fingerprints:
            return
        slot = (engine.id, id_slot)
        self._cancel_idle(slot)
        task = asyncio.create_task(
            self._idle_save(engine, id_slot, conversation, fingerprints[-1], still_idle, on_saved),
            name=f"slot-idle-save-{engine.id}-{id_slot}",
        )
        self._idle[slot] = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _idle_save(
        self,
        engine: EngineRef,
        id_slot: int,
        conversation: str,
        fingerprint: str,
        still_idle: Callable[[], bool],
        on_saved: Callable[[str], None],
    ) -> None:
        slot = (engine.id, id_slot)
        await asyncio.sleep(IDLE_S)
        if self._idle.get(slot) is asyncio.current_task():
            del self._idle[slot]  # saving from here on: a grant waits for it, not cancels it
        if not still_idle():
            return
        async with self._lock(slot):
            if not still_idle():
                return
            key = self._key(engine, conversation, fingerprint)
            if self._saved.get(slot) == (key.conversation, key.fingerprint):
                return
            if await self._save(engine, id_slot, key, "idle") is not None:
                return
        try:
            on_saved(fingerprint)
        except Exception:  # the caller's bookkeeping must not kill the task: logged
            log.exception("on_saved of slot %s/%d failed", engine.id, id_slot)

    def _cancel_idle(self, slot: tuple[str, int]) -> None:
        task = self._idle.pop(slot, None)
        if task is not None and not task.done():
            task.cancel()

    # ------------------------------------------------------------------ files
    def _lock(self, slot: tuple[str, int]) -> asyncio.Lock:
        return self._locks.setdefault(slot, asyncio.Lock())

    @staticmethod
    def _key(engine: EngineRef, conversation: str, fingerprint: str) -> slot_files.SlotKey:
        return slot_files.SlotKey(
            engine.file_model,
            engine.n_ctx,
            slot_files.conversation_key(conversation),
            slot_files.fingerprint_key(fingerprint),
        )

    async def _save(
        self, engine: EngineRef, id_slot: int, key: slot_files.SlotKey, why: str
    ) -> str | None:
        """Save the slot as ``key``'s file (temporary name, then renamed), then clean the
        directory. Returns None when saved, else why not."""
        assert self.slot_dir is not None
        slot = (engine.id, id_slot)
        # one temporary name per slot: two slots saving the same key never share it
        token = slot_files.conversation_key(f"{engine.id}/{id_slot}")
        part = f"{PART_PREFIX}{token}-{key.filename}"
        started = time.monotonic()
        try:
            body = await self._post(engine, id_slot, "save", part)
            if body.get("n_saved") == 0:
                # the slot holds nothing (the engine restarted between two probes, or the
                # granted turn never reached it): a file under this name would replace the
                # conversation's good one with an empty one, and be "restored" for nothing
                with contextlib.suppress(OSError):
                    await asyncio.to_thread((self.slot_dir / part).unlink)
                reason = f"save ({why}) of {engine.id} slot {id_slot}: the slot is empty"
                log.info("%s: no file written", reason)
                self.last = {"action": "save", "engine": engine.id, "skipped": reason}
                return reason
            # written under a temporary name, then renamed: a save cut short never leaves a
            # truncated file under a name that would be restored
            if not await self._appears(self.slot_dir / part):
                return self._not_shared(engine, part)
            await asyncio.to_thread(os.replace, self.slot_dir / part, self.slot_dir / key.filename)
        except (httpx.HTTPError, RuntimeError, ValueError, OSError) as exc:
            reason = f"save ({why}) of {engine.id} slot {id_slot} failed: {_why(exc)}"
            log.warning("%s", reason)
            self.counts["failures"] += 1
            self.last = {"action": "save", "engine": engine.id, "error": reason}
            return reason
        self._saved[slot] = (key.conversation, key.fingerprint)
        self.counts["saves"] += 1
        self.last = {
            "action": "save",
            "why": why,
            "engine": engine.id,
            "id_slot": id_slot,
            "file": key.filename,
            "n_saved": body.get("n_saved"),
            "n_written": body.get("n_written"),
            "ms": round((time.monotonic() - started) * 1000, 1),
        }
        log.info(
            "slot %s/%d saved (%s): %s tokens, %s bytes in %s",
            engine.id,
            id_slot,
            why,
            body.get("n_saved"),
            body.get("n_written"),
            key.filename,
        )
        await asyncio.to_thread(self.cleanup)
        return None

    @staticmethod
    async def _appears(path: Path, tries: int = 5, pause_s: float = 0.2) -> bool:
        """``path`` is a file, now or within ``tries`` looks ``pause_s`` apart (a network
        file system may show another machine's new file a moment late)."""
        for i in range(tries):
            if await asyncio.to_thread(path.is_file):
                return True
            if i + 1 < tries:
                await asyncio.sleep(pause_s)
        return False

    def _not_shared(self, engine: EngineRef, part: str) -> str:
        """The engine answered a save but its file is not in :attr:`slot_dir`: the engine's
        ``--slot-save-path`` is not this directory (not mounted, another path, missing).
        Every later save would only fill the engine's disk with files no one reads or
        deletes, and no restore can work: the transfer turns itself off (:attr:`off_reason`)
        until the supervisor restarts. Returns why."""
        reason = (
            f"the engine {engine.id} saved {part!r} but the file is not in {self.slot_dir}: "
            "LOKI_ENGINE_SLOT_DIR must be the directory every engine got as --slot-save-path "
            "(shared, same path); slot transfer is off until the supervisor restarts"
        )
        log.error("%s", reason)
        self.enabled = False
        self.off_reason = reason
        for slot in list(self._idle):
            self._cancel_idle(slot)
        self.counts["failures"] += 1
        self.last = {"action": "save", "engine": engine.id, "error": reason}
        return reason

    def cleanup(self) -> dict[str, str]:
        """Delete the directory's stale files (see
        :func:`~loki_supervisor.slot_files.pool_stale_files`; a file being restored stays);
        returns name → reason."""
        if self.slot_dir is None:
            return {}
        doomed = slot_files.pool_stale_files(
            slot_files.list_dir(self.slot_dir),
            time.time(),
            self.max_bytes,
            part_prefix=PART_PREFIX,
            keep=set(self._in_use),
        )
        for name, reason in doomed.items():
            with contextlib.suppress(OSError):
                (self.slot_dir / name).unlink()
            log.info("slot file %s deleted: %s", name, reason)
        return doomed

    async def _post(
        self, engine: EngineRef, id_slot: int, action: str, filename: str
    ) -> dict[str, Any]:
        return await slot_action(
            self._client, engine.base_url, engine.api_key, id_slot, action, filename, SAVE_TIMEOUT_S
        )

    async def close(self) -> None:
        """Cancel the pending idle-saves (one already saving is awaited) and close the
        client when it is this object's."""
        for slot in list(self._idle):
            self._cancel_idle(slot)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._own_client:
            await self._client.aclose()


def _why(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
