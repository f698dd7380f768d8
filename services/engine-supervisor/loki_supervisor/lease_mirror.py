"""The leader's leases and slot book, mirrored into Redis so that a new leader keeps them
(``LOKI_SUPERVISOR_REPLICATED``, see :mod:`.leadership`).

Keys (the supervisor's ACL pattern ``loki:engine:*``):

- ``loki:engine:leases`` (:data:`LEASES_KEY`): a hash, lease id -> the JSON of one
  :class:`~loki_supervisor.lease_book.Held` (:func:`record`): the :class:`Lease` without its
  ``api_key`` (never stored: filled again from the current target on load), ``queue``,
  ``conversation``, ``holder``, ``claimed``, the deadline as wall-clock seconds, and the
  pool's fields (``slot``, ``fingerprints``, ``occupant``). Ids and fingerprints only: no
  prompt text, no secret, so it is stored plain.
- ``loki:engine:slotbook`` (:data:`BOOK_KEY`): the pool's
  :meth:`~loki_supervisor.slot_book.SlotBook.snapshot` (JSON), with the pool's per-engine
  counters under ``counters`` (engine id -> ``grants``, ``moves_in``, ``restores``, ``saves``:
  what ``/api/engine`` shows goes on counting after a takeover).

:meth:`LeaseMirror.sync` writes what changed in the lease manager since the last write (grants,
renewals, releases, expiries, pre-emptions: a diff, so the lease book needs no hook) in one
Lua step fenced by the leader's term: refused when ``loki:engine:leader`` no longer holds this
leader's ``"<epoch>:<instance>"``. The leader syncs before it answers each lease, renewal and
release, and every :data:`SYNC_EVERY_S` for what its reaper did.

:meth:`LeaseMirror.load` (a new leader, before it grants) puts the mirrored leases back into
:attr:`LeaseManager.held`: each lease's deadline becomes ``max(stored deadline, now)`` plus
its TTL (claimed) or the claim window (not yet claimed): the takeover time is not counted
against the holders, whose renewals failed meanwhile. A lease whose stored deadline is more
than ``grace_s`` in the past (every supervisor was down for longer than a takeover) is
dropped. Their holders count as seen now (a late claim does not drop them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import typing
from collections.abc import Callable
from typing import Any

from loki_shared.messages.engine import Lease

from .leadership import LEADER_KEY, Term
from .lease_book import Held, LeaseManager
from .slot_book import SlotBook, SlotEntry

log = logging.getLogger("loki_supervisor.lease_mirror")

LEASES_KEY = "loki:engine:leases"
BOOK_KEY = "loki:engine:slotbook"
#: Seconds between two syncs of what the reaper changed (expiries, pre-emptions).
SYNC_EVERY_S = 0.5
#: Lifetime of the mirror's keys after the last write (ms): a whole stack stopped for longer
#: starts with no leases (they would all be past their deadline anyway).
KEYS_PX = 3_600_000
#: Held's fields that are not copied as they are (the deadline is stored as wall time).
_OWN = ("lease", "deadline", "granted_at")

# KEYS[1] leader key, KEYS[2] leases hash, KEYS[3] book key.
# ARGV[1] the term's value, ARGV[2] px, ARGV[3] n set, then n (id, json) pairs, then n del,
# then the ids, then the book's JSON ('' : unchanged).
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local px = tonumber(ARGV[2])
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]); i = i + 2
end
local d = tonumber(ARGV[i]); i = i + 1
for _ = 1, d do
  redis.call('HDEL', KEYS[2], ARGV[i]); i = i + 1
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], px) end
if ARGV[i] ~= '' then redis.call('SET', KEYS[3], ARGV[i], 'PX', px) end
return 1
"""


class Fenced(Exception):
    """The write was refused: this instance is no longer the leader of that term."""


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool | dict):
        return value
    raise TypeError(type(value).__name__)


