"""The task scheduler every chat instance runs, and one task run.

Every ``LOKI_TASK_TICK_S`` each instance reads every enabled task and the due times between
the task's cursor and now (:func:`.schedule.due_times`). Each due time is claimed in Redis
(:meth:`.store.TaskStore.claim`, ``HSETNX``): the instance whose claim lands runs it, the
others leave it, so a due time runs once however many instances there are, and a due time
is never lost while at least one instance runs (the cursor is raised only after the claims).

One task's failure (a schedule stored before the checks that croniter cannot read, anything
its tick raises) is that task's own: recorded once as an ``error`` run (:data:`BROKEN`) while
the other tasks tick on.

Missed due times (every instance down): a due time later than ``LOKI_TASK_GRACE_S`` is
recorded ``skipped`` ("missed"), except the latest one of the span, which runs once.

A run whose instance died mid-run: the claimant renews the run's lease in Redis every third
of ``LOKI_TASK_LEASE_S`` while it runs; once a lease has ended unrenewed, the next tick of any
instance records that run ``error`` (:data:`ORPHANED`) by compare-and-set on the record, so
the dead claimant's late write, if it ever comes, is fenced off. Its conversation is kept.

A run: it waits (up to ``LOKI_TASK_WAIT_S``) until no person's turn runs on any instance
(:meth:`.store.TaskStore.person_busy`), else it is recorded ``skipped`` with that reason;
then it is a conversation of its own (kind ``task``: its steps ask leases of kind ``task``,
which the supervisor queues at most ``LOKI_TASK_WAIT_S`` and routes to the side slot with
SIDE_SLOT), whose one user message is the task note followed by the prompt, under the chat's
own system prompt (so the task shares the chat's prompt prefix and the engine's cache;
seeds). The turn is the chat's turn loop: the network retry rule applies. Its end gives
the run's status: ``ok``; ``error`` with the turn's error; ``skipped`` when no lease came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime
from typing import Protocol
from zoneinfo import ZoneInfo

from loki_shared.messages.chat import ChatEvent, ConversationKind
from loki_shared.messages.tasks import Task, TaskRun

from ..conversation import Conversation
from ..settings import Settings
from ..store import new_conversation_id
from .schedule import due_times
from .store import TaskStore

log = logging.getLogger("loki.chat.tasks")

#: The record of a due time no instance was running for (older than the grace).
MISSED = "missed: no chat instance was running at its due time (only the latest missed run runs)"
#: The head of the record of a task whose schedule cannot be run (one stored before the checks,
#: or any failure of its tick): recorded once, at its anchor; the other tasks go on.
BROKEN = "this task's schedule cannot be run (edit it to fix it)"
#: The record of a run whose chat instance stopped mid-run (its lease ended unrenewed).
ORPHANED = "the chat instance running it stopped mid-run (its lease was not renewed)"


def task_note(task: Task, due: float) -> str:
    """The note put at the head of a run's user message (never in the system prompt)."""
    when = datetime.fromtimestamp(due, ZoneInfo(task.tz)).strftime("%Y-%m-%d %H:%M:%S")
    label = f' "{task.name}"' if task.name else ""
    project = f" Project: {task.project}." if task.project else ""
    return f"[Scheduled task{label}, due {when} {task.tz}.{project}]"


def task_message(task: Task, due: float) -> str:
    """A run's user message: the task note, a blank line, the prompt."""
    return f"{task_note(task, due)}\n\n{task.prompt}"


class RunActor(Protocol):
    """What a run needs of its conversation's owner-side actor (:class:`loki_chat.actor.Actor`
    is one): the conversation, a queue to put the run's message on, and the worker that runs
    its turn."""

    @property
    def conv(self) -> Conversation:
        """The conversation (its ``title`` is set; its ``log`` read for the outcome)."""
        ...

    @property
    def worker(self) -> asyncio.Task[None] | None:
        """The task running the queued turns, None when none runs."""
        ...

    async def enqueue(self, text: str) -> bool:
        """Queue one user message (the turn starts when the worker takes it)."""
        ...


