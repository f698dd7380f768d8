"""A project's workspace and a code-mode conversation's files (issue 43), for the Code panel:

- ``GET /api/workspace?project=`` → ``WorkspaceInfo`` (``exists`` false when the project has
  none yet: not an error); ``POST /api/workspace`` ``{"project", "clone_from"?}`` → 201
  ``WorkspaceInfo``: an empty git repository, or a clone of ``clone_from`` (an absolute
  local path to a git repository; never a URL);
- ``GET /api/chat/files?conversation=&path=&depth=`` → ``{"project", "path", "entries":
  [{"path", "kind", "size"}], "truncated"}``: the tree under ``path`` (default the root),
  ``depth`` levels (default 1: the panel opens a directory when it is expanded), directories
  first; ``.git`` is never listed nor opened;
- ``GET /api/chat/files/content?conversation=&path=`` → a read-only view: ``{"project",
  "path", "size", "text", "html", "language", "first_line", "last_line", "total_lines",
  "truncated", "note", "binary", "mime"}``. ``html`` is ``text`` coloured by
  :mod:`.code_colours` (spans and escaped text only; colours in ``/code-colours.css``). A
  file longer than :data:`VIEW_LINES` lines or :data:`VIEW_CHARS` characters is cut at a
  line's end, ``truncated`` true and ``note`` says where; a binary file is ``binary`` true
  with its ``mime`` and no text.

The conversation's project is its ``CodeState.project`` (``loki.chat.code``); the
workspace service (``loki.workspace.*``, :mod:`loki_shared.messages.workspace`) does the
reading and refuses any path outside the workspace. The gateway refuses before asking an
absolute path, a ``..`` part and a ``.git`` part (400, ``param`` ``path``). Errors are
OpenAI-shaped: 400 bad input, 403 a path outside the workspace, 404 no such conversation,
workspace or file, 409 a workspace that exists already or a conversation not in code mode,
503 a service that does not answer.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from loki_shared import subjects
from loki_shared.errors import Conflict
from loki_shared.messages.code import CodeReply, CodeRequest
from loki_shared.messages.workspace import (
    MAX_PATH,
    PROJECT_ID,
    CreateRequest,
    FileEntry,
    FilesReply,
    FilesRequest,
    InfoRequest,
    ReadReply,
    ReadRequest,
    WorkspaceReply,
)

from ..bus import Bus
from ..deps import get_bus
from ..errors import BadRequest, UpstreamError
from .chat import ConvQuery
from .code_colours import colour

router = APIRouter(tags=["code"])

#: The viewer shows at most this many lines of a file...
VIEW_LINES = 5000
#: ...and this many characters (cut at the end of a line).
VIEW_CHARS = 200_000
#: How long a request waits for the workspace service (a clone: :data:`CLONE_WAIT_S`).
WORKSPACE_WAIT_S = 30.0
CLONE_WAIT_S = 300.0

ProjectQuery = Annotated[
    str, Query(pattern=PROJECT_ID, description="Project id (1-64 of A-Z a-z 0-9 _ -).")
]
PathQuery = Annotated[str, Query(max_length=MAX_PATH, description="Workspace-relative POSIX path.")]


def check_path(path: str) -> str:
    """``path`` as the workspace service gets it (``.`` for the root; a trailing ``/``
    dropped; spaces kept: a name may begin or end with one, as the tree lists it).

    Raises:
        BadRequest: an absolute path, a ``..`` part, a ``.git`` part, or a NUL.
    """
    cleaned = path.rstrip("/") or ("." if not path.strip() else "/")
    parts = cleaned.split("/")
    if cleaned.startswith("/") or "\x00" in cleaned:
        raise BadRequest(
            "path must be relative to the workspace's root (e.g. src/app.py)",
            "invalid_value",
            "path",
        )
    if ".." in parts:
        raise BadRequest(
            "path must not contain '..': name a path inside the workspace", "invalid_value", "path"
        )
    if ".git" in parts:
        raise BadRequest(
            "the .git directory is not shown: name a path outside it", "invalid_value", "path"
        )
    return cleaned


async def project_of(bus: Bus, conversation: str) -> str:
    """The project whose workspace ``conversation`` works in (its ``CodeState.project``).

    Raises:
        NotFound: no such conversation (the chat service's answer).
        Conflict: the conversation has no workspace (not in code mode: its
            ``CodeState.project`` is None).
    """
    reply = await bus.request_ok(
        subjects.CHAT_CODE,
        CodeRequest(conversation=conversation, action="get"),
        CodeReply,
        WORKSPACE_WAIT_S,
    )
    if reply.state is None:
        raise UpstreamError("the chat service answered loki.chat.code without a state")
    if not reply.state.project:
        raise Conflict(
            "this conversation has no workspace: switch it to code mode to see its project's files"
        )
    return reply.state.project


def _order(entry: FileEntry) -> tuple[int, str]:
    return (0 if entry.kind == "dir" else 1, entry.path.lower())


@router.get("/api/workspace")
async def workspace_info(project: ProjectQuery, bus: Bus = Depends(get_bus)) -> Any:
    """The project's ``WorkspaceInfo`` (``exists``, ``branch``, ``head``, ``dirty``,
    ``origin``, ``agents_md``, ``sandbox``)."""
    reply = await bus.request_ok(
        subjects.WORKSPACE_INFO, InfoRequest(project=project), WorkspaceReply, WORKSPACE_WAIT_S
    )
    if reply.info is None:
        raise UpstreamError("the workspace service answered without the workspace")
    return reply.info.model_dump(mode="json")


@router.post("/api/workspace", status_code=201)
async def workspace_create(body: CreateRequest, bus: Bus = Depends(get_bus)) -> Any:
    """Create the project's workspace: empty, or cloned from ``clone_from`` (an absolute
    local path). 201 ``WorkspaceInfo``; 409 when it exists already."""
    source = body.clone_from.strip() if body.clone_from else None
    if source is not None and ("://" in source or not source.startswith("/")):
        raise BadRequest(
            "clone_from must be an absolute local path to a git repository (e.g. "
            "/home/me/src/app), not a URL; leave it out for an empty workspace",
            "invalid_value",
            "clone_from",
        )
    request = CreateRequest(project=body.project, clone_from=source or None)
    reply = await bus.request_ok(subjects.WORKSPACE_CREATE, request, WorkspaceReply, CLONE_WAIT_S)
    if reply.info is None:
        raise UpstreamError("the workspace service answered without the workspace")
    return JSONResponse(reply.info.model_dump(mode="json"), status_code=201)


@router.get("/api/chat/files")
async def chat_files(
    conversation: ConvQuery,
    path: PathQuery = ".",
    depth: Annotated[int, Query(ge=1, le=20, description="Levels listed.")] = 1,
    bus: Bus = Depends(get_bus),
) -> Any:
    """The tree of the conversation's workspace under ``path`` (see the module)."""
    where = check_path(path)
    project = await project_of(bus, conversation)
    request = FilesRequest(project=project, op="list", path=where, depth=depth)
    reply = await bus.request_ok(subjects.WORKSPACE_FILES, request, FilesReply, WORKSPACE_WAIT_S)
    shown = [e for e in reply.entries if ".git" not in e.path.split("/")]
    return {
        "project": project,
        "path": where,
        "entries": [e.model_dump(mode="json") for e in sorted(shown, key=_order)],
        "truncated": reply.truncated,
    }