def record(held: Held, offset: float) -> dict[str, Any]:
    """One held lease as JSON-able data (``offset``: wall time minus monotonic time, s).

    The lease's ``api_key`` is left out; Held's other fields are copied when they are JSON
    data, tuples (as lists) or dataclasses of those (a :class:`SlotEntry`, its ``last_used``
    moved to wall time).

    Raises:
        TypeError: a field holds something else (a new field this module must learn).
    """
    extra: dict[str, Any] = {}
    for f in dataclasses.fields(Held):
        if f.name in _OWN:
            continue
        value = getattr(held, f.name)
        if isinstance(value, SlotEntry):
            value = dataclasses.replace(value, last_used=value.last_used + offset)
        extra[f.name] = _jsonable(value)
    return {
        "lease": held.lease.model_dump(mode="json", exclude={"api_key"}),
        "deadline": held.deadline + offset,
        "granted_at": held.granted_at + offset,
        **extra,
    }


def _field_value(hint: Any, value: Any, offset: float) -> Any:
    """``value`` (JSON) back into the type ``hint`` names (tuples, a SlotEntry)."""
    if value is None:
        return None
    args = typing.get_args(hint)
    if hint is SlotEntry or SlotEntry in args:
        entry = SlotEntry(**{**value, "fingerprints": tuple(value.get("fingerprints", ()))})
        return dataclasses.replace(entry, last_used=entry.last_used - offset)
    if isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def held_from(data: dict[str, Any], offset: float) -> Held:
    """The :class:`Held` of a :func:`record` (its deadline and times on this process's
    monotonic clock; ``api_key`` None).

    Raises:
        ValueError, KeyError, TypeError: a malformed record.
    """
    hints = typing.get_type_hints(Held)
    names = {f.name for f in dataclasses.fields(Held)}
    kwargs = {
        k: _field_value(hints.get(k), v, offset)
        for k, v in data.items()
        if k in names and k not in _OWN
    }
    return Held(
        lease=Lease.model_validate(data["lease"]),
        deadline=float(data["deadline"]) - offset,
        granted_at=float(data.get("granted_at", time.time())) - offset,
        **kwargs,
    )