class ConversationOwner(Protocol):
    """This instance's conversations, as the scheduler needs them (the composer passes
    :class:`loki_chat.ownership.Ownership`; the tasks package never imports it)."""

    async def take(
        self, cid: str, create: bool, kind: ConversationKind = "main"
    ) -> RunActor | None:
        """The local actor of ``cid`` (created when ``create``), None when another instance
        holds it."""
        ...


class Scheduler:
    """One instance's task scheduler.

    Args:
        settings: ``task_tick_s``, ``task_grace_s``, ``task_wait_s``.
        store: the task store.
        ownership: this instance's conversations (a run's conversation is created here).
        instance: this instance's id (written in the runs it claims).
    """

    def __init__(
        self, settings: Settings, store: TaskStore, ownership: ConversationOwner, instance: str
    ) -> None:
        self.settings = settings
        self.store = store
        self.ownership = ownership
        self.instance = instance
        self.runs: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Start ticking (every ``task_tick_s``; call from a running event loop)."""
        self._stopping.clear()
        self._loop = asyncio.create_task(self._tick_forever(), name="task-scheduler")

    async def stop_ticking(self) -> None:
        """Claim no more due times (runs already started go on).

        The loop is told by an event as well as cancelled: a cancellation that lands inside a
        tick can be swallowed on Python 3.11 (a timeout racing it inside the Redis client turns
        it into ``TimeoutError``, which the tick logs), and the loop would then tick on and
        this wait would never end (seen as a hung test teardown)."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    async def close(self, timeout: float = 3.0) -> None:
        """Claim no more due times and wait up to ``timeout`` (s) for the started runs to
        end and record how they ended (called before and after the conversations stop)."""
        await self.stop_ticking()
        if self.runs:
            await asyncio.wait(set(self.runs), timeout=timeout)

    async def _tick_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.tick(time.time())
            except Exception:  # Redis away: logged; the next tick claims what is due
                log.warning("task scheduler tick failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.settings.task_tick_s)

    async def tick(self, now: float) -> None:
        """Record the orphaned runs, then claim (and start or skip) every due time of every
        enabled task up to ``now``."""
        await self.recover(now)
        for task in await self.store.all():
            if not task.enabled:
                continue
            try:
                await self.tick_task(task, now)
            except Exception as exc:  # noqa: BLE001 - one task's failure is its own, recorded
                await self.record_failure(task, exc, now)

    async def record_failure(self, task: Task, exc: Exception, now: float) -> None:
        """Record ``task``'s tick failure as its own ``error`` run (once: at the task's
        anchor, by the same claim as a due time; logged when first recorded); the other
        tasks go on."""
        detail = f"{BROKEN}: {exc}"
        run = TaskRun(
            task=task.id,
            due=task.anchor,
            status="error",
            detail=detail,
            instance=self.instance,
            started=now,
            ended=now,
        )
        try:
            recorded = await self.store.claim(run) is not None
        except Exception:  # noqa: BLE001 - Redis away: recorded at a later tick
            log.warning("task %s: %s (not recorded: the store is away)", task.id, detail)
            return
        if recorded:
            log.warning("task %s: %s", task.id, detail)
        else:
            log.debug("task %s: %s (recorded before)", task.id, detail)

    async def recover(self, now: float) -> int:
        """Record ``error`` (:data:`ORPHANED`) every run whose lease ended before ``now``;
        return how many were recorded."""
        n = 0
        for task_id, due in await self.store.expired(now):
            rec = await self.store.record(task_id, due)
            if rec is None or rec[0].status != "running":
                await self.store.unlist(task_id, due)
                continue
            run, token = rec
            detail = f"{ORPHANED}; instance {run.instance}"
            ended = run.model_copy(update={"status": "error", "detail": detail, "ended": now})
            if await self.store.update(ended, token) is not None:
                log.warning("task %s run at %s: %s", task_id, due, detail)
                n += 1
        return n

    async def tick_task(self, task: Task, now: float) -> None:
        """Claim every due time of ``task`` between its cursor and ``now`` (epoch s): start a
        run for each claim that lands (the missed ones past the grace are recorded
        ``skipped``), then raise the cursor to the latest."""
        cursor = await self.store.cursor(task.id)
        dues = due_times(task, cursor if cursor is not None else task.anchor, now)
        if not dues:
            return
        latest = dues[-1]
        for due in dues:
            if due != latest and now - due > self.settings.task_grace_s:
                run = TaskRun(
                    task=task.id,
                    due=due,
                    status="skipped",
                    detail=MISSED,
                    instance=self.instance,
                    started=now,
                    ended=now,
                )
                await self.store.claim(run)
                continue
            run = TaskRun(
                task=task.id,
                due=due,
                status="running",
                conversation=new_conversation_id(),
                instance=self.instance,
                started=now,
            )
            token = await self.store.claim(run, lease_s=self.settings.task_lease_s)
            if token is not None:
                job = asyncio.create_task(self.run(task, run, token), name=f"task-{task.id}")
                self.runs.add(job)
                job.add_done_callback(self.runs.discard)
        await self.store.advance(task.id, latest)

    async def run(self, task: Task, run: TaskRun, token: bytes) -> None:
        """Run one claimed due time (renewing its lease meanwhile) and record how it ended."""
        renewer = asyncio.create_task(self._renew(run, token), name=f"task-lease-{task.id}")
        try:
            run = await self._run(task, run)
        except Exception as exc:  # the run's record says why; the scheduler goes on
            log.exception("task %s run at %s failed", task.id, run.due)
            run = run.model_copy(update={"status": "error", "detail": str(exc) or repr(exc)})
        finally:
            renewer.cancel()
        run = run.model_copy(update={"ended": time.time()})
        try:
            if await self.store.update(run, token) is None:
                log.warning("task %s run at %s: taken over, outcome not recorded", task.id, run.due)
        except Exception:  # noqa: BLE001 - Redis away: the lease ends, another records it
            log.warning("task %s run at %s: status not recorded", task.id, run.due)

    async def _renew(self, run: TaskRun, token: bytes) -> None:
        lease_s = self.settings.task_lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                if not await self.store.renew(run, token, lease_s):
                    return  # taken over: nothing more to renew
            except Exception:  # noqa: BLE001 - Redis away: try again at the next beat
                log.warning("task %s run at %s: lease not renewed", run.task, run.due)

    async def _run(self, task: Task, run: TaskRun) -> TaskRun:
        wait_until = time.monotonic() + self.settings.task_wait_s
        while await self.store.person_busy():
            if time.monotonic() > wait_until:
                return run.model_copy(
                    update={
                        "status": "skipped",
                        "conversation": None,
                        "detail": (
                            "the engine was busy with the person's turn for "
                            f"{self.settings.task_wait_s:g} s"
                        ),
                    }
                )
            await asyncio.sleep(0.25)
        assert run.conversation is not None
        actor = await self.ownership.take(run.conversation, create=True, kind="task")
        if actor is None:  # a fresh id: only a clash of random ids lands here
            raise RuntimeError(f"conversation {run.conversation} is owned elsewhere")
        actor.conv.title = f"Task: {task.name or task.prompt[:40]}"
        await actor.enqueue(task_message(task, run.due))
        worker = actor.worker
        if worker is not None:
            await asyncio.shield(worker)
        return outcome(run, actor.conv.log)


def outcome(run: TaskRun, log_events: list[ChatEvent]) -> TaskRun:
    """The run's status from its conversation's last ``turn_end`` event."""
    end = next((e for e in reversed(log_events) if (e.loki or {}).get("event") == "turn_end"), None)
    if end is None:
        return run.model_copy(update={"status": "error", "detail": "the turn did not end"})
    meta = end.loki or {}
    error = meta.get("error")
    if error:
        if str(error).startswith("engine unavailable"):
            return run.model_copy(update={"status": "skipped", "detail": str(error)})
        return run.model_copy(update={"status": "error", "detail": str(error)})
    if meta.get("stopped") or end.finish_reason == "stopped":
        return run.model_copy(update={"status": "error", "detail": "stopped"})
    return run.model_copy(update={"status": "ok", "detail": ""})
