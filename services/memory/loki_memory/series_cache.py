"""The opened values of each tracker, kept between reads.

A tracker's values live in a Redis list that only grows (values are appended; a deleted
tracker loses its whole list). So a read asks Redis only for the values appended since the
last one (``LRANGE`` from the length cached) and opens only those: the project block, read at
every turn, stops costing one AES-GCM open per value ever logged.

An entry is keyed by the project, the tracker's field and its record's ``created_at``, so a
tracker deleted and created again is read afresh; it is dropped when the memory key changes
(:meth:`SeriesCache.clear`: nothing opened with the key outlives a lock).
"""

from __future__ import annotations

from loki_shared.messages.projects import TrackerValue

#: (project id, field, created_at of the tracker record)
Key = tuple[str, str, float]


class SeriesCache:
    """Values of trackers by :data:`Key`, in the order logged (lists never mutated in place)."""

    def __init__(self) -> None:
        self._series: dict[Key, list[TrackerValue]] = {}

    def get(self, key: Key) -> list[TrackerValue]:
        """The values cached for ``key`` (empty when none)."""
        return self._series.get(key, [])

    def extend(
        self, key: Key, known: list[TrackerValue], new: list[TrackerValue]
    ) -> list[TrackerValue]:
        """``known`` + ``new``; cached unless another read extended ``key`` meanwhile (then
        that read's list stays: both read the same list)."""
        values = known + new
        if len(self.get(key)) == len(known):
            self._series[key] = values
        return values

    def drop(self, project_id: str, field: str | None = None) -> None:
        """Forget one tracker's entries (``field``) or a whole project's."""
        for key in [k for k in self._series if k[0] == project_id and field in (None, k[1])]:
            del self._series[key]

    def clear(self) -> None:
        """Forget everything (the memory key changed)."""
        self._series.clear()
