"""``/api/projects``: projects, the active one, export and import (the memory service answers
over NATS through :class:`loki_shared.projects_client.ProjectsClient`).

- ``GET /api/projects`` → ``{"projects": [Project], "active": id}``;
- ``POST /api/projects`` ``{name, description?, instructions?, id?}`` → 201 ``{"project"}``;
- ``GET /api/projects/active`` → ``{"project"}``; ``PUT /api/projects/active``
  ``{"project": id}`` → ``{"project"}`` (new conversations belong to it);
- ``GET /api/projects/{id}`` → ``{"project"}``; ``PATCH`` ``{name?, description?,
  instructions?}`` → ``{"project"}``;
- ``DELETE /api/projects/{id}?confirm={id}`` → the project with its pages and trackers, then
  its conversations (the chat service) and its archived blocks (the recall service):
  ``{"deleted", "pages", "trackers", "conversations"}``; the default project and a wrong
  ``confirm`` are a 409;
- ``GET /api/projects/{id}/block`` → the project block the model gets (its parts);
- ``GET /api/projects/{id}/conversations`` → that project's conversations;
- ``GET /api/projects/{id}/export`` → a zip download (Markdown pages, one CSV per tracker);
- ``POST /api/projects/import?name=`` with the zip as the body → 201 ``{"project"}``.

Project ids are 1 to 64 characters of ``A-Z a-z 0-9 _ -`` (a NATS subject token). Errors are
OpenAI-shaped (:mod:`loki_gateway.errors`): a service refusal keeps its type's status
(``not_found`` 404, ``invalid_request`` 400, ``conflict`` 409, ``locked`` 423), no memory
service is a 503.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from loki_shared import subjects
from loki_shared.messages.chat import ConversationsReply, ConversationsRequest
from loki_shared.messages.recall import PurgeReply, PurgeRequest
from loki_shared.projects_client import ProjectsClient

from ..bus import Bus
from ..deps import get_bus, get_projects
from ..errors import BadRequest, NotFound, UpstreamError
from .chat import CONV_PATTERN

router = APIRouter(tags=["projects"])

ProjectPath = Annotated[str, Path(pattern=CONV_PATTERN, description="Project id.")]
#: The memory service's client, as a route parameter.
Projects = Annotated[ProjectsClient, Depends(get_projects)]
#: The bound of an export or import (a big project's zip).
TRANSFER_TIMEOUT_S = 60.0


class ProjectBody(BaseModel):
    """``POST /api/projects``."""

    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    instructions: str = ""
    id: str | None = Field(default=None, pattern=CONV_PATTERN)


class ProjectPatch(BaseModel):
    """``PATCH /api/projects/{id}``: what is given changes (None: kept)."""

    name: str | None = Field(default=None, min_length=1, max_length=80)
    description: str | None = None
    instructions: str | None = None


class ActiveBody(BaseModel):
    """``PUT /api/projects/active``."""

    project: str = Field(pattern=CONV_PATTERN)


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude={"error"})


@router.get("/api/projects")
async def projects_list(projects: Projects) -> Any:
    reply = await projects.list_projects()
    return {"projects": [_dump(p) for p in reply.projects], "active": reply.active}


@router.post("/api/projects", status_code=201)
async def projects_create(body: ProjectBody, projects: Projects) -> Any:
    project = await projects.create_project(
        body.name, body.description, body.instructions, project_id=body.id
    )
    return JSONResponse({"project": _dump(project)}, status_code=201)


@router.get("/api/projects/active")
async def projects_active(projects: Projects) -> Any:
    return {"project": _dump(await projects.active_project())}


@router.put("/api/projects/active")
async def projects_activate(body: ActiveBody, projects: Projects) -> Any:
    return {"project": _dump(await projects.activate_project(body.project))}


@router.post("/api/projects/import", status_code=201)
async def projects_import(
    request: Request,
    projects: Projects,
    name: Annotated[str | None, Query(min_length=1, max_length=80)] = None,
) -> Any:
    """The body is the zip an export gave (any content type); ``name`` renames it."""
    data = await request.body()
    if not data:
        raise BadRequest("send the exported zip as the request body", code="empty_body")
    project = await projects.import_project(
        base64.b64encode(data).decode(), name=name, timeout=TRANSFER_TIMEOUT_S
    )
    return JSONResponse({"project": _dump(project)}, status_code=201)


@router.get("/api/projects/{project}")
async def projects_get(project: ProjectPath, projects: Projects) -> Any:
    for item in (await projects.list_projects()).projects:
        if item.id == project:
            return {"project": _dump(item)}
    raise NotFound(f"no project {project}", code="project_not_found")


@router.patch("/api/projects/{project}")
async def projects_update(project: ProjectPath, body: ProjectPatch, projects: Projects) -> Any:
    updated = await projects.update_project(
        project, name=body.name, description=body.description, instructions=body.instructions
    )
    return {"project": _dump(updated)}


async def _project_conversations(bus: Bus, project: str) -> list[str]:
    reply = await bus.request_ok(
        subjects.CHAT_CONVERSATIONS,
        ConversationsRequest(action="list", project=project),
        ConversationsReply,
    )
    return [c.id for c in reply.conversations]


@router.delete("/api/projects/{project}")
async def projects_delete(
    project: ProjectPath,
    projects: Projects,
    confirm: Annotated[str, Query(description="The project id again.")] = "",
    bus: Bus = Depends(get_bus),
) -> Any:
    """The memory service deletes first (it refuses the default project and a wrong
    ``confirm``); then each conversation of the project and its archived blocks."""
    reply = await projects.delete_project(project, confirm)
    deleted = await _project_conversations(bus, project)
    for cid in deleted:
        await bus.request_ok(
            subjects.CHAT_CONVERSATIONS,
            ConversationsRequest(action="delete", conversation=cid),
            ConversationsReply,
        )
    await bus.request_ok(subjects.RECALL_PURGE, PurgeRequest(project=project), PurgeReply)
    return {
        "deleted": reply.project_id,
        "pages": reply.pages,
        "trackers": reply.trackers,
        "conversations": deleted,
    }


@router.get("/api/projects/{project}/block")
async def projects_block(project: ProjectPath, projects: Projects) -> Any:
    return _dump(await projects.block(project))


@router.get("/api/projects/{project}/conversations")
async def projects_conversations(project: ProjectPath, bus: Bus = Depends(get_bus)) -> Any:
    reply = await bus.request_ok(
        subjects.CHAT_CONVERSATIONS,
        ConversationsRequest(action="list", project=project),
        ConversationsReply,
    )
    return {"conversations": [c.model_dump(mode="json") for c in reply.conversations]}


@router.get("/api/projects/{project}/export")
async def projects_export(project: ProjectPath, projects: Projects) -> Any:
    reply = await projects.export_project(project, timeout=TRANSFER_TIMEOUT_S)
    try:
        data = base64.b64decode(reply.zip_b64, validate=True)
    except binascii.Error as exc:
        raise UpstreamError(f"the memory service sent a bad zip: {exc}") from exc
    filename = reply.filename or f"loki-project-{project}.zip"
    return Response(
        data,
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
