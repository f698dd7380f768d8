"""Scheduled tasks on the chat service (real NATS and Redis, the scripted fake engine):
once per due time across two instances and their restarts, the task note at the head of
the user message, lease kind ``task``, waiting for / skipping on the person's turn, the
missed-run policy, and the ``loki.chat.tasks`` validation."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from loki_chat.tasks.schedule import due_times
from loki_chat.tasks.scheduler import BROKEN, MISSED, ORPHANED, task_message
from loki_shared import subjects
from loki_shared.messages.tasks import (
    ScheduleSpec,
    Task,
    TaskRun,
    TaskSpec,
    TasksReply,
    TasksRequest,
)
from tests.chat.helpers import SECRET, ChatClient, ChatRunner
from tests.fakes.fake_engine import FakeEngine, Stream, chunk, text_reply
from tests.fakes.fake_supervisor import FakeSupervisor

FAST = dict(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0)


async def tasks_req(client: ChatClient, **fields: Any) -> TasksReply:
    raw = await client.nc.request(
        subjects.CHAT_TASKS, TasksRequest(**fields).model_dump_json().encode(), timeout=10
    )
    return TasksReply.model_validate_json(raw.data)


async def create(client: ChatClient, **spec: Any) -> Task:
    reply = await tasks_req(client, action="create", spec=TaskSpec(**spec))
    assert reply.error is None, reply.error
    return reply.tasks[0]


async def settled_runs(client: ChatClient, task: Task, timeout: float = 20.0) -> list[TaskRun]:
    """The task's runs once none is ``running``."""
    deadline = time.monotonic() + timeout
    while True:
        runs = (await tasks_req(client, action="runs", task=task.id)).runs
        if all(r.status != "running" for r in runs) or time.monotonic() > deadline:
            return runs
        await asyncio.sleep(0.1)


def user_messages(engine: FakeEngine) -> list[str]:
    return [r.json["messages"][1]["content"] for r in engine.requests]


