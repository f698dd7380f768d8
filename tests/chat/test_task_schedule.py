"""A task's schedule on its own (``loki_chat.tasks.schedule``): the due times of a span
(interval and cron, both ends, the latest ``limit`` kept) and the checks of a spec; and a
run's outcome read from its conversation's last turn end (``loki_chat.tasks.scheduler``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from loki_chat.tasks.schedule import check, due_times
from loki_chat.tasks.scheduler import outcome
from loki_shared.errors import InvalidRequest
from loki_shared.messages.chat import ChatEvent
from loki_shared.messages.tasks import Task, TaskRun, TaskSpec

ANCHOR = 1_000.0
#: 2026-01-01 00:00 UTC: a cron schedule's span starts on a minute boundary.
MIDNIGHT = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


def task(**spec: Any) -> Task:
    return Task(id="t" * 32, prompt="p", created=0.0, updated=0.0, anchor=ANCHOR, **spec)


def test_interval_due_times_lie_after_the_start_up_to_now_included() -> None:
    every_10 = task(interval_s=10)
    assert due_times(every_10, ANCHOR, ANCHOR + 35) == [1010.0, 1020.0, 1030.0]
    assert due_times(every_10, 1010.0, 1030.0) == [1020.0, 1030.0]  # after excluded, now not
    assert due_times(every_10, 1010.0, 1029.0) == [1020.0]
    assert due_times(every_10, 0.0, 1015.0) == [1010.0]  # nothing before the anchor
    assert due_times(every_10, 1030.0, 1030.0) == [] and due_times(every_10, 1030.0, 1020.0) == []


def test_only_the_latest_due_times_are_kept_past_the_limit() -> None:
    every_10 = task(interval_s=10)
    assert due_times(every_10, ANCHOR, ANCHOR + 500, limit=3) == [1480.0, 1490.0, 1500.0]
    assert len(due_times(every_10, ANCHOR, ANCHOR + 500, limit=50)) == 50
    every_5_min = task(cron="*/5 * * * *")
    hour = due_times(every_5_min, MIDNIGHT, MIDNIGHT + 3600, limit=2)
    assert hour == [MIDNIGHT + 3300, MIDNIGHT + 3600]


def test_cron_due_times_lie_after_the_start_up_to_now_included() -> None:
    every_5_min = task(cron="*/5 * * * *")
    assert due_times(every_5_min, MIDNIGHT, MIDNIGHT + 900) == [
        MIDNIGHT + 300,
        MIDNIGHT + 600,
        MIDNIGHT + 900,
    ]
    assert due_times(every_5_min, MIDNIGHT, MIDNIGHT + 899) == [MIDNIGHT + 300, MIDNIGHT + 600]
    # the time zone places the hours: 09:00 in Paris (UTC+1 in winter) is 08:00 UTC
    nine = task(cron="0 9 * * *", tz="Europe/Paris")
    assert due_times(nine, MIDNIGHT, MIDNIGHT + 86_400) == [MIDNIGHT + 8 * 3600]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (dict(cron="61 * * * *"), "'cron' is not a valid cron expression"),
        (dict(interval_s=0), "'interval_s' must be at least 1"),
        (dict(interval_s=-5), "'interval_s' must be at least 1"),
        (dict(interval_s=5, tz="Mars/Olympus"), "'tz' is not a known time zone"),
        (dict(), "exactly one of 'cron'"),
        (dict(cron="* * * * *", interval_s=5), "exactly one of 'cron'"),
    ],
)
def test_a_bad_spec_says_what_to_resend(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        check(TaskSpec(prompt="p", **spec))


@pytest.mark.parametrize(
    "spec",
    [dict(interval_s=1), dict(cron="*/5 * * * *"), dict(cron="0 9 * * 1-5", tz="Asia/Tokyo")],
)
def test_a_good_spec_passes(spec: dict[str, Any]) -> None:
    check(TaskSpec(prompt="p", **spec))


def end(finish: str = "stop", **loki: Any) -> ChatEvent:
    return ChatEvent(
        conversation="c", seq=2, ts=0.0, finish_reason=finish, loki={"event": "turn_end", **loki}
    )


@pytest.mark.parametrize(
    ("log", "status", "detail"),
    [
        ([end()], "ok", ""),
        ([end(error="engine unavailable: stopped")], "skipped", "engine unavailable: stopped"),
        ([end(error="the engine answered 500")], "error", "the engine answered 500"),
        ([end("stopped")], "error", "stopped"),
        ([end(stopped=True)], "error", "stopped"),
        ([], "error", "the turn did not end"),
        ([end(error="boom"), end()], "ok", ""),  # the last turn end counts
    ],
)
def test_a_runs_outcome_is_its_last_turn_end(
    log: list[ChatEvent], status: str, detail: str
) -> None:
    run = TaskRun(task="t", due=1.0, status="running", conversation="c")
    user = ChatEvent(conversation="c", seq=1, ts=0.0, loki={"event": "user"})
    ended = outcome(run, [user, *log])
    assert (ended.status, ended.detail) == (status, detail)
