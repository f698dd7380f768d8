"""The content of a project's block, as the chat service puts it at the head of a
conversation (see :class:`loki_shared.messages.projects.ProjectBlock`)."""

from __future__ import annotations

from loki_shared.messages.projects import ProjectBlock

from . import index, levels
from .store import Store


async def build(store: Store, project_id: str) -> ProjectBlock:
    """The block of ``project_id``: its description, instructions, the index lines and the
    latest value line of each tracker; ``as_of`` is the project's latest change.

    Raises:
        NotFound: no such project.
        Locked: the memory is locked.
    """
    project = await store.projects.get(project_id)
    body = await store.projects.body(project_id)
    pages = await store.pages.all(project_id)
    trackers = await store.trackers.all(project_id)
    return ProjectBlock(
        project_id=project.id,
        name=project.name,
        description=body["description"],
        instructions=body["instructions"],
        index=index.lines(pages),
        trackers={t.slug: levels.block_line(t) for t in trackers},
        as_of=project.updated_at,
    )
