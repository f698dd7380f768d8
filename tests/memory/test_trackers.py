"""Trackers over NATS: logging dated values with a unit, reading them in levels (overview →
year → month → events), and the bad values refused."""

from __future__ import annotations

import datetime as dt

import pytest

from loki_shared import errors
from loki_shared.projects_client import ProjectsClient

VALUES = [
    ("2025-03-02", 80.0, ""),
    ("2025-12-30", 78.5, ""),
    ("2026-01-05", 78.0, "after the holidays"),
    ("2026-01-05", 77.5, "evening"),  # same day, logged later: the latest
    ("2026-01-20", 77.0, ""),
    ("2026-02-11", 76.0, ""),
]


async def _log_all(client: ProjectsClient) -> None:
    first = await client.log_value("default", "Body weight", 80.0, unit="kg", date="2025-03-02")
    assert first.created and first.tracker is not None and first.tracker.slug == "body-weight"
    for date, value, note in VALUES[1:]:
        reply = await client.log_value("default", "body-weight", value, date=date, note=note)
        assert not reply.created


async def test_levels_overview_year_month_events(client: ProjectsClient) -> None:
    await _log_all(client)
    over = await client.read_tracker("default", "Body weight")
    assert over.tracker is not None and over.tracker.count == 6 and over.tracker.unit == "kg"
    assert [(p.period, p.count, p.min, p.max, p.last_value) for p in over.periods] == [
        ("2025", 2, 78.5, 80.0, 78.5),
        ("2026", 4, 76.0, 78.0, 76.0),
    ]
    assert over.text.splitlines()[0] == "Body weight (kg): overview, 6 values in all"
    assert "2026: 4 values 2026-01-05..2026-02-11, min 76 max 78 mean 77.125, last 76 kg" in (
        over.text
    )

    year = await client.read_tracker("default", "body-weight", "year", "2026")
    assert [(p.period, p.count, p.last_value) for p in year.periods] == [
        ("2026-01", 3, 77.0),
        ("2026-02", 1, 76.0),
    ]
    month = await client.read_tracker("default", "body-weight", "month", "2026-01")
    assert [(p.period, p.count, p.last_value) for p in month.periods] == [
        ("2026-01-05", 2, 77.5),
        ("2026-01-20", 1, 77.0),
    ]
    day = await client.read_tracker("default", "body-weight", "events", "2026-01-05")
    assert [(e.value, e.note) for e in day.events] == [
        (78.0, "after the holidays"),
        (77.5, "evening"),
    ]
    assert "2026-01-05: 77.5 kg — evening" in day.text
    cut = await client.read_tracker("default", "body-weight", "events", "2026-01", limit=2)
    assert ([e.value for e in cut.events], cut.more) == ([77.5, 77.0], 1)
    assert "(1 earlier values of 2026-01 left out)" in cut.text
    # without a period: the period of the latest value
    latest_month = await client.read_tracker("default", "body-weight", "events")
    assert (latest_month.period, [e.value for e in latest_month.events]) == ("2026-02", [76.0])
    empty = await client.read_tracker("default", "body-weight", "year", "2024")
    assert empty.periods == [] and "no value in this period" in empty.text

    trackers = await client.list_trackers("default")
    assert [t.slug for t in trackers] == ["body-weight"]
    assert trackers[0].latest is not None and trackers[0].latest.value == 76.0


async def test_bad_tracker_input_says_what_to_resend(client: ProjectsClient) -> None:
    await client.log_value("default", "weight", 70, unit="kg", date="2026-01-01")
    with pytest.raises(errors.InvalidRequest, match="in 'kg'"):
        await client.log_value("default", "weight", 154, unit="lb")
    with pytest.raises(errors.InvalidRequest, match="YYYY-MM-DD"):
        await client.log_value("default", "weight", 70, date="2026-02-30")
    with pytest.raises(errors.InvalidRequest, match="YYYY-MM-DD"):
        await client.log_value("default", "weight", 70, date="yesterday")
    with pytest.raises(errors.InvalidRequest, match="number"):  # inf travels as null
        await client.log_value("default", "weight", float("inf"))
    with pytest.raises(errors.InvalidRequest, match="YYYY-MM"):
        await client.read_tracker("default", "weight", "month", "2026")
    with pytest.raises(errors.InvalidRequest, match="YYYY"):
        await client.read_tracker("default", "weight", "year", "26")
    with pytest.raises(errors.InvalidRequest, match="limit"):
        await client.read_tracker("default", "weight", "events", limit=0)
    with pytest.raises(errors.NotFound):
        await client.read_tracker("default", "height")
    with pytest.raises(errors.NotFound, match="project"):
        await client.log_value("nope", "weight", 1)
    # no date: today (UTC)
    today = await client.log_value("default", "weight", 69.5)
    assert today.value is not None
    assert today.value.date == dt.datetime.now(dt.UTC).date().isoformat()
    assert await client.delete_tracker("default", "Weight") == "weight"
    with pytest.raises(errors.NotFound):
        await client.delete_tracker("default", "weight")
    assert await client.list_trackers("default") == []