async def test_each_due_time_runs_once_across_two_instances_and_restarts(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    a = await chat_runner.start(**FAST)
    b = await chat_runner.start(**FAST)
    task = await create(client, name="tick", prompt="Say tick.", interval_s=1)
    await asyncio.sleep(3.5)
    await chat_runner.stop(a)  # A restarts while B goes on
    await asyncio.sleep(2.0)
    first_a = a.instance
    a = await chat_runner.start(**FAST)  # a new instance id (random at each start)
    await asyncio.sleep(2.0)
    await chat_runner.stop(b)  # then B stops: A alone
    await asyncio.sleep(2.5)
    spec = TaskSpec(**task.model_dump()).model_copy(update={"enabled": False})
    assert (await tasks_req(client, action="update", task=task.id, spec=spec)).error is None
    runs = await settled_runs(client, task)
    dues = sorted(r.due for r in runs)
    # every due time from the first one on, none lost: anchor + 1, + 2, ... without a gap
    assert len(dues) >= 8
    assert dues == [task.anchor + k for k in range(1, len(dues) + 1)]
    assert {r.status for r in runs} == {"ok"}, [(r.due, r.status, r.detail) for r in runs]
    # only the three started ran them (A, B, A again), and more than one of them ran some
    ran = {r.instance for r in runs}
    assert ran <= {first_a, b.instance, a.instance} and len(ran) >= 2, ran
    # none twice: one engine request and one conversation per due time
    await fake_engine.await_idle()
    sent = Counter(user_messages(fake_engine))
    for run in runs:
        assert sent[task_message(task, run.due)] == 1, run
    assert len(fake_engine.requests) == len(runs)
    assert len({r.conversation for r in runs}) == len(runs)
    assert {lease.kind for lease in supervisor.leases} == {"task"}


async def test_a_task_waits_for_the_persons_turn_or_is_skipped(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    await chat_runner.start(task_tick_s=0.1, task_grace_s=60.0, task_wait_s=1.0)
    # a person's turn of about 3 s: the task due meanwhile waits 1 s, then is skipped
    fake_engine.push(text_reply("slow answer", pieces=6, delay_s=0.5))
    reply = await client.send("take your time")
    await fake_engine.await_requests(1)
    task = await create(client, prompt="Check the mail.", interval_s=1)
    runs: list[TaskRun] = []
    deadline = time.monotonic() + 20
    while not runs:
        assert time.monotonic() < deadline, "no run of the task ended in 20 s"
        runs = [r for r in await settled_runs(client, task, 5.0) if r.status != "running"]
        await asyncio.sleep(0.05)
    await tasks_req(client, action="delete", task=task.id)
    first = min(runs, key=lambda r: r.due)
    assert first.status == "skipped" and first.conversation is None
    assert "busy with the person's turn" in first.detail
    await client.tap.wait_turn_ends(reply.conversation)
    # the person's turn was never interleaved with a task's request
    assert len(fake_engine.requests) >= 1
    assert fake_engine.requests[0].json["messages"][1]["content"] == "take your time"


async def test_a_task_due_during_a_persons_turn_runs_after_it(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    await chat_runner.start(task_tick_s=0.1, task_grace_s=60.0, task_wait_s=10.0)
    # what the engine was doing when each request after the person's arrived: the
    # person's stream (about 4 s: eight writes 0.5 s apart) finished or not
    arrivals: list[tuple[str, int, int]] = []

    def respond(body: dict[str, Any]) -> Stream:
        content = body["messages"][1]["content"]
        arrivals.append((content, fake_engine.completed_streams, fake_engine.active_streams))
        return text_reply("done")

    fake_engine.responder = respond
    fake_engine.push(text_reply("slow answer", pieces=4, delay_s=0.5))
    reply = await client.send("take your time")
    await fake_engine.await_requests(1)
    task = await create(client, prompt="Check the mail.", interval_s=3600)
    await chat_runner.running[0][0].scheduler.tick_task(task, task.anchor + 3600.5)
    # claimed at once, while the person's turn still streams: the run waits, nothing sent
    claimed = (await tasks_req(client, action="runs", task=task.id)).runs
    assert [r.status for r in claimed] == ["running"]
    assert len(fake_engine.requests) == 1 and fake_engine.completed_streams == 0
    await client.tap.wait_turn_ends(reply.conversation)
    runs = await settled_runs(client, task)
    assert [r.status for r in runs] == ["ok"]
    # its request reached the engine only once the person's stream had ended
    assert arrivals == [(task_message(task, runs[0].due), 1, 0)]


async def test_missed_due_times_run_the_latest_once_and_skip_the_rest(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    svc = await chat_runner.start(task_tick_s=60.0, task_grace_s=30.0, task_wait_s=5.0)
    task = await create(client, prompt="Back up.", interval_s=10)
    # as if every instance had been down for 105 s: 10 due times, the last 5 s ago
    await svc.scheduler.tick_task(task, task.anchor + 105)
    runs = await settled_runs(client, task)
    assert [r.due for r in runs] == [task.anchor + 10 * k for k in range(10, 0, -1)]
    # within the grace (30 s): 80, 90, 100 run; older ones are recorded skipped
    assert [r.status for r in runs[:3]] == ["ok", "ok", "ok"]
    assert {r.status for r in runs[3:]} == {"skipped"}
    assert {r.detail for r in runs[3:]} == {MISSED}
    assert len(fake_engine.requests) == 3
    # a second look at the same span claims nothing again
    await svc.scheduler.tick_task(task, task.anchor + 105)
    assert len(await settled_runs(client, task)) == 10


async def test_after_an_outage_longer_than_the_grace_the_latest_due_time_still_runs(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    svc = await chat_runner.start(task_tick_s=60.0, task_grace_s=2.0, task_wait_s=5.0)
    task = await create(client, prompt="Back up.", interval_s=10)
    # down for 105 s: every due time is older than the grace (2 s), the latest 5 s old
    await svc.scheduler.tick_task(task, task.anchor + 105)
    runs = await settled_runs(client, task)
    assert [r.due for r in runs] == [task.anchor + 10 * k for k in range(10, 0, -1)]
    assert runs[0].status == "ok" and runs[0].conversation is not None
    assert {r.status for r in runs[1:]} == {"skipped"}
    assert {r.detail for r in runs[1:]} == {MISSED}
    assert user_messages(fake_engine) == [task_message(task, task.anchor + 100)]


async def test_a_missed_due_time_exactly_the_grace_old_still_runs(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    svc = await chat_runner.start(task_tick_s=60.0, task_grace_s=30.0, task_wait_s=5.0)
    named = await create(client, name="Backup", prompt="Back up.", interval_s=10)
    # now = anchor + 100: the due time at 70 is exactly the grace (30 s) old, 60 older
    await svc.scheduler.tick_task(named, named.anchor + 100)
    runs = await settled_runs(client, named)
    status = {r.due - named.anchor: r.status for r in runs}
    assert status == {
        100: "ok",
        90: "ok",
        80: "ok",
        70: "ok",
        60: "skipped",
        50: "skipped",
        40: "skipped",
        30: "skipped",
        20: "skipped",
        10: "skipped",
    }
    # each run's conversation is titled by the task: its name, else its prompt's start
    unnamed = await create(client, prompt="Water the plants.", interval_s=3600)
    await svc.scheduler.tick_task(unnamed, unnamed.anchor + 3600)
    [run] = await settled_runs(client, unnamed)
    listed = await client.conversations("list", kind="task")
    titles = {c.id: c.title for c in listed.conversations}
    assert {titles[r.conversation] for r in runs if r.conversation} == {"Task: Backup"}
    assert titles[run.conversation] == "Task: Water the plants."


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (dict(prompt="x", cron="61 * * * *"), "'cron' is not a valid cron expression"),
        (dict(prompt="x", cron="every day"), "'cron' is not a valid cron expression"),
        (dict(prompt="x", interval_s=0), "'interval_s' must be at least 1"),
        (dict(prompt="x", interval_s=5, tz="Mars/Olympus"), "'tz' is not a known time zone"),
        (dict(prompt="x"), "exactly one of 'cron'"),
        (dict(prompt="x", cron="* * * * *", interval_s=5), "exactly one of 'cron'"),
        (dict(prompt="x", interval_s=10**15), "'interval_s' must be at most"),
        (dict(prompt="x", cron="0 0 30 2 *"), "can never fire"),
        (dict(prompt="x", cron="0 0 31 4,6,9,11 *"), "can never fire"),
        (dict(prompt="x", cron="0 0 9 * * 1"), "has 6 fields, not 5"),
        (dict(prompt="x", cron="0 9 * *"), "has 4 fields, not 5"),
        (dict(prompt="x", cron="0 0 9 * * 1 2026"), "has 7 fields, not 5"),
    ],
)
async def test_bad_schedules_are_refused_with_what_to_resend(
    chat: Any, client: ChatClient, spec: dict[str, Any], says: str
) -> None:
    reply = await tasks_req(client, action="create", spec=TaskSpec(**spec))
    assert reply.error is not None and reply.error.type == "invalid_request"
    assert says in reply.error.message
    assert (await tasks_req(client, action="list")).tasks == []


async def test_bad_schedules_are_refused_on_update_too(chat: Any, client: ChatClient) -> None:
    task = await create(client, prompt="x", cron="0 9 * * 1")
    for cron, says in (("0 0 30 2 *", "can never fire"), ("0 0 9 * * 1", "has 6 fields")):
        spec = TaskSpec(prompt="x", cron=cron)
        reply = await tasks_req(client, action="update", task=task.id, spec=spec)
        assert reply.error is not None and says in reply.error.message
    assert (await tasks_req(client, action="get", task=task.id)).tasks[0].cron == "0 9 * * 1"


def _task(cron: str, tz: str, anchor: float = 0.0) -> Task:
    return Task(id="0" * 32, prompt="x", cron=cron, tz=tz, created=0, updated=0, anchor=anchor)


def _wall(times: list[float], tz: str) -> list[str]:
    return [datetime.fromtimestamp(t, ZoneInfo(tz)).isoformat() for t in times]


def test_a_wall_time_that_occurs_twice_runs_once() -> None:
    """Europe/Berlin, 2026-10-25: clocks go back at 03:00 CEST, 02:30 happens twice."""
    zone = ZoneInfo("Europe/Berlin")
    start = datetime(2026, 10, 24, 12, tzinfo=zone).timestamp()
    end = datetime(2026, 10, 26, 12, tzinfo=zone).timestamp()
    task = _task("30 2 * * *", "Europe/Berlin")
    assert _wall(due_times(task, start, end), "Europe/Berlin") == [
        "2026-10-25T02:30:00+02:00",  # the first 02:30 only
        "2026-10-26T02:30:00+01:00",
    ]
    # ticked in small steps across the repeated hour (as the scheduler does): still once
    dues: list[float] = []
    cursor = start
    for now in range(int(start), int(end), 600):
        dues += due_times(task, cursor, now)
        cursor = max(cursor, now)
    assert _wall(dues, "Europe/Berlin") == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    # an hourly schedule runs once at each wall-clock hour of that day too
    hourly = due_times(_task("0 * * * *", "Europe/Berlin"), start, end)
    assert len(hourly) == len(set(hourly)) == 48  # 49 instants pass, 02:00 runs once


def test_a_wall_time_that_does_not_exist_runs_once_at_the_next_valid_time() -> None:
    """Europe/Berlin, 2026-03-29: clocks go forward at 02:00 CET to 03:00 CEST."""
    zone = ZoneInfo("Europe/Berlin")
    start = datetime(2026, 3, 28, 12, tzinfo=zone).timestamp()
    end = datetime(2026, 3, 30, 12, tzinfo=zone).timestamp()
    assert _wall(due_times(_task("30 2 * * *", "Europe/Berlin"), start, end), "Europe/Berlin") == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    # every skipped time of the hour lands on 03:00, which runs once; ticks in steps agree
    task = _task("*/20 2 * * *", "Europe/Berlin")
    dues: list[float] = []
    cursor = start
    for now in range(int(start), int(end), 600):
        dues += due_times(task, cursor, now)
        cursor = max(cursor, now)
    assert _wall(dues, "Europe/Berlin") == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:00:00+02:00",
        "2026-03-30T02:20:00+02:00",
        "2026-03-30T02:40:00+02:00",
    ]


async def test_a_broken_stored_schedule_never_stops_the_other_tasks(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    svc = await chat_runner.start(**FAST)
    now = time.time()
    # stored before the checks existed: created first, so every tick meets them first
    for cron in ("0 0 30 2 *", "0 0 9 * * 1", "not a cron"):
        broken = Task(
            id=uuid.uuid4().hex,
            prompt="never",
            cron=cron,
            created=now - 10,
            updated=now - 10,
            anchor=now - 10,
        )
        await svc.scheduler.store.put(broken)
    task = await create(client, name="tick", prompt="Say tick.", interval_s=1)
    await asyncio.sleep(3.0)
    runs = await settled_runs(client, task)
    assert len(runs) >= 2 and {r.status for r in runs} == {"ok"}
    for t in (await tasks_req(client, action="list")).tasks:
        if t.id == task.id:
            continue
        recorded = (await tasks_req(client, action="runs", task=t.id)).runs
        # its own error, recorded once however many ticks met it
        assert [(r.status, r.due) for r in recorded] == [("error", t.anchor)], recorded
        assert recorded[0].detail.startswith(BROKEN)


async def test_preview_gives_the_next_three_runs_in_the_tasks_zone(
    chat: Any, client: ChatClient
) -> None:
    spec = ScheduleSpec(cron="0 9 * * 1", tz="Europe/Berlin")
    reply = await tasks_req(client, action="preview", schedule=spec)
    assert reply.error is None and len(reply.next_runs) == 3
    walls = [datetime.fromtimestamp(t, ZoneInfo("Europe/Berlin")) for t in reply.next_runs]
    assert all((w.weekday(), w.hour, w.minute) == (0, 9, 0) for w in walls)
    assert reply.next_runs == sorted(reply.next_runs) and reply.next_runs[0] > time.time()
    every = await tasks_req(client, action="preview", schedule=ScheduleSpec(interval_s=60))
    assert [round(b - a) for a, b in zip(every.next_runs, every.next_runs[1:])] == [60, 60]
    bad = await tasks_req(client, action="preview", schedule=ScheduleSpec(cron="0 0 30 2 *"))
    assert bad.error is not None and "can never fire" in bad.error.message
    assert (await tasks_req(client, action="list")).tasks == []


async def test_crud(chat: Any, client: ChatClient) -> None:
    task = await create(
        client, name="daily", prompt="Plan the day.", cron="0 8 * * 1-5", tz="Europe/Paris"
    )
    assert task.enabled and task.cron == "0 8 * * 1-5" and len(task.id) == 32
    listed = (await tasks_req(client, action="list")).tasks
    assert [t.id for t in listed] == [task.id]
    spec = TaskSpec(name="daily", prompt="Plan the week.", cron="0 8 * * 1", enabled=False)
    updated = (await tasks_req(client, action="update", task=task.id, spec=spec)).tasks[0]
    assert (updated.prompt, updated.enabled, updated.tz, updated.created) == (
        "Plan the week.",
        False,
        "UTC",
        task.created,
    )
    got = (await tasks_req(client, action="get", task=task.id)).tasks[0]
    assert got == updated
    assert (await tasks_req(client, action="delete", task=task.id)).error is None
    missing = await tasks_req(client, action="get", task=task.id)
    assert missing.error is not None and missing.error.type == "not_found"
    assert (await tasks_req(client, action="list")).tasks == []


async def test_a_task_shares_the_chats_prompt_prefix(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    svc = await chat_runner.start(task_tick_s=60.0, task_grace_s=60.0, task_wait_s=5.0)
    await client.turn("hi")
    task = await create(client, prompt="Summarise the news.", interval_s=3600)
    await svc.scheduler.tick_task(task, task.anchor + 3600.5)
    runs = await settled_runs(client, task)
    assert [r.status for r in runs] == ["ok"], [(r.status, r.detail) for r in runs]
    person, run = (r.json for r in fake_engine.requests[:2])
    # the same system message and tools: the task's prompt shares the chat's cached prefix
    assert run["messages"][0] == person["messages"][0]
    assert run.get("tools") == person.get("tools")
    assert run["messages"][1]["content"] == task_message(task, runs[0].due)
    assert supervisor.leases[-1].kind == "task"


def _chat_process(nats_url: str, redis_db: str, home: str, **env_over: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_REDIS_URL=redis_db,
        LOKI_HOME=home,
        LOKI_SECRET_KEY=SECRET,
        LOKI_LOCK_TTL_S="2",
        PYTHONUNBUFFERED="1",
        **env_over,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "loki_chat"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_a_run_whose_instance_is_killed_mid_run_is_recorded_and_none_is_lost(
    nats_url: str,
    redis_db: str,
    tmp_path: Any,
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
) -> None:
    """Two instances (one a ``python -m loki_chat`` process), a 1-second interval; the
    process is killed (SIGKILL) mid-run, then another instance starts beside the survivor."""
    # every answer streams for ~8 s until the kill: the killed instance dies mid-run
    slow = Stream(frames=[chunk({"content": f"w{i} "}) for i in range(400)], delay_s=0.02)
    fake_engine.default = slow
    fast = dict(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0, task_lease_s=2)
    await chat_runner.start(**fast)
    proc = _chat_process(
        nats_url,
        redis_db,
        str(tmp_path / "doomed"),
        LOKI_INSTANCE_ID="doomed",
        LOKI_TASK_TICK_S="0.2",
        LOKI_TASK_LEASE_S="2",
        LOKI_TASK_GRACE_S="60",
    )
    try:
        await asyncio.sleep(1.0)  # the process starts (its scheduler claims as soon as it runs)
        task = await create(client, prompt="Say tick.", interval_s=1)
        deadline = time.monotonic() + 20
        while not any(
            r.instance == "doomed" and r.status == "running"
            for r in (await tasks_req(client, action="runs", task=task.id)).runs
        ):
            assert time.monotonic() < deadline, "the process never claimed a due time"
            assert proc.poll() is None, "the chat process exited"
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed_at = time.time()
    fake_engine.default = text_reply("tick")
    await asyncio.sleep(1.0)
    await chat_runner.start(**fast)  # the restart, beside the instance that went on
    await asyncio.sleep(3.0)
    # at least 6 due times before the task is turned off (a loaded machine runs fewer a second)
    deadline = time.monotonic() + 30
    while len((await tasks_req(client, action="runs", task=task.id)).runs) < 6:
        assert time.monotonic() < deadline, "fewer than 6 due times in 30 s"
        await asyncio.sleep(0.2)
    spec = TaskSpec(**task.model_dump()).model_copy(update={"enabled": False})
    assert (await tasks_req(client, action="update", task=task.id, spec=spec)).error is None
    runs = await settled_runs(client, task)
    by_due = sorted(runs, key=lambda r: r.due)
    detail = [(r.due - task.anchor, r.instance, r.status, r.detail) for r in by_due]
    # none lost: every due time from the first to the last, without a gap
    assert [r.due for r in by_due] == [task.anchor + k for k in range(1, len(by_due) + 1)]
    assert len(by_due) >= 6, detail
    doomed = [r for r in by_due if r.instance == "doomed"]
    others = [r for r in by_due if r.instance != "doomed"]
    assert doomed and others, detail
    # the runs killed mid-run: recorded error by another instance once their lease ended
    assert {r.status for r in doomed} == {"error"}, detail
    assert all(r.detail.startswith(ORPHANED) and r.conversation for r in doomed), detail
    assert all(r.ended is not None and r.ended >= killed_at for r in doomed), detail
    assert {r.status for r in others} == {"ok"}, detail
    # none twice: at most one engine request per due time (the killed ones may have sent it)
    await fake_engine.await_idle(15)
    sent = Counter(user_messages(fake_engine))
    assert all(sent[task_message(task, r.due)] == 1 for r in others), sent
    assert all(sent[task_message(task, r.due)] <= 1 for r in doomed), sent
    assert len({r.conversation for r in runs}) == len(runs)


async def test_task_runs_are_kind_task_in_the_perf_summary(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    client: ChatClient,
    fake_engine: FakeEngine,
    nats_url: str,
    tmp_path: Any,
) -> None:
    from loki_perf.service import PerfService
    from loki_perf.settings import Settings as PerfSettings
    from loki_shared.perf_publish import ensure_perf_stream
    from tests.perf.perf_helpers import reset_stream, wait_summary

    await reset_stream(client.nc)  # this test's records only
    await ensure_perf_stream(client.nc.jetstream())
    perf = PerfService(PerfSettings(nats_url=nats_url, home=tmp_path / "perf", perf_metrics_port=0))
    await perf.start()
    try:
        svc = await chat_runner.start(task_tick_s=60.0, task_grace_s=60.0, task_wait_s=5.0)
        cid, _ = await client.turn("hi")
        task = await create(client, prompt="Summarise the news.", interval_s=3600)
        await svc.scheduler.tick_task(task, task.anchor + 3600.5)
        (run,) = await settled_runs(client, task)
        assert run.status == "ok", run
        await client.turn("and now?", cid)  # the person's turn after the task
        summary = await wait_summary(client.nc, 3)
        by_kind = summary["detail"]["by_kind"]
        assert by_kind["task"]["completions"] == 1 and by_kind["main"]["completions"] == 2
        # the fake engine reports no cached token: the main turn after the task lost its
        # prefix, and the perf ring names the task as what ran in between
        assert summary["detail"]["losses_by_cause"]["task"]["count"] == 1
    finally:
        await perf.stop()


def test_the_dashboard_shows_the_kind_task_before_any_task_ran() -> None:
    import json
    from pathlib import Path

    board = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/loki-prompt-cache.json"
    panels = json.loads(board.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", []) if '"task"' in t["expr"]]
    assert any('lokiassist_completions_total{kind="task"' in e for e in exprs)
    assert any('{cause="task"' in e for e in exprs)  # the losses a task caused
    assert any('lokiassist_ttft_seconds_sum{kind="task"' in e for e in exprs)
    # a kind with no completion yet has no series: each query still answers 0
    assert all(e.endswith(" or vector(0)") for e in exprs), exprs
