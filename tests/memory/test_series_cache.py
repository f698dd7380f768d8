"""The tracker values cache: a read opens only the values appended since the last one, and
never serves what another instance changed (appended, deleted and created again) or what was
opened before the memory key changed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from faststream.nats import NatsBroker
from redis.asyncio import Redis

from loki_memory.store import Store
from loki_shared.memkey import MemoryKeyFollower
from loki_shared.messages.projects import DEFAULT_PROJECT

KEY = b"s" * 32
P = DEFAULT_PROJECT


@pytest.fixture
async def two(redis_db: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one Redis and one service key: two instances of the service."""
    ra, rb = Redis.from_url(redis_db), Redis.from_url(redis_db)
    a, b = Store(ra, KEY), Store(rb, KEY)
    await a.projects.ensure_default()
    yield a, b
    await ra.aclose()
    await rb.aclose()


async def test_reads_follow_another_instances_appends_deletes_and_recreations(
    two: tuple[Store, Store],
) -> None:
    a, b = two
    for day in range(1, 4):
        await a.trackers.log(P, "weight", 70 + day, "kg", f"2026-01-0{day}", "")
    tracker, values = await b.trackers.series(P, "weight")
    assert tracker.count == 3 and [v.value for v in values] == [71, 72, 73]
    await a.trackers.log(P, "weight", 69, None, "2026-01-09", "")
    tracker, values = await b.trackers.series(P, "weight")
    assert tracker.count == 4 and tracker.latest is not None and tracker.latest.value == 69
    # only the new value was asked of Redis and opened: the first three are the same objects
    again = (await b.trackers.series(P, "weight"))[1]
    assert all(x is y for x, y in zip(again, values, strict=True))

    await a.trackers.delete(P, "weight")
    await a.trackers.log(P, "weight", 50, "lb", "2026-02-01", "")
    tracker, values = await b.trackers.series(P, "weight")
    assert (tracker.unit, [v.value for v in values]) == ("lb", [50])


async def test_a_memory_key_change_empties_the_cache(two: tuple[Store, Store]) -> None:
    a, _ = two
    holder = MemoryKeyFollower(NatsBroker(), a.redis, a.set_memory_key)
    await a.trackers.log(P, "steps", 9000, None, "2026-01-01", "")
    await a.trackers.series(P, "steps")
    assert a.trackers.cache._series
    await holder.apply("locked", None)  # not held before either: nothing changes
    assert a.trackers.cache._series
    holder._key_id = "pretend-held"
    await holder.apply("locked", None)  # the key is forgotten: what it opened goes too
    assert a.trackers.cache._series == {}
