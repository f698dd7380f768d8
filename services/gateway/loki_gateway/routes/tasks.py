"""Scheduled tasks: ``/api/tasks`` (list, create), ``/api/tasks/{id}`` (get, replace,
delete), ``/api/tasks/{id}/runs`` (its runs, newest first), ``/api/tasks/preview`` (a schedule
checked as a task's would be, and its next three run times in its time zone: what the task
dialog shows as the person types).

Every route is a ``loki.chat.tasks`` request to the chat service; a task's body is
:class:`loki_shared.messages.tasks.TaskSpec`. A bad body, cron expression, interval or time
zone is a 400 in OpenAI's shape saying what to resend; an unknown task a 404.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from loki_shared import subjects
from loki_shared.messages.tasks import ScheduleSpec, TaskSpec, TasksReply, TasksRequest

from ..bus import Bus
from ..deps import get_bus

router = APIRouter(tags=["tasks"])

TaskPath = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="Task id (32 hex).")]


async def _tasks(bus: Bus, **fields: Any) -> TasksReply:
    return await bus.request_ok(subjects.CHAT_TASKS, TasksRequest(**fields), TasksReply)


@router.get("/api/tasks")
async def tasks_list(bus: Bus = Depends(get_bus)) -> Any:
    """``{"tasks": [Task]}``, oldest first."""
    reply = await _tasks(bus, action="list")
    return {"tasks": [t.model_dump(mode="json") for t in reply.tasks]}


@router.post("/api/tasks", status_code=201)
async def tasks_create(body: TaskSpec, bus: Bus = Depends(get_bus)) -> Any:
    """Create a task: 201 ``{"task": Task}``."""
    reply = await _tasks(bus, action="create", spec=body)
    return JSONResponse({"task": reply.tasks[0].model_dump(mode="json")}, status_code=201)


@router.post("/api/tasks/preview")
async def tasks_preview(body: ScheduleSpec, bus: Bus = Depends(get_bus)) -> Any:
    """Check a schedule (``cron`` or ``interval_s``, ``tz``) as creating a task would (a 400
    saying why when it is refused) and give its next three run times: ``{"tz", "next_runs":
    [{"at": epoch seconds, "local": ISO 8601 in the task's time zone}]}``. Nothing stored."""
    reply = await _tasks(bus, action="preview", schedule=body)
    zone = ZoneInfo(body.tz)  # known: the chat service checked it
    runs = [
        {"at": t, "local": datetime.fromtimestamp(t, zone).isoformat(timespec="minutes")}
        for t in reply.next_runs
    ]
    return {"tz": body.tz, "next_runs": runs}


@router.get("/api/tasks/{task}")
async def tasks_get(task: TaskPath, bus: Bus = Depends(get_bus)) -> Any:
    """``{"task": Task}``."""
    reply = await _tasks(bus, action="get", task=task)
    return {"task": reply.tasks[0].model_dump(mode="json")}


@router.put("/api/tasks/{task}")
async def tasks_replace(task: TaskPath, body: TaskSpec, bus: Bus = Depends(get_bus)) -> Any:
    """Replace a task's spec (on/off included): ``{"task": Task}``. A changed schedule or a
    task switched on counts its due times from now."""
    reply = await _tasks(bus, action="update", task=task, spec=body)
    return {"task": reply.tasks[0].model_dump(mode="json")}


@router.delete("/api/tasks/{task}")
async def tasks_delete(task: TaskPath, bus: Bus = Depends(get_bus)) -> Any:
    """Delete a task and its run records (the runs' conversations stay)."""
    await _tasks(bus, action="delete", task=task)
    return {"ok": True, "deleted": task}


@router.get("/api/tasks/{task}/runs")
async def tasks_runs(task: TaskPath, bus: Bus = Depends(get_bus)) -> Any:
    """``{"runs": [TaskRun]}``, newest first (``conversation``: open it as any other)."""
    reply = await _tasks(bus, action="runs", task=task)
    return {"runs": [r.model_dump(mode="json") for r in reply.runs]}
