"""A task's schedule: checking it, and the due times it has in a span of time.

Cron expressions are read by ``croniter`` (five fields; the next time after a given one, in
the task's time zone, daylight-saving changes included); time zones by ``zoneinfo``. An
interval schedule's due times are ``anchor + k * interval_s`` (``k >= 1``; ``anchor``: when
the task was created or its schedule last changed).
"""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from loki_shared.errors import InvalidRequest
from loki_shared.messages.tasks import Task, TaskSpec

#: The most due times one look at a span returns (older ones are not enumerated).
MAX_DUE = 1000


def check(spec: TaskSpec) -> None:
    """Check a task's schedule and time zone.

    Raises:
        InvalidRequest: neither or both of ``cron`` and ``interval_s``; an interval under
            1 s; a cron expression ``croniter`` refuses; an unknown time zone. The message
            says what to resend.
    """
    if (spec.cron is None) == (spec.interval_s is None):
        raise InvalidRequest("give exactly one of 'cron' (a cron expression) or 'interval_s'")
    if spec.interval_s is not None and spec.interval_s < 1:
        raise InvalidRequest(f"'interval_s' must be at least 1 (seconds), not {spec.interval_s}")
    if spec.cron is not None and not croniter.is_valid(spec.cron):
        raise InvalidRequest(
            f"'cron' is not a valid cron expression: {spec.cron!r} "
            "(five fields: minute hour day-of-month month day-of-week)"
        )
    try:
        ZoneInfo(spec.tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidRequest(
            f"'tz' is not a known time zone: {spec.tz!r} (an IANA name, e.g. Europe/Paris)"
        ) from exc


def due_times(task: Task, after: float, now: float, limit: int = MAX_DUE) -> list[float]:
    """The task's due times ``t`` with ``after < t <= now`` (epoch seconds, ascending), at
    most the ``limit`` LATEST ones (older ones are dropped)."""
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
    zone = ZoneInfo(task.tz)
    itr = croniter(task.cron, datetime.fromtimestamp(after, zone))
    out: list[float] = []
    while True:
        t = float(itr.get_next(float))
        if t > now:
            return out
        out.append(t)
        if len(out) > limit:
            out.pop(0)
