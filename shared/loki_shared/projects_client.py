"""A thin typed client of the memory service (``loki.projects.*``), for the chat service and
the gateway.

Each method sends one request (checked against :data:`loki_shared.subjects.EXCHANGES`) and
returns the reply's payload, or raises:

- the :mod:`loki_shared.errors` class of the reply's ``error.type`` (``NotFound``,
  ``InvalidRequest`` — its message says what to resend —, ``Conflict``, ``Locked``,
  ``Unavailable``...);
- :class:`loki_shared.errors.Unavailable` when no memory service answers within ``timeout``
  (no responders, timeout, a broken connection);
- :class:`loki_shared.errors.InvalidRequest` when the request itself is over the bus's message
  limit (NATS ``max_payload``, 1 MiB by default: a big import or page);
- :class:`loki_shared.errors.LokiError` (``internal``) for a reply that is not the subject's
  reply type.

The transport is any object with ``request(subject, data: bytes, timeout)`` returning a
message with ``.data`` (a nats-py ``Client``) — :meth:`ProjectsClient.from_nats` — or a
FastStream ``NatsBroker`` — :meth:`ProjectsClient.from_broker`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from . import subjects
from .errors import InvalidRequest, LokiError, Unavailable, from_info
from .messages import projects as m
from .messages.base import Reply

R = TypeVar("R", bound=Reply)

#: Sends ``data`` on ``subject`` and returns the reply's body; raises on no answer.
Send = Callable[[str, bytes, float], Awaitable[bytes]]

#: Seconds a request waits by default (an export or import of a big project may need more).
DEFAULT_TIMEOUT = 5.0


class ProjectsClient:
    """Typed requests to the memory service over one NATS connection.

    Args:
        send: the transport (see the module's docstring); use :meth:`from_nats` or
            :meth:`from_broker`.
        timeout: seconds each request waits for its reply.
    """

    def __init__(self, send: Send, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._send = send
        self.timeout = timeout

    @classmethod
    def from_nats(cls, client: Any, timeout: float = DEFAULT_TIMEOUT) -> ProjectsClient:
        """A client over a nats-py ``Client`` (the gateway's connection)."""

        async def send(subject: str, data: bytes, wait: float) -> bytes:
            msg = await client.request(subject, data, timeout=wait)
            return bytes(msg.data)

        return cls(send, timeout)

    @classmethod
    def from_broker(cls, broker: Any, timeout: float = DEFAULT_TIMEOUT) -> ProjectsClient:
        """A client over a started FastStream ``NatsBroker`` (the chat service's)."""

        async def send(subject: str, data: bytes, wait: float) -> bytes:
            msg = await broker.request(data, subject, timeout=wait)
            return bytes(msg.body)

        return cls(send, timeout)

    async def _call(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float | None = None
    ) -> R:
        subjects.check(subject, message, reply_type)
        try:
            body = await self._send(
                subject, message.model_dump_json().encode(), timeout or self.timeout
            )
        except (TimeoutError, ConnectionError) as exc:
            raise Unavailable(f"the memory service did not answer {subject}") from exc
        except Exception as exc:  # nats-py / FastStream: no responders, closed connection
            if type(exc).__name__ in {"NoRespondersError", "TimeoutError", "ConnectionClosedError"}:
                raise Unavailable(f"the memory service did not answer {subject}") from exc
            if type(exc).__name__ == "MaxPayloadError":
                raise InvalidRequest(
                    f"the request on {subject} is over the bus's message limit (NATS "
                    "max_payload): send less"
                ) from exc
            raise
        try:
            reply = reply_type.model_validate_json(body)
        except ValidationError as exc:
            raise LokiError(f"bad reply on {subject}: {exc.errors()[:1]}") from exc
        if reply.error is not None:
            raise from_info(reply.error)
        return reply

    # --- projects ---------------------------------------------------------------------------
    async def list_projects(self) -> m.ProjectsReply:
        """Every project and the active one's id."""
        return await self._call(subjects.PROJECTS_LIST, m.ProjectsListRequest(), m.ProjectsReply)

    async def create_project(
        self,
        name: str,
        description: str = "",
        instructions: str = "",
        project_id: str | None = None,
    ) -> m.Project:
        """Create a project (see :class:`~loki_shared.messages.projects.ProjectCreateRequest`).

        Raises: InvalidRequest (bad name or id), Conflict (id taken), Locked.
        """
        req = m.ProjectCreateRequest(
            name=name, description=description, instructions=instructions, id=project_id
        )
        return _project(await self._call(subjects.PROJECTS_CREATE, req, m.ProjectReply))

    async def update_project(
        self,
        project_id: str,
        name: str | None = None,
        description: str | None = None,
        instructions: str | None = None,
    ) -> m.Project:
        """Change a project's name, description or instructions (None: keep).

        Raises: NotFound, InvalidRequest, Locked.
        """
        req = m.ProjectUpdateRequest(
            project_id=project_id, name=name, description=description, instructions=instructions
        )
        return _project(await self._call(subjects.PROJECTS_UPDATE, req, m.ProjectReply))

    async def delete_project(self, project_id: str, confirm: str) -> m.ProjectDeleteReply:
        """Delete a project with its pages and trackers (``confirm`` repeats the id).

        Raises: NotFound, Conflict (the default project, or a wrong ``confirm``).
        """
        req = m.ProjectDeleteRequest(project_id=project_id, confirm=confirm)
        return await self._call(subjects.PROJECTS_DELETE, req, m.ProjectDeleteReply)

    async def active_project(self) -> m.Project:
        """The active project (the default one until another is activated)."""
        reply = await self._call(subjects.PROJECTS_ACTIVE, m.ActiveProjectRequest(), m.ProjectReply)
        return _project(reply)

    async def activate_project(self, project_id: str) -> m.Project:
        """Make ``project_id`` the active project. Raises: NotFound."""
        req = m.ActivateProjectRequest(project_id=project_id)
        return _project(await self._call(subjects.PROJECTS_ACTIVATE, req, m.ProjectReply))

    async def block(self, project_id: str | None = None) -> m.ProjectBlock:
        """The project block of ``project_id`` (None: the active project).

        Raises: NotFound, Locked (the memory is encrypted and locked).
        """
        req = m.ProjectBlockRequest(project_id=project_id)
        reply = await self._call(subjects.PROJECTS_BLOCK, req, m.ProjectBlockReply)
        if reply.block is None:
            raise LokiError(f"no block in the reply on {subjects.PROJECTS_BLOCK}")
        return reply.block

    # --- pages ------------------------------------------------------------------------------
    async def read_page(self, project_id: str, page: str) -> m.Page:
        """One page (``page``: ``notes.md`` or ``notes``). Raises: NotFound, Locked,
        InvalidRequest (a name that gives no file)."""
        req = m.PageReadRequest(project_id=project_id, page=page)
        return _page(await self._call(subjects.PROJECTS_PAGE_READ, req, m.PageReply))

    async def write_page(
        self, project_id: str, page: str, content: str, description: str | None = None
    ) -> m.PageReply:
        """Create or replace a page; ``reply.created`` says which. Raises: NotFound (project),
        InvalidRequest (bad name, too long), Locked."""
        req = m.PageWriteRequest(
            project_id=project_id, page=page, content=content, description=description
        )
        return await self._call(subjects.PROJECTS_PAGE_WRITE, req, m.PageReply)

    async def delete_page(self, project_id: str, page: str) -> str:
        """Delete a page; returns its file. Raises: NotFound, Locked."""
        req = m.PageDeleteRequest(project_id=project_id, page=page)
        return (await self._call(subjects.PROJECTS_PAGE_DELETE, req, m.PageDeleteReply)).file

    async def list_pages(self, project_id: str) -> m.PagesReply:
        """Every page's metadata and the ``MEMORY.md`` text. Raises: NotFound, Locked."""
        req = m.PageListRequest(project_id=project_id)
        return await self._call(subjects.PROJECTS_PAGE_LIST, req, m.PagesReply)

    async def search_pages(self, project_id: str, query: str, limit: int = 10) -> list[m.SearchHit]:
        """Pages matching ``query``, best first. Raises: NotFound, InvalidRequest, Locked."""
        req = m.PageSearchRequest(project_id=project_id, query=query, limit=limit)
        return (await self._call(subjects.PROJECTS_PAGE_SEARCH, req, m.SearchReply)).hits

    # --- trackers ---------------------------------------------------------------------------
    async def log_value(
        self,
        project_id: str,
        tracker: str,
        value: float,
        unit: str | None = None,
        date: str | None = None,
        note: str = "",
    ) -> m.TrackerLogReply:
        """Add a dated value to a tracker (created on first use). Raises: NotFound (project),
        InvalidRequest (bad name, date, unit mismatch), Locked."""
        req = m.TrackerLogRequest(
            project_id=project_id, tracker=tracker, value=value, unit=unit, date=date, note=note
        )
        return await self._call(subjects.PROJECTS_TRACKER_LOG, req, m.TrackerLogReply)

    async def read_tracker(
        self,
        project_id: str,
        tracker: str,
        level: m.TrackerLevel = "overview",
        period: str | None = None,
        limit: int = 100,
    ) -> m.TrackerReadReply:
        """One level of a tracker (see
        :class:`~loki_shared.messages.projects.TrackerReadRequest`). Raises: NotFound,
        InvalidRequest (bad level or period), Locked."""
        req = m.TrackerReadRequest(
            project_id=project_id, tracker=tracker, level=level, period=period, limit=limit
        )
        return await self._call(subjects.PROJECTS_TRACKER_READ, req, m.TrackerReadReply)

    async def list_trackers(self, project_id: str) -> list[m.Tracker]:
        """The project's trackers, sorted by slug. Raises: NotFound, Locked."""
        req = m.TrackerListRequest(project_id=project_id)
        return (await self._call(subjects.PROJECTS_TRACKER_LIST, req, m.TrackersReply)).trackers

    async def delete_tracker(self, project_id: str, tracker: str) -> str:
        """Delete a tracker and its values; returns its slug. Raises: NotFound, Locked."""
        req = m.TrackerDeleteRequest(project_id=project_id, tracker=tracker)
        reply = await self._call(subjects.PROJECTS_TRACKER_DELETE, req, m.TrackerDeleteReply)
        return reply.slug

    # --- export / import --------------------------------------------------------------------
    async def export_project(self, project_id: str, timeout: float = 30.0) -> m.ExportReply:
        """The project as a zip (base64). Raises: NotFound, Locked."""
        req = m.ExportRequest(project_id=project_id)
        return await self._call(subjects.PROJECTS_EXPORT, req, m.ExportReply, timeout)

    async def import_project(
        self, zip_b64: str, name: str | None = None, timeout: float = 30.0
    ) -> m.Project:
        """A new project from an export. Raises: InvalidRequest (not an export), Locked."""
        req = m.ImportRequest(zip_b64=zip_b64, name=name)
        return _project(await self._call(subjects.PROJECTS_IMPORT, req, m.ProjectReply, timeout))


def _project(reply: m.ProjectReply) -> m.Project:
    if reply.project is None:
        raise LokiError("a project reply without its project")
    return reply.project


def _page(reply: m.PageReply) -> m.Page:
    if reply.page is None:
        raise LokiError("a page reply without its page")
    return reply.page
