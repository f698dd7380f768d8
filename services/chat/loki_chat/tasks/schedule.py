"""A task's schedule: checking it, and the due times it has in a span of time.

Cron expressions are read by ``croniter``: exactly five fields (minute hour day-of-month month
day-of-week) or one of its nicknames (``@hourly``, ``@daily``, ``@midnight``, ``@weekly``,
``@monthly``, ``@yearly``, ``@annually``). A sixth field (Quartz's seconds, or croniter's own
seconds/year extension) is refused: it would be read as something else than was meant. An
expression that matches no day at all (``0 0 30 2 *``) is refused too: croniter finds no
time in the next 50 years.

Wall-clock times, daylight saving included (the rule, in :func:`wall_to_epoch`): the cron
expression is walked in the task's *local wall clock* (naive times), and each wall time it
gives becomes one instant:

- a wall time that occurs twice (the hour repeated when clocks go back) is its first
  occurrence only, so a daily ``30 2 * * *`` in ``Europe/Berlin`` runs once on the autumn day;
- a wall time that does not exist (the hour skipped when clocks go forward) runs once, at the
  first wall time that exists after it (``30 2 * * *`` in ``Europe/Berlin`` runs at 03:00 on
  the spring day); several skipped times land on that one instant and run once.

An interval schedule's due times are ``anchor + k * interval_s`` (``k >= 1``; ``anchor``: when
the task was created or its schedule last changed), in absolute seconds.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from loki_shared.errors import InvalidRequest
from loki_shared.messages.tasks import Task

#: The most due times one look at a span returns (older ones are not enumerated).
MAX_DUE = 1000
#: The longest interval (ten years, seconds): the next runs of a longer one would lie past
#: the dates Python's calendar holds.
MAX_INTERVAL_S = 10 * 366 * 24 * 3600
#: croniter's nicknames accepted in place of five fields.
NICKNAMES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
#: The longest run of non-existent wall-clock minutes walked over (the longest clock jump
#: on record skipped a whole day).
_MAX_GAP = timedelta(hours=48)


class Schedule(Protocol):
    """What :func:`check` reads: a task spec, a stored task, or a preview request."""

    cron: str | None
    interval_s: int | None
    tz: str


def check(spec: Schedule) -> None:
    """Check a task's schedule and time zone.

    Raises:
        InvalidRequest: neither or both of ``cron`` and ``interval_s``; an interval under
            1 s or over :data:`MAX_INTERVAL_S`; a cron expression that is not exactly five
            fields (or a nickname), that ``croniter`` refuses, or that can never fire; an
            unknown time zone. The message says what to resend.
    """
    if (spec.cron is None) == (spec.interval_s is None):
        raise InvalidRequest("give exactly one of 'cron' (a cron expression) or 'interval_s'")
    if spec.interval_s is not None and spec.interval_s < 1:
        raise InvalidRequest(f"'interval_s' must be at least 1 (seconds), not {spec.interval_s}")
    if spec.interval_s is not None and spec.interval_s > MAX_INTERVAL_S:
        raise InvalidRequest(
            f"'interval_s' must be at most {MAX_INTERVAL_S} (ten years, in seconds), not "
            f"{spec.interval_s}: use a cron expression for a yearly task"
        )
    zone = _zone(spec.tz)
    if spec.cron is not None:
        cron_fields(spec.cron)
        try:
            _next_wall(spec.cron, datetime.now(zone).replace(tzinfo=None))
        except CroniterError as exc:
            raise InvalidRequest(
                f"'cron' {spec.cron!r} can never fire (no such day in any year, e.g. "
                "February 30): resend a day that exists"
            ) from exc


def cron_fields(cron: str) -> list[str]:
    """The five fields of ``cron`` (a nickname stays one).

    Raises:
        InvalidRequest: not five fields, or a field croniter refuses.
    """
    fields = cron.split()
    if len(fields) == 1 and fields[0].lower() in NICKNAMES:
        return fields
    if len(fields) != 5:
        extra = (
            " (a sixth field would be read as seconds: Loki's schedules are per minute, so drop "
            "the seconds field of a Quartz-style expression)"
            if len(fields) == 6
            else ""
        )
        raise InvalidRequest(
            f"'cron' is not a valid cron expression: {cron!r} has {len(fields)} fields, not 5: "
            "resend minute hour "
            f"day-of-month month day-of-week, e.g. '0 9 * * 1'{extra}"
        )
    if not croniter.is_valid(cron):
        raise InvalidRequest(
            f"'cron' is not a valid cron expression: {cron!r} "
            "(five fields: minute hour day-of-month month day-of-week)"
        )
    return fields


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidRequest(
            f"'tz' is not a known time zone: {tz!r} (an IANA name, e.g. Europe/Paris)"
        ) from exc


def _next_wall(cron: str, wall: datetime) -> datetime:
    """The next naive wall time after ``wall`` that ``cron`` matches.

    Raises:
        CroniterError: no match (croniter looks 50 years ahead).
    """
    return croniter(cron, wall).get_next(datetime)


def _exists(wall: datetime, zone: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=zone, fold=0)
    return aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall


def wall_to_epoch(wall: datetime, zone: ZoneInfo) -> float:
    """The instant (epoch seconds) a cron wall time ``wall`` (naive, in ``zone``) runs at.

    A time that occurs twice is its first occurrence (``fold=0``); a time that does not exist
    is the first existing wall minute after it (the end of the clock jump).
    """
    probe = wall
    while not _exists(probe, zone):
        probe = probe.replace(second=0, microsecond=0) + timedelta(minutes=1)
        if probe - wall > _MAX_GAP:  # not a clock jump: fall back on zoneinfo's reading
            probe = wall
            break
    return probe.replace(tzinfo=zone, fold=0).timestamp()


def cron_times(cron: str, tz: str, after: float, until: float | None, limit: int) -> list[float]:
    """The instants ``t`` of ``cron`` in zone ``tz`` with ``after < t`` (and ``t <= until``
    when given), ascending, each once, at most ``limit`` of them: the FIRST ``limit`` when
    ``until`` is None, else the LATEST ``limit``.

    Raises:
        CroniterError: the expression never fires.
    """
    zone = ZoneInfo(tz)
    # wall times map to instants in the same order (a repeated hour's wall times are read
    # once, a jump's wall times all land on its end), so the walk starts at ``after``'s wall
    # time and stops at the first instant past ``until``
    itr = croniter(cron, datetime.fromtimestamp(after, zone).replace(tzinfo=None))
    out: list[float] = []
    while True:
        t = wall_to_epoch(itr.get_next(datetime), zone)
        if until is not None and t > until:
            return out
        if t <= after or (out and t <= out[-1]):
            continue
        out.append(t)
        if until is None and len(out) >= limit:
            return out
        if len(out) > limit:
            out.pop(0)


def due_times(task: Task, after: float, now: float, limit: int = MAX_DUE) -> list[float]:
    """The task's due times ``t`` with ``after < t <= now`` (epoch seconds, ascending), at
    most the ``limit`` LATEST ones (older ones are dropped).

    Raises:
        InvalidRequest, CroniterError: a stored schedule that cannot be read (one written
            before the checks were made): the scheduler records it as the task's error.
    """
    after = max(after, task.anchor)
    if now <= after:
        return []
    if task.interval_s is not None:
        step = float(task.interval_s)
        first = math.floor((after - task.anchor) / step) + 1
        last = math.floor((now - task.anchor) / step)
        first = max(first, last - limit + 1)
        return [task.anchor + k * step for k in range(first, last + 1)]
    assert task.cron is not None
    cron_fields(task.cron)
    _zone(task.tz)
    return cron_times(task.cron, task.tz, after, now, limit)


def next_times(spec: Schedule, after: float, n: int = 3) -> list[float]:
    """The next ``n`` run times (epoch seconds) of a schedule checked by :func:`check`, after
    ``after`` (an interval counts from ``after``, as a task created then would)."""
    if spec.interval_s is not None:
        return [after + k * float(spec.interval_s) for k in range(1, n + 1)]
    assert spec.cron is not None
    return cron_times(spec.cron, spec.tz, after, None, n)
