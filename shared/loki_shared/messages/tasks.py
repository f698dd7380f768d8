"""Scheduled tasks: ``loki.chat.tasks`` (list, get, create, update, delete, runs).

A task is a prompt run on a schedule, each run in a conversation of its own (lease kind
``task``). The schedule is a cron expression (``cron``, five fields, read by ``croniter``) or
an interval in seconds (``interval_s``), exactly one of the two, evaluated in ``tz`` (an IANA
zone name, ``zoneinfo``). The chat service checks them (:mod:`loki_chat.tasks.schedule`) and
answers ``invalid_request`` with what to resend.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Msg, Reply

#: A run's status: ``running`` until its turn ends; ``ok``; ``error`` (``detail``: the
#: turn's error); ``skipped`` (``detail``: why it did not run).
RunStatus = Literal["running", "ok", "error", "skipped"]


class ScheduleSpec(Msg):
    """A schedule alone (``preview``): ``cron`` or ``interval_s``, evaluated in ``tz``."""

    cron: str | None = Field(default=None, max_length=200)
    interval_s: int | None = None
    tz: str = Field(default="UTC", max_length=100)


class TaskSpec(Msg):
    """What a person writes: ``prompt`` (the user message, after the task note),
    ``cron`` or ``interval_s`` (seconds, at least 1), ``tz`` (IANA name, default ``UTC``),
    ``project`` (an optional project id, kept as given), ``enabled``, ``name``."""

    name: str = Field(default="", max_length=200)
    prompt: str = Field(min_length=1, max_length=100_000)
    cron: str | None = Field(default=None, max_length=200)
    interval_s: int | None = None
    tz: str = Field(default="UTC", max_length=100)
    project: str | None = Field(default=None, max_length=200)
    enabled: bool = True


class Task(TaskSpec):
    """A stored task: its ``id`` (32 hex), ``created`` / ``updated`` (epoch seconds) and
    ``anchor`` (epoch seconds: where an interval schedule counts from, and before which no
    due time exists)."""

    id: str
    created: float
    updated: float
    anchor: float


class TaskRun(Msg):
    """One due time of a task: ``due`` (epoch seconds), its ``conversation`` (None for a
    skipped run), ``status``, ``detail``, the ``instance`` that claimed it, ``started`` /
    ``ended`` (epoch seconds)."""

    task: str
    due: float
    status: RunStatus
    detail: str = ""
    conversation: str | None = None
    instance: str = ""
    started: float = 0.0
    ended: float | None = None


class TasksRequest(Msg):
    """``loki.chat.tasks``: ``list`` (every task), ``get`` / ``delete`` / ``runs``
    (``task``), ``create`` (``spec``), ``update`` (``task`` and ``spec``, the whole spec),
    ``preview`` (``schedule``: checked as a task's, and its next three run times)."""

    action: Literal["list", "get", "create", "update", "delete", "runs", "preview"]
    task: str | None = None
    spec: TaskSpec | None = None
    schedule: ScheduleSpec | None = None


class TasksReply(Reply):
    """``tasks``: the listed or touched task(s); ``runs``: a task's runs, newest first;
    ``next_runs``: a previewed schedule's next run times (epoch seconds, ascending)."""

    tasks: list[Task] = Field(default_factory=list)
    runs: list[TaskRun] = Field(default_factory=list)
    next_runs: list[float] = Field(default_factory=list)
