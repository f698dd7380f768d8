"""What the memory service answers on each ``loki.projects.*`` request subject: one method
per subject, request model in, reply model out (see :mod:`loki_shared.messages.projects`).

A method raises :mod:`loki_shared.errors` classes (``not_found``, ``invalid_request``,
``conflict``, ``locked``, ``unavailable``); the broker's exception middleware answers them.
Every change is announced on ``loki.projects.changed`` through ``announce`` and recorded as the
project's latest change (its block's ``as_of``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loki_shared import subjects
from loki_shared.errors import Conflict
from loki_shared.messages import projects as m
from loki_shared.messages.base import Reply

from . import block, index, levels, search, transfer
from .store import Store

#: Publishes one change event (best effort: a failure is logged, never answered).
Announce = Callable[[m.ProjectChangedEvent], Awaitable[None]]


class Handlers:
    """The request handlers over one :class:`~loki_memory.store.Store`.

    Args:
        store: the state.
        announce: where change events go.
        max_reply: the largest reply the bus carries (bytes; NATS ``max_payload``), asked at
            each export.
    """

    def __init__(
        self, store: Store, announce: Announce, max_reply: Callable[[], int] = lambda: 1 << 20
    ) -> None:
        self.store = store
        self.announce = announce
        self.max_reply = max_reply

    async def _changed(self, project_id: str, kind: m.ChangeKind, key: str | None = None) -> None:
        ts = time.time()
        if kind != "deleted":
            await self.store.projects.touch(project_id, ts)
        await self.announce(m.ProjectChangedEvent(project_id=project_id, kind=kind, key=key, ts=ts))

    def table(self) -> dict[str, Callable[[Any], Awaitable[Reply]]]:
        """Subject → handler, one row per request subject of
        :data:`loki_shared.subjects.EXCHANGES` under ``loki.projects.`` (whose row gives the
        request and reply types)."""
        return {
            subjects.PROJECTS_LIST: self.list_projects,
            subjects.PROJECTS_CREATE: self.create,
            subjects.PROJECTS_UPDATE: self.update,
            subjects.PROJECTS_DELETE: self.delete,
            subjects.PROJECTS_ACTIVE: self.active,
            subjects.PROJECTS_ACTIVATE: self.activate,
            subjects.PROJECTS_BLOCK: self.block,
            subjects.PROJECTS_PAGE_READ: self.page_read,
            subjects.PROJECTS_PAGE_WRITE: self.page_write,
            subjects.PROJECTS_PAGE_DELETE: self.page_delete,
            subjects.PROJECTS_PAGE_LIST: self.page_list,
            subjects.PROJECTS_PAGE_SEARCH: self.page_search,
            subjects.PROJECTS_TRACKER_LOG: self.tracker_log,
            subjects.PROJECTS_TRACKER_READ: self.tracker_read,
            subjects.PROJECTS_TRACKER_LIST: self.tracker_list,
            subjects.PROJECTS_TRACKER_DELETE: self.tracker_delete,
            subjects.PROJECTS_EXPORT: self.export,
            subjects.PROJECTS_IMPORT: self.import_,
        }

    # --- projects ----------------------------------------------------------------------------
    async def list_projects(self, req: m.ProjectsListRequest) -> m.ProjectsReply:
        """``loki.projects.list``."""
        projects = await self.store.projects.all()
        return m.ProjectsReply(projects=projects, active=await self.store.projects.active())

    async def create(self, req: m.ProjectCreateRequest) -> m.ProjectReply:
        """``loki.projects.create``."""
        project = await self.store.projects.create(
            req.name, req.description, req.instructions, req.id
        )
        await self._changed(project.id, "created")
        return m.ProjectReply(project=await self.store.projects.get(project.id))

    async def update(self, req: m.ProjectUpdateRequest) -> m.ProjectReply:
        """``loki.projects.update``."""
        project = await self.store.projects.update(
            req.project_id, req.name, req.description, req.instructions
        )
        kinds: list[m.ChangeKind] = []
        if req.name is not None:
            kinds.append("name")
        if req.description is not None:
            kinds.append("description")
        if req.instructions is not None:
            kinds.append("instructions")
        for kind in kinds:
            await self._changed(project.id, kind)
        return m.ProjectReply(project=await self.store.projects.get(project.id))

    async def delete(self, req: m.ProjectDeleteRequest) -> m.ProjectDeleteReply:
        """``loki.projects.delete``."""
        pages, trackers = await self.store.projects.delete(req.project_id, req.confirm)
        self.store.trackers.cache.drop(req.project_id)
        await self._changed(req.project_id, "deleted")
        return m.ProjectDeleteReply(project_id=req.project_id, pages=pages, trackers=trackers)

    async def active(self, req: m.ActiveProjectRequest) -> m.ProjectReply:
        """``loki.projects.active``."""
        pid = await self.store.projects.active()
        return m.ProjectReply(project=await self.store.projects.get(pid))

    async def activate(self, req: m.ActivateProjectRequest) -> m.ProjectReply:
        """``loki.projects.activate``."""
        return m.ProjectReply(project=await self.store.projects.activate(req.project_id))

    async def block(self, req: m.ProjectBlockRequest) -> m.ProjectBlockReply:
        """``loki.projects.block``."""
        pid = req.project_id or await self.store.projects.active()
        return m.ProjectBlockReply(block=await block.build(self.store, pid))

    # --- pages -------------------------------------------------------------------------------
    async def page_read(self, req: m.PageReadRequest) -> m.PageReply:
        """``loki.projects.page.read``."""
        await self.store.projects.require(req.project_id)
        return m.PageReply(page=await self.store.pages.read(req.project_id, req.page))

    async def page_write(self, req: m.PageWriteRequest) -> m.PageReply:
        """``loki.projects.page.write``."""
        await self.store.projects.require(req.project_id)
        page, created = await self.store.pages.write(
            req.project_id, req.page, req.content, req.description
        )
        await self._changed(req.project_id, "page", page.file)
        return m.PageReply(page=page, created=created)

    async def page_delete(self, req: m.PageDeleteRequest) -> m.PageDeleteReply:
        """``loki.projects.page.delete``."""
        await self.store.projects.require(req.project_id)
        file = await self.store.pages.delete(req.project_id, req.page)
        await self._changed(req.project_id, "page", file)
        return m.PageDeleteReply(file=file)

    async def page_list(self, req: m.PageListRequest) -> m.PagesReply:
        """``loki.projects.page.list``."""
        await self.store.projects.require(req.project_id)
        pages = await self.store.pages.all(req.project_id)
        metas = [m.PageMeta.model_validate(p.model_dump(exclude={"content"})) for p in pages]
        return m.PagesReply(pages=metas, index=index.text(metas))

    async def page_search(self, req: m.PageSearchRequest) -> m.SearchReply:
        """``loki.projects.page.search``."""
        await self.store.projects.require(req.project_id)
        pages = await self.store.pages.all(req.project_id)
        return m.SearchReply(hits=search.search(pages, req.query, req.limit))

    # --- trackers ----------------------------------------------------------------------------
    async def tracker_log(self, req: m.TrackerLogRequest) -> m.TrackerLogReply:
        """``loki.projects.tracker.log``."""
        await self.store.projects.require(req.project_id)
        tracker, value, created = await self.store.trackers.log(
            req.project_id, req.tracker, req.value, req.unit, req.date, req.note
        )
        await self._changed(req.project_id, "tracker", tracker.slug)
        return m.TrackerLogReply(tracker=tracker, value=value, created=created)

    async def tracker_read(self, req: m.TrackerReadRequest) -> m.TrackerReadReply:
        """``loki.projects.tracker.read``."""
        await self.store.projects.require(req.project_id)
        tracker, values = await self.store.trackers.series(req.project_id, req.tracker)
        return levels.read(tracker, values, req.level, req.period, req.limit)

    async def tracker_list(self, req: m.TrackerListRequest) -> m.TrackersReply:
        """``loki.projects.tracker.list``."""
        await self.store.projects.require(req.project_id)
        return m.TrackersReply(trackers=await self.store.trackers.all(req.project_id))

    async def tracker_delete(self, req: m.TrackerDeleteRequest) -> m.TrackerDeleteReply:
        """``loki.projects.tracker.delete``."""
        await self.store.projects.require(req.project_id)
        slug = await self.store.trackers.delete(req.project_id, req.tracker)
        await self._changed(req.project_id, "tracker", slug)
        return m.TrackerDeleteReply(slug=slug)

    # --- export / import ---------------------------------------------------------------------
    async def export(self, req: m.ExportRequest) -> m.ExportReply:
        """Raises ``conflict`` when the zip would not fit in one NATS message (the reply
        would be lost and the caller left waiting)."""
        filename, data = await transfer.export(self.store, req.project_id)
        reply = m.ExportReply(filename=filename, zip_b64=base64.b64encode(data).decode("ascii"))
        size, limit = len(reply.zip_b64) + len(filename) + 64, self.max_reply()
        if size > limit:
            raise Conflict(
                f"the export of {req.project_id!r} is {size} bytes, over the bus's limit of "
                f"{limit} (NATS max_payload): raise max_payload or move pages to another project"
            )
        return reply

    async def import_(self, req: m.ImportRequest) -> m.ProjectReply:
        """``loki.projects.import``."""
        project = await transfer.import_(self.store, req.zip_b64, req.name)
        await self._changed(project.id, "created")
        return m.ProjectReply(project=await self.store.projects.get(project.id))
