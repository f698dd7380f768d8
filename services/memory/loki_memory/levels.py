"""Reading a tracker in levels, never whole (pure functions over its values).

Levels, coarse to fine: ``overview`` (one :class:`TrackerPeriod` per year), ``year`` (one per
month of a ``YYYY``), ``month`` (one per day of a ``YYYY-MM``), ``events`` (the values of a
``YYYY-MM`` or ``YYYY-MM-DD``, at most ``limit``, the latest kept). Without a period, a level
reads the period of the tracker's latest value. Values are ordered by date, and in the order
logged within a date; the *latest* value is the last of that order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby

from loki_shared.errors import InvalidRequest
from loki_shared.messages.projects import (
    Tracker,
    TrackerLevel,
    TrackerPeriod,
    TrackerReadReply,
    TrackerValue,
)

from . import names

EVENTS_MAX = 1000


def ordered(values: Sequence[TrackerValue]) -> list[TrackerValue]:
    """``values`` (in the order logged) by date; the order logged among equal dates."""
    return sorted(values, key=lambda v: v.date)


def latest(values: Sequence[TrackerValue]) -> TrackerValue | None:
    """The value with the greatest date (the last logged among equal dates); None if none."""
    return ordered(values)[-1] if values else None


def summary(period: str, values: Sequence[TrackerValue]) -> TrackerPeriod:
    """Count, first and last date, min, max, mean and last value of ``values`` (ordered,
    not empty)."""
    nums = [v.value for v in values]
    return TrackerPeriod(
        period=period,
        count=len(values),
        first=values[0].date,
        last=values[-1].date,
        min=min(nums),
        max=max(nums),
        mean=round(sum(nums) / len(nums), 6),
        last_value=values[-1].value,
    )


def _periods(values: list[TrackerValue], key: Callable[[TrackerValue], str]) -> list[TrackerPeriod]:
    return [summary(k, list(group)) for k, group in groupby(values, key)]


def read(
    tracker: Tracker,
    values: Sequence[TrackerValue],
    level: TrackerLevel,
    period: str | None,
    limit: int,
) -> TrackerReadReply:
    """One level of ``tracker`` whose values (in the order logged) are ``values``.

    Raises:
        InvalidRequest: a period that does not fit the level, or ``limit`` outside 1-1000.
    """
    if not 1 <= limit <= EVENTS_MAX:
        raise InvalidRequest(f"limit {limit} is outside 1-{EVENTS_MAX}: resend one inside")
    vals = ordered(values)
    last = vals[-1].date if vals else None
    reply = TrackerReadReply(tracker=tracker, level=level)
    if level == "overview":
        reply.periods = _periods(vals, lambda v: v.date[:4])
    else:
        if period is None:
            shape = {"year": 4, "month": 7, "events": 7}[level]
            period = last[:shape] if last else None
        else:
            period = names.period(level, period)
        reply.period = period
        inside = [v for v in vals if period is not None and v.date.startswith(period)]
        if level == "year":
            reply.periods = _periods(inside, lambda v: v.date[:7])
        elif level == "month":
            reply.periods = _periods(inside, lambda v: v.date)
        else:
            reply.events = inside[-limit:]
            reply.more = len(inside) - len(reply.events)
    reply.text = text(reply)
    return reply


def _with_unit(number: float, unit: str) -> str:
    return f"{names.format_value(number)} {unit}" if unit else names.format_value(number)


def text(reply: TrackerReadReply) -> str:
    """``reply`` as lines for the model."""
    tracker = reply.tracker
    assert tracker is not None
    unit = tracker.unit
    head = f"{tracker.name} ({unit})" if unit else tracker.name
    where = f" {reply.period}" if reply.period else ""
    out = [f"{head}: {reply.level}{where}, {tracker.count} values in all"]
    for p in reply.periods:
        out.append(
            f"{p.period}: {p.count} values {p.first}..{p.last}, min {names.format_value(p.min)} "
            f"max {names.format_value(p.max)} mean {names.format_value(p.mean)}, "
            f"last {_with_unit(p.last_value, unit)}"
        )
    if reply.more:
        out.append(f"({reply.more} earlier values of {reply.period} left out)")
    for v in reply.events:
        note = f" — {v.note}" if v.note else ""
        out.append(f"{v.date}: {_with_unit(v.value, unit)}{note}")
    if len(out) == 1:
        out.append("no value in this period")
    return "\n".join(out)


def block_line(tracker: Tracker) -> str:
    """The tracker's line in the project block: ``- name: value unit (YYYY-MM-DD)`` and
    `` — note`` when the latest value has one; ``- name: no value yet`` when empty."""
    v = tracker.latest
    if v is None:
        return f"- {tracker.name}: no value yet"
    note = f" — {v.note}" if v.note else ""
    return f"- {tracker.name}: {_with_unit(v.value, tracker.unit)} ({v.date}){note}"
