"""Trackers in Redis: a private record per tracker (``{"slug", "name", "unit",
"created_at"}``) in ``loki:projects:trackers:<project id>``, and its values, each a private
record (``{"date", "value", "note", "ts"}``), appended to a list in the order logged (an
append is atomic, so two instances logging at once both keep their value).

The callers check that the project exists; every operation needs the memory open
(:class:`loki_shared.errors.Locked` otherwise).
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from loki_shared.errors import InvalidRequest, NotFound
from loki_shared.messages.projects import Tracker, TrackerValue

from . import keys, levels, names
from .series_cache import SeriesCache
from .vault import Vault

NOTE_MAX = 300
UNIT_MAX = 20


class Trackers:
    """The trackers of one Redis.

    Args:
        redis: an asyncio Redis client (bytes responses).
        vault: the service's sealing.
    """

    def __init__(self, redis: Redis, vault: Vault) -> None:
        self.redis = redis
        self.vault = vault
        self._hset = redis.register_script(keys.HSET_IN_PROJECT)
        self._rpush = redis.register_script(keys.RPUSH_IN_PROJECT)
        #: The values already opened (cleared when the memory key changes).
        self.cache = SeriesCache()

    async def _slug(self, project_id: str, tracker: str) -> str:
        """The slug of ``tracker`` (name or slug), or its legacy slug when only that one is
        stored (a tracker created before Unicode slugs, its name mixing Latin and other
        scripts).

        Raises:
            InvalidRequest: ``tracker`` gives no slug.
        """
        slug = names.tracker_slug(tracker)
        legacy = names.legacy_tracker_slug(tracker)
        if legacy is None:
            return slug
        fields = [self.vault.field(project_id, slug), self.vault.field(project_id, legacy)]
        with keys.guard():
            stored = await self.redis.hmget(keys.trackers(project_id), fields)
        return legacy if stored[0] is None and stored[1] is not None else slug

    async def _meta(self, project_id: str, slug: str) -> dict[str, Any] | None:
        field = self.vault.field(project_id, slug)
        with keys.guard():
            blob = await self.redis.hget(keys.trackers(project_id), field)
        if blob is None:
            return None
        meta: dict[str, Any] = self.vault.open_private(keys.aad_tracker(project_id, field), blob)
        return meta

    async def _values(self, project_id: str, meta: dict[str, Any]) -> list[TrackerValue]:
        """The tracker's values in the order logged: those cached, and the ones appended
        since, opened now (see :mod:`loki_memory.series_cache`)."""
        field = self.vault.field(project_id, meta["slug"])
        aad = keys.aad_tracker(project_id, field) + ":value"
        key = (project_id, field, float(meta["created_at"]))
        known = self.cache.get(key)
        with keys.guard():
            blobs = await self.redis.lrange(keys.values(project_id, field), len(known), -1)
        new = [TrackerValue.model_validate(self.vault.open_private(aad, b)) for b in blobs]
        return self.cache.extend(key, known, new)

    async def series(self, project_id: str, tracker: str) -> tuple[Tracker, list[TrackerValue]]:
        """A tracker (``tracker``: name or slug) and its values in the order logged.

        Raises:
            NotFound: no such tracker.
            InvalidRequest: ``tracker`` gives no slug.
            Locked: the memory is locked.
        """
        slug = await self._slug(project_id, tracker)
        await self.vault.require_open()
        meta, values = await self._both(project_id, slug)
        return _tracker(meta, values), values

    async def all(self, project_id: str) -> list[Tracker]:
        """Every tracker of ``project_id`` (with count and latest value), sorted by slug.

        Raises:
            Locked: the memory is locked.
        """
        await self.vault.require_open()
        with keys.guard():
            stored = await self.redis.hgetall(keys.trackers(project_id))
        out = []
        for field, blob in stored.items():
            meta = self.vault.open_private(keys.aad_tracker(project_id, field.decode()), blob)
            out.append(_tracker(meta, await self._values(project_id, meta)))
        return sorted(out, key=lambda t: t.slug)

    async def log(
        self,
        project_id: str,
        tracker: str,
        value: float,
        unit: str | None,
        date: str | None,
        note: str,
    ) -> tuple[Tracker, TrackerValue, bool]:
        """Append a value (the tracker is created on first use); returns the tracker after,
        the value and whether the tracker is new.

        Raises:
            InvalidRequest: a bad name, value, date, note or unit, or a unit other than the
                tracker's.
            Locked: the memory is locked.
        """
        entry = value_of(date, value, note)
        slug, created = await self.append(project_id, tracker, unit, [entry])
        return _tracker(*await self._both(project_id, slug)), entry, created

    async def _both(self, project_id: str, slug: str) -> tuple[dict[str, Any], list[TrackerValue]]:
        meta = await self._meta(project_id, slug)
        if meta is None:
            raise NotFound(f"no tracker {slug!r} in project {project_id!r}")
        return meta, await self._values(project_id, meta)

    async def append(
        self, project_id: str, tracker: str, unit: str | None, entries: list[TrackerValue]
    ) -> tuple[str, bool]:
        """Append checked ``entries`` (see :func:`value_of`) to a tracker, created on first
        use; returns its slug and whether it is new.

        Raises:
            InvalidRequest: a bad name or unit, or a unit other than the tracker's.
            NotFound: the project does not exist (or was deleted meanwhile).
            Locked: the memory is locked.
        """
        name = names.name(tracker, "tracker name")
        slug = await self._slug(project_id, name)
        unit = None if unit is None else _unit(unit)
        memory = await self.vault.require_open()
        field = self.vault.field(project_id, slug)
        aad = keys.aad_tracker(project_id, field)
        meta = {"slug": slug, "name": name, "unit": unit or "", "created_at": time.time()}
        blob = self.vault.seal_private(aad, meta, memory)
        with keys.guard():
            done = await self._hset(
                keys=[keys.META, keys.trackers(project_id)], args=[project_id, field, blob, 1]
            )
        if done == -1:
            raise NotFound(f"no project {project_id!r}")
        created = bool(done)
        if not created:
            existing = await self._meta(project_id, slug)
            if existing is None:
                raise NotFound(f"tracker {slug!r} was deleted meanwhile: resend")
            if unit is not None and unit != existing["unit"]:
                have = f"in {existing['unit']!r}" if existing["unit"] else "without a unit"
                raise InvalidRequest(
                    f"tracker {slug!r} is {have}: resend the value in that unit, or without a unit"
                )
        now = time.time()
        blobs = [
            self.vault.seal_private(aad + ":value", {**e.model_dump(), "ts": now}, memory)
            for e in entries
        ]
        if blobs:
            with keys.guard():
                done = await self._rpush(
                    keys=[keys.META, keys.values(project_id, field)], args=[project_id, *blobs]
                )
            if done == -1:
                raise NotFound(f"no project {project_id!r}")
        return slug, created

    async def delete(self, project_id: str, tracker: str) -> str:
        """Delete a tracker and its values; returns its slug.

        Raises:
            NotFound: no such tracker.
            Locked: the memory is locked.
        """
        slug = await self._slug(project_id, tracker)
        await self.vault.require_open()
        field = self.vault.field(project_id, slug)
        with keys.guard():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.trackers(project_id), field)
                pipe.delete(keys.values(project_id, field))
                gone, _ = await pipe.execute()
        self.cache.drop(project_id, field)
        if not gone:
            raise NotFound(f"no tracker {slug!r} in project {project_id!r}")
        return slug


def _tracker(meta: dict[str, Any], values: list[TrackerValue]) -> Tracker:
    return Tracker(
        slug=meta["slug"],
        name=meta["name"],
        unit=meta["unit"],
        count=len(values),
        latest=levels.latest(values),
    )


def value_of(date: str | None, value: float, note: str) -> TrackerValue:
    """A tracker value checked: ``date`` ``YYYY-MM-DD`` (None: today, UTC), a finite
    ``value``, a one-line ``note`` of at most 300 characters.

    Raises:
        InvalidRequest: one of them is not valid (the message says which).
    """
    return TrackerValue(date=names.date(date), value=names.value(value), note=_note(note))


def _note(note: str) -> str:
    line = " ".join(note.split())
    if len(line) > NOTE_MAX:
        raise InvalidRequest(f"note is {len(line)} characters: resend at most {NOTE_MAX}")
    return line


def _unit(unit: str) -> str:
    unit = unit.strip()
    if len(unit) > UNIT_MAX or any(c.isspace() for c in unit):
        raise InvalidRequest(f"unit {unit!r}: resend one word of at most {UNIT_MAX} characters")
    return unit
