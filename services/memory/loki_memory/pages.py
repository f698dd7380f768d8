"""Memory pages in Redis: one private record per page (see :mod:`loki_memory.vault`) in the
hash ``loki:projects:pages:<project id>``, keyed by a keyed hash of its file.

A page record is ``{"file", "title", "description", "content", "updated_at"}``. The callers
check that the project exists; every operation here needs the memory open
(:class:`loki_shared.errors.Locked` otherwise).
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from loki_shared.errors import InvalidRequest, NotFound
from loki_shared.messages.projects import Page

from . import index, keys, names
from .vault import Vault

#: Longest page (UTF-8 bytes of its content).
CONTENT_MAX = 256 * 1024


class Pages:
    """The memory pages of one Redis.

    Args:
        redis: an asyncio Redis client (bytes responses).
        vault: the service's sealing.
    """

    def __init__(self, redis: Redis, vault: Vault) -> None:
        self.redis = redis
        self.vault = vault
        self._hset = redis.register_script(keys.HSET_IN_PROJECT)

    def _open(self, project_id: str, field: str, blob: bytes) -> Page:
        return Page.model_validate(self.vault.open_private(keys.aad_page(project_id, field), blob))

    async def all(self, project_id: str) -> list[Page]:
        """Every page of ``project_id``, sorted by file.

        Raises:
            Locked: the memory is locked.
        """
        await self.vault.require_open()
        with keys.guard():
            stored = await self.redis.hgetall(keys.pages(project_id))
        found = [self._open(project_id, f.decode(), blob) for f, blob in stored.items()]
        return sorted(found, key=lambda p: p.file)

    async def read(self, project_id: str, page: str) -> Page:
        """One page (``page``: a file or a name); ``MEMORY.md`` reads as the index.

        Raises:
            NotFound: no such page.
            InvalidRequest: ``page`` gives no file.
            Locked: the memory is locked.
        """
        if names.is_index(page):
            pages = await self.all(project_id)
            return Page(file=names.INDEX_FILE, title=index.INDEX_TITLE, content=index.text(pages))
        file = names.page_file(page)
        await self.vault.require_open()
        file = await self._stored_file(project_id, page, file)
        field = self.vault.field(project_id, file)
        with keys.guard():
            blob = await self.redis.hget(keys.pages(project_id), field)
        if blob is None:
            raise NotFound(f"no page {file} in project {project_id!r}")
        return self._open(project_id, field, blob)

    async def _stored_file(self, project_id: str, page: str, file: str) -> str:
        """``file``, or the legacy file of ``page`` when only that one is stored (a page
        written before Unicode slugs, whose name mixes Latin and other scripts)."""
        legacy = names.legacy_page_file(page)
        if legacy is None:
            return file
        with keys.guard():
            stored = await self.redis.hmget(
                keys.pages(project_id),
                [self.vault.field(project_id, file), self.vault.field(project_id, legacy)],
            )
        return legacy if stored[0] is None and stored[1] is not None else file

    async def write(
        self,
        project_id: str,
        page: str,
        content: str,
        description: str | None,
        updated_at: float | None = None,
    ) -> tuple[Page, bool]:
        """Create or replace a page; returns it and whether it is new. ``description`` None
        keeps the page's (empty for a new page).

        Raises:
            InvalidRequest: a bad name or description, or content over 256 KiB.
            NotFound: the project does not exist (or was deleted meanwhile).
            Locked: the memory is locked.
        """
        file = names.page_file(page)
        size = len(content.encode())
        if size > CONTENT_MAX:
            raise InvalidRequest(
                f"page content is {size} bytes: resend at most {CONTENT_MAX} (split the page)"
            )
        new_description = None if description is None else names.description(description)
        memory = await self.vault.require_open()
        file = await self._stored_file(project_id, page, file)
        field = self.vault.field(project_id, file)
        with keys.guard():
            old = await self.redis.hget(keys.pages(project_id), field)
        if new_description is None:
            new_description = self._open(project_id, field, old).description if old else ""
        stored = Page(
            file=file,
            title=index.title_of(content, file),
            description=new_description,
            content=content,
            updated_at=time.time() if updated_at is None else updated_at,
        )
        blob = self.vault.seal_private(
            keys.aad_page(project_id, field), stored.model_dump(), memory
        )
        with keys.guard():
            done = await self._hset(
                keys=[keys.META, keys.pages(project_id)], args=[project_id, field, blob, 0]
            )
        if done == -1:
            raise NotFound(f"no project {project_id!r}")
        return stored, old is None

    async def delete(self, project_id: str, page: str) -> str:
        """Delete a page; returns its file.

        Raises:
            NotFound: no such page.
            InvalidRequest: ``page`` gives no file (or names the index).
            Locked: the memory is locked.
        """
        file = names.page_file(page)
        await self.vault.require_open()
        file = await self._stored_file(project_id, page, file)
        with keys.guard():
            gone = await self.redis.hdel(keys.pages(project_id), self.vault.field(project_id, file))
        if not gone:
            raise NotFound(f"no page {file} in project {project_id!r}")
        return file