class LeaseMirror:
    """Writes the leader's leases and slot book to Redis, and loads them back.

    Args:
        redis: the service's asyncio Redis client.
        leases: the lease manager mirrored.
        term: returns the leader's current term (None: not leading: nothing is written).
        grace_s: how far past its deadline a mirrored lease may be and still be loaded (s;
            about the longest takeover).
        on_book: called with the slot book loaded (the pool keeps a reference elsewhere);
            default: it replaces ``leases.pool.book``.
        counters: the pool's counters now (engine id -> name -> count), written with the
            book; None: none.
        on_counters: called with the counters loaded (only when some were stored).
    """

    def __init__(
        self,
        redis: Any,
        leases: LeaseManager,
        term: Callable[[], Term | None],
        grace_s: float = 10.0,
        on_book: Callable[[SlotBook], None] | None = None,
        counters: Callable[[], dict[str, dict[str, int]]] | None = None,
        on_counters: Callable[[dict[str, dict[str, int]]], None] | None = None,
    ) -> None:
        self.redis = redis
        self.leases = leases
        self.term = term
        self.grace_s = grace_s
        self.on_book = on_book
        self.counters = counters
        self.on_counters = on_counters
        self._written: dict[str, str] = {}  # lease id -> the JSON last written
        self._book_written = ""
        self._write = redis.register_script(_WRITE)
        self._lock = asyncio.Lock()
        #: wall time minus monotonic time, taken once (stable records between two syncs)
        self.offset = time.time() - time.monotonic()
        self.writes = 0
        self.refused = 0

    def _book(self) -> SlotBook | None:
        pool = self.leases.pool
        return pool.book if pool is not None else None

    def _book_json(self) -> str:
        book = self._book()
        if book is None:
            return ""
        # "now" = monotonic minus wall: restored with the new process's, each last_used moves
        # onto its monotonic clock (and the text changes only when the book does)
        data = book.snapshot(now=-self.offset)
        if self.counters is not None:
            data["counters"] = self.counters()
        return json.dumps(data, sort_keys=True)

    def _diff(self, offset: float) -> tuple[dict[str, str], list[str]]:
        now: dict[str, str] = {}
        for lease_id, held in list(self.leases.held.items()):
            try:
                now[lease_id] = json.dumps(record(held, offset), sort_keys=True)
            except TypeError as exc:
                log.error("lease %s not mirrored: a field holds a %s", lease_id, exc)
        changed = {k: v for k, v in now.items() if self._written.get(k) != v}
        gone = [k for k in self._written if k not in now]
        return changed, gone

    async def sync(self) -> bool:
        """Write what changed since the last write (nothing when nothing did).

        Returns False when not leading (nothing written). Syncs run one at a time (a release
        written before the grant it follows would bring the lease back).

        Raises:
            Fenced: the term is no longer the leader key's value.
            redis.RedisError, OSError: Redis did not answer (retried at the next sync).
        """
        async with self._lock:
            return await self._sync()

    async def _sync(self) -> bool:
        term = self.term()
        if term is None:
            return False
        changed, gone = self._diff(self.offset)
        book = self._book_json()
        book_arg = book if book != self._book_written else ""
        if not changed and not gone and not book_arg:
            return True
        args: list[Any] = [term.value, KEYS_PX, len(changed)]
        for lease_id, text in changed.items():
            args += [lease_id, text]
        args += [len(gone), *gone, book_arg]
        ok = await self._write(keys=[LEADER_KEY, LEASES_KEY, BOOK_KEY], args=args)
        if not ok:
            self.refused += 1
            raise Fenced(f"epoch {term.epoch} is no longer the leader's")
        self.writes += 1
        self._written.update(changed)
        for lease_id in gone:
            self._written.pop(lease_id, None)
        if book_arg:
            self._book_written = book
        return True

    async def load(self, api_key: Callable[[Lease], str | None] | None = None) -> int:
        """Put the mirrored leases and slot book back into the lease manager (a new leader,
        before it grants): replaces :attr:`LeaseManager.held`. Returns how many leases.

        Args:
            api_key: the key of a lease's endpoint now (its ``api_key`` is not stored).

        Raises:
            redis.RedisError, OSError: Redis did not answer (nothing changed).
        """
        raw = await self.redis.hgetall(LEASES_KEY)
        book_raw = await self.redis.get(BOOK_KEY)
        offset = self.offset
        now = time.monotonic()
        loaded: dict[str, Held] = {}
        for key, value in raw.items():
            lease_id = key.decode() if isinstance(key, bytes) else str(key)
            try:
                held = held_from(json.loads(value), offset)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("mirrored lease %s unreadable: %s", lease_id, exc)
                continue
            if held.deadline < now - self.grace_s:
                continue
            extra = held.lease.ttl_s if held.claimed else self.leases.claim_s
            held.deadline = max(held.deadline, now) + extra
            if api_key is not None:
                held.lease.api_key = api_key(held.lease)
            loaded[lease_id] = held
        self.leases.held.clear()
        self.leases.held.update(loaded)
        for held in loaded.values():
            if held.holder:
                self.leases._seen[held.holder] = now  # alive: a late claim drops nothing
        self._written = {}  # rewritten at the next sync (their new deadlines)
        self._book_written = ""
        if book_raw and self.leases.pool is not None:
            try:
                data = json.loads(book_raw)
                book = SlotBook.restore(data, now=-offset)
            except ValueError as exc:
                log.warning("mirrored slot book unreadable: %s", exc)
            else:
                if self.on_book is not None:
                    self.on_book(book)
                else:
                    self.leases.pool.book = book
                counters = data.get("counters")
                if isinstance(counters, dict) and self.on_counters is not None:
                    self.on_counters(counters)
        if loaded:
            log.info("took over %d held lease(s) from the previous leader", len(loaded))
        return len(loaded)


__all__ = ["BOOK_KEY", "LEASES_KEY", "Fenced", "LeaseMirror", "held_from", "record"]
