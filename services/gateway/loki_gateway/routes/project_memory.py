"""``/api/projects/{id}/pages…`` and ``/api/projects/{id}/trackers…``: a project's memory
pages and trackers (the memory service answers; see :mod:`.projects` for the errors).

Pages (Markdown; the index ``MEMORY.md`` is kept by the memory service, never written here):

- ``GET …/pages`` → ``{"pages": [PageMeta], "index": "<MEMORY.md text>"}``;
- ``GET …/pages/{page}`` → the page with its ``content`` (``page``: ``notes.md`` or ``notes``);
- ``PUT …/pages/{page}`` ``{content, description?}`` → ``{"page", "created"}`` (201 when new);
- ``DELETE …/pages/{page}`` → ``{"deleted": file}``;
- ``GET …/search?q=words&limit=10`` → ``{"hits": [SearchHit]}``.

Trackers (dated values with a unit, read in levels, never all at once):

- ``GET …/trackers`` → ``{"trackers": [Tracker]}`` (each with its latest value);
- ``POST …/trackers/{tracker}/values`` ``{value, unit?, date?, note?}`` → 201
  ``{"tracker", "value", "created"}`` (the tracker is created on first use);
- ``GET …/trackers/{tracker}?level=overview|year|month|events&period=&limit=`` → one level
  (``periods`` or ``events``, and ``text``);
- ``DELETE …/trackers/{tracker}`` → ``{"deleted": slug}``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from loki_shared.messages.projects import TrackerLevel

from .projects import ProjectPath, Projects

router = APIRouter(tags=["projects"])

#: A page or tracker name as sent (the memory service derives the file or slug).
NAME_PATTERN = r"^[^/\x00-\x1f]{1,120}$"
PagePath = Annotated[str, Path(pattern=NAME_PATTERN, description="Page file or name.")]
TrackerPath = Annotated[str, Path(pattern=NAME_PATTERN, description="Tracker slug or name.")]


class PageBody(BaseModel):
    """``PUT …/pages/{page}``: the whole page; ``description`` None keeps the page's."""

    content: str
    description: str | None = Field(default=None, max_length=300)


class ValueBody(BaseModel):
    """``POST …/trackers/{tracker}/values``: ``date`` ``YYYY-MM-DD`` (None: today, UTC)."""

    value: float
    unit: str | None = Field(default=None, max_length=40)
    date: str | None = None
    note: str = Field(default="", max_length=300)


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude={"error"})


@router.get("/api/projects/{project}/pages")
async def pages_list(project: ProjectPath, projects: Projects) -> Any:
    reply = await projects.list_pages(project)
    return {"pages": [_dump(p) for p in reply.pages], "index": reply.index}


@router.get("/api/projects/{project}/pages/{page}")
async def pages_read(project: ProjectPath, page: PagePath, projects: Projects) -> Any:
    return _dump(await projects.read_page(project, page))


@router.put("/api/projects/{project}/pages/{page}")
async def pages_write(
    project: ProjectPath,
    page: PagePath,
    body: PageBody,
    projects: Projects,
) -> Any:
    reply = await projects.write_page(project, page, body.content, body.description)
    content = {"page": _dump(reply.page) if reply.page else None, "created": reply.created}
    return JSONResponse(content, status_code=201 if reply.created else 200)


@router.delete("/api/projects/{project}/pages/{page}")
async def pages_delete(project: ProjectPath, page: PagePath, projects: Projects) -> Any:
    return {"deleted": await projects.delete_page(project, page)}


@router.get("/api/projects/{project}/search")
async def pages_search(
    project: ProjectPath,
    projects: Projects,
    q: Annotated[str, Query(min_length=1, max_length=500)],
    limit: Annotated[int, Query(ge=1, le=50)] = 10,
) -> Any:
    hits = await projects.search_pages(project, q, limit)
    return {"hits": [_dump(h) for h in hits]}


@router.get("/api/projects/{project}/trackers")
async def trackers_list(project: ProjectPath, projects: Projects) -> Any:
    return {"trackers": [_dump(t) for t in await projects.list_trackers(project)]}


@router.post("/api/projects/{project}/trackers/{tracker}/values", status_code=201)
async def trackers_log(
    project: ProjectPath,
    tracker: TrackerPath,
    body: ValueBody,
    projects: Projects,
) -> Any:
    reply = await projects.log_value(
        project, tracker, body.value, unit=body.unit, date=body.date, note=body.note
    )
    return JSONResponse(_dump(reply), status_code=201)


@router.get("/api/projects/{project}/trackers/{tracker}")
async def trackers_read(
    project: ProjectPath,
    tracker: TrackerPath,
    projects: Projects,
    level: TrackerLevel = "overview",
    period: Annotated[str | None, Query(max_length=10)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    return _dump(await projects.read_tracker(project, tracker, level, period or None, limit))


@router.delete("/api/projects/{project}/trackers/{tracker}")
async def trackers_delete(project: ProjectPath, tracker: TrackerPath, projects: Projects) -> Any:
    return {"deleted": await projects.delete_tracker(project, tracker)}