def _cut(text: str) -> tuple[str, bool]:
    """``text`` within :data:`VIEW_CHARS`, cut at a line's end; whether it was cut."""
    if len(text) <= VIEW_CHARS:
        return text, False
    head = text[:VIEW_CHARS]
    end = head.rfind("\n")
    return (head[: end + 1] if end > 0 else head), True


def _note(read: ReadReply, last_line: int, cut: bool) -> str:
    if not (cut or read.truncated or read.total_lines > last_line):
        return ""
    of = f" of {read.total_lines}" if read.total_lines else ""
    return (
        f"Showing lines 1-{last_line}{of} ({read.size} bytes in all): the viewer shows at "
        f"most {VIEW_LINES} lines and {VIEW_CHARS} characters of a file."
    )


@router.get("/api/chat/files/content")
async def chat_file_content(
    conversation: ConvQuery, path: PathQuery, bus: Bus = Depends(get_bus)
) -> Any:
    """A file of the conversation's workspace, read-only and coloured (see the module)."""
    where = check_path(path)
    if where == ".":
        raise BadRequest("path must name a file of the workspace", "invalid_value", "path")
    project = await project_of(bus, conversation)
    request = ReadRequest(project=project, path=where, offset=1, limit=VIEW_LINES)
    read = await bus.request_ok(subjects.WORKSPACE_READ, request, ReadReply, WORKSPACE_WAIT_S)
    base: dict[str, Any] = {"project": project, "path": read.path or where, "size": read.size}
    if read.binary:
        kind = read.mime or "application/octet-stream"
        note = f"A binary file ({kind}, {read.size} bytes): not shown as text."
        if kind.startswith("text/"):
            note = f"Text in another encoding than UTF-8 ({kind}, {read.size} bytes): not shown."
        return base | {
            "binary": True,
            "mime": kind,
            "text": "",
            "html": "",
            "language": "",
            "first_line": 0,
            "last_line": 0,
            "total_lines": 0,
            "truncated": False,
            "note": note,
        }
    text, cut = _cut(read.text)
    coloured = await anyio.to_thread.run_sync(colour, where, text)
    first = max(read.first_line, 1)
    last = (first + coloured.lines - 1) if coloured.lines else 0
    return base | {
        "binary": False,
        "mime": read.mime,
        "text": text,
        "html": coloured.html,
        "language": coloured.language,
        "first_line": first if coloured.lines else 0,
        "last_line": last,
        "total_lines": read.total_lines,
        "truncated": bool(cut or read.truncated or read.total_lines > last),
        "note": _note(read, last, cut),
    }
