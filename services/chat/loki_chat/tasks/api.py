"""``loki.chat.tasks``: list, get, create, update, delete a task; list its runs.

Served by every chat instance (queue group ``chat``): tasks live in Redis, so any instance
answers. A bad schedule or time zone is an ``invalid_request`` saying what to resend
(:func:`.schedule.check`); an unknown task id is ``not_found``. ``preview`` checks a schedule
alone and gives its next :data:`PREVIEW_RUNS` run times (the task dialog shows them as the
person types).
"""

from __future__ import annotations

import time
import uuid

from loki_shared.errors import InvalidRequest, NotFound
from loki_shared.messages.tasks import Task, TasksReply, TasksRequest

from .schedule import check, next_times
from .store import TaskStore

#: Fields whose change restarts the schedule (due times count again from the change).
SCHEDULE_FIELDS = ("cron", "interval_s", "tz")
#: Run times a preview gives.
PREVIEW_RUNS = 3


class TasksApi:
    """The handler of ``loki.chat.tasks``.

    Args:
        store: the task store.
    """

    def __init__(self, store: TaskStore) -> None:
        self.store = store

    async def handle(self, req: TasksRequest) -> TasksReply:
        """Serve one request.

        Raises:
            InvalidRequest: a missing ``task`` id or ``spec``, a bad schedule or time zone.
            NotFound: no task with that id.
        """
        if req.action == "list":
            return TasksReply(tasks=await self.store.all())
        if req.action == "preview":
            if req.schedule is None:
                raise InvalidRequest("'schedule' is required to preview a schedule")
            check(req.schedule)
            return TasksReply(next_runs=next_times(req.schedule, time.time(), PREVIEW_RUNS))
        if req.action == "create":
            if req.spec is None:
                raise InvalidRequest("'spec' is required to create a task")
            check(req.spec)
            now = time.time()
            task = Task(
                id=uuid.uuid4().hex, created=now, updated=now, anchor=now, **req.spec.model_dump()
            )
            await self.store.put(task)
            return TasksReply(tasks=[task])
        if not req.task:
            raise InvalidRequest(f"'task' (a task id) is required to {req.action} a task")
        task_or_none = await self.store.get(req.task)
        if task_or_none is None:
            raise NotFound(f"no task {req.task}")
        task = task_or_none
        if req.action == "get":
            return TasksReply(tasks=[task])
        if req.action == "runs":
            return TasksReply(tasks=[task], runs=await self.store.runs(task.id))
        if req.action == "delete":
            await self.store.delete(task.id)
            return TasksReply(tasks=[task])
        if req.spec is None:
            raise InvalidRequest("'spec' is required to update a task")
        check(req.spec)
        now = time.time()
        restart = any(getattr(req.spec, f) != getattr(task, f) for f in SCHEDULE_FIELDS) or (
            req.spec.enabled and not task.enabled
        )
        updated = Task(
            id=task.id,
            created=task.created,
            updated=now,
            anchor=now if restart else task.anchor,
            **req.spec.model_dump(),
        )
        await self.store.put(updated)
        if restart:  # no backfill of the due times while it was off or on another schedule
            await self.store.reset_cursor(task.id)
        return TasksReply(tasks=[updated])
