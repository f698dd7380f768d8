"""Projects in Redis: create, read, rename, describe, delete, and the active one.

The project :data:`DEFAULT_PROJECT` (named :data:`DEFAULT_NAME`) always exists
(:meth:`Projects.ensure_default` at start, and again whenever it is looked for) and cannot be
deleted. A project's name is readable while the memory is locked; its description and
instructions are private records (see :mod:`loki_memory.vault`).
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from loki_shared.errors import Conflict, InvalidRequest, Locked, NotFound
from loki_shared.messages.projects import DEFAULT_PROJECT, Project
from loki_shared.sealing import SealError

from . import keys, names
from .vault import Vault

DEFAULT_NAME = "Default"
#: Longest description (characters) and instructions file (UTF-8 bytes) of a project.
DESCRIPTION_MAX = 4000
INSTRUCTIONS_MAX = 64 * 1024


class Projects:
    """The projects of one Redis.

    Args:
        redis: an asyncio Redis client (bytes responses).
        vault: the service's sealing.
    """

    def __init__(self, redis: Redis, vault: Vault) -> None:
        self.redis = redis
        self.vault = vault

    # --- reading -----------------------------------------------------------------------------
    async def ensure_default(self) -> None:
        """Create the default project when it is missing.

        Raises:
            Unavailable: Redis does not answer.
        """
        meta = {"id": DEFAULT_PROJECT, "name": DEFAULT_NAME, "created_at": time.time()}
        with keys.guard():
            if await self.redis.hsetnx(
                keys.META, DEFAULT_PROJECT, self.vault.seal(keys.aad_meta(DEFAULT_PROJECT), meta)
            ):
                await self.redis.hsetnx(keys.TOUCHED, DEFAULT_PROJECT, meta["created_at"])

    async def require(self, project_id: str) -> None:
        """Check that ``project_id`` exists.

        Raises:
            NotFound: it does not.
        """
        with keys.guard():
            if await self.redis.hexists(keys.META, project_id):
                return
        if project_id == DEFAULT_PROJECT:
            await self.ensure_default()
            return
        raise NotFound(f"no project {project_id!r}")

    async def get(self, project_id: str, locked: bool | None = None) -> Project:
        """The project ``project_id`` (``locked``: whether the memory is locked, asked when
        None); while locked its description and instructions read as empty.

        Raises:
            NotFound: no such project.
        """
        for attempt in range(2):
            with keys.guard():
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hget(keys.META, project_id)
                    pipe.hget(keys.BODY, project_id)
                    pipe.hget(keys.TOUCHED, project_id)
                    meta_blob, body_blob, touched = await pipe.execute()
            if meta_blob is not None or project_id != DEFAULT_PROJECT or attempt:
                break
            await self.ensure_default()
        return await self._project(project_id, meta_blob, body_blob, touched, locked)

    async def _project(
        self,
        project_id: str,
        meta_blob: bytes | None,
        body_blob: bytes | None,
        touched: bytes | None,
        locked: bool | None,
    ) -> Project:
        if meta_blob is None:
            raise NotFound(f"no project {project_id!r}")
        meta = self.vault.open(keys.aad_meta(project_id), meta_blob)
        if locked is None:
            locked = await self.vault.locked()
        body: dict[str, Any] = {}
        if not locked and body_blob is not None:
            try:
                body = self.vault.open_private(keys.aad_body(project_id), body_blob)
            except Locked:
                locked = True
        return Project(
            id=project_id,
            name=meta["name"],
            description=body.get("description", ""),
            instructions=body.get("instructions", ""),
            created_at=meta["created_at"],
            updated_at=float(touched) if touched is not None else meta["created_at"],
            locked=locked,
        )

    async def body(self, project_id: str) -> dict[str, str]:
        """The description and instructions of ``project_id`` (empty strings when none).

        Raises:
            Locked: the memory is locked.
        """
        await self.vault.require_open()
        with keys.guard():
            blob = await self.redis.hget(keys.BODY, project_id)
        if blob is None:
            return {"description": "", "instructions": ""}
        record = self.vault.open_private(keys.aad_body(project_id), blob)
        return {"description": record["description"], "instructions": record["instructions"]}

    async def all(self) -> list[Project]:
        """Every project, the default one first, then by name (case-insensitive)."""
        await self.ensure_default()
        locked = await self.vault.locked()
        with keys.guard():
            metas = await self.redis.hgetall(keys.META)
            bodies = await self.redis.hgetall(keys.BODY)
            touched = await self.redis.hgetall(keys.TOUCHED)
        out = []
        for raw_id, blob in metas.items():
            pid = raw_id.decode()
            try:
                out.append(
                    await self._project(pid, blob, bodies.get(raw_id), touched.get(raw_id), locked)
                )
            except SealError:
                continue  # not ours (another key): never shown
        out.sort(key=lambda p: (p.id != DEFAULT_PROJECT, p.name.lower(), p.id))
        return out

    # --- writing -----------------------------------------------------------------------------
    async def create(
        self, name: str, description: str, instructions: str, project_id: str | None
    ) -> Project:
        """A new project; ``project_id`` None derives it from the name (``-2``, ``-3``... when
        taken).

        Raises:
            InvalidRequest: a bad name, id, description or instructions.
            Conflict: ``project_id`` is taken.
            Locked: a description or instructions given while the memory is locked.
        """
        name = names.name(name, "project name")
        body = _body(description, instructions)
        memory = await self.vault.require_open() if any(body.values()) else None
        now = time.time()
        if project_id is not None:
            if not names.is_slug(project_id):
                raise InvalidRequest(
                    f"project id {project_id!r} is not a slug: resend lower case letters, "
                    "digits, '-' or '_' (or no id)"
                )
            candidates = [project_id]
        else:
            base = names.project_id_base(name)
            candidates = [base] + [f"{base[: names.SLUG_MAX - 4]}-{n}" for n in range(2, 1000)]
        for pid in candidates:
            meta = self.vault.seal(keys.aad_meta(pid), {"id": pid, "name": name, "created_at": now})
            with keys.guard():
                if await self.redis.hsetnx(keys.META, pid, meta):
                    break
        else:
            raise Conflict(f"project id {candidates[-1]!r} is taken")
        with keys.guard():
            await self.redis.hset(keys.TOUCHED, pid, now)
            if any(body.values()):
                blob = self.vault.seal_private(keys.aad_body(pid), body, memory)
                await self.redis.hset(keys.BODY, pid, blob)
        return await self.get(pid)

    async def update(
        self,
        project_id: str,
        name: str | None,
        description: str | None,
        instructions: str | None,
    ) -> Project:
        """Change what is given (None: keep).

        Raises:
            NotFound: no such project.
            InvalidRequest: a bad name, description or instructions.
            Locked: a description or instructions given while the memory is locked.
        """
        current = await self.get(project_id)
        now = time.time()
        if name is not None:
            meta: dict[str, Any] = {
                "id": project_id,
                "name": names.name(name, "project name"),
                "created_at": current.created_at,
            }
            with keys.guard():
                await self.redis.hset(
                    keys.META, project_id, self.vault.seal(keys.aad_meta(project_id), meta)
                )
        if description is not None or instructions is not None:
            old = await self.body(project_id)
            body = _body(
                old["description"] if description is None else description,
                old["instructions"] if instructions is None else instructions,
            )
            memory = await self.vault.require_open()
            with keys.guard():
                await self.redis.hset(
                    keys.BODY,
                    project_id,
                    self.vault.seal_private(keys.aad_body(project_id), body, memory),
                )
        await self.touch(project_id, now)
        return await self.get(project_id)

    async def touch(self, project_id: str, ts: float | None = None) -> float:
        """Record a change of ``project_id`` at ``ts`` (default now); returns it."""
        ts = time.time() if ts is None else ts
        with keys.guard():
            await self.redis.hset(keys.TOUCHED, project_id, ts)
        return ts

    async def delete(self, project_id: str, confirm: str) -> tuple[int, int]:
        """Delete ``project_id`` with its pages and trackers; returns how many of each. The
        default project becomes active if it was.

        Raises:
            Conflict: the default project, or ``confirm`` is not ``project_id``.
            NotFound: no such project.
        """
        if project_id == DEFAULT_PROJECT:
            raise Conflict("the default project cannot be deleted")
        if confirm != project_id:
            raise Conflict(f"confirm must repeat the project id {project_id!r} to delete it")
        await self.require(project_id)
        active = await self.active()
        with keys.guard():
            fields = await self.redis.hkeys(keys.trackers(project_id))
            n_pages = await self.redis.hlen(keys.pages(project_id))
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.META, project_id)
                pipe.hdel(keys.BODY, project_id)
                pipe.hdel(keys.TOUCHED, project_id)
                pipe.delete(keys.pages(project_id), keys.trackers(project_id))
                for field in fields:
                    pipe.delete(keys.values(project_id, field.decode()))
                if active == project_id:
                    pipe.delete(keys.ACTIVE)
                await pipe.execute()
        return n_pages, len(fields)

    # --- the active project ------------------------------------------------------------------
    async def active(self) -> str:
        """The active project's id (the default one when none was activated, or when the
        activated one is gone)."""
        with keys.guard():
            blob = await self.redis.get(keys.ACTIVE)
        if blob is None:
            return DEFAULT_PROJECT
        try:
            pid = str(self.vault.open(keys.ACTIVE, blob))
        except SealError:
            return DEFAULT_PROJECT
        with keys.guard():
            exists = await self.redis.hexists(keys.META, pid)
        return pid if exists else DEFAULT_PROJECT

    async def activate(self, project_id: str) -> Project:
        """Make ``project_id`` the active project.

        Raises:
            NotFound: no such project.
        """
        await self.require(project_id)
        with keys.guard():
            await self.redis.set(keys.ACTIVE, self.vault.seal(keys.ACTIVE, project_id))
        return await self.get(project_id)


def _body(description: str, instructions: str) -> dict[str, str]:
    """A project's private body, checked.

    Raises:
        InvalidRequest: too long.
    """
    description = description.strip()
    if len(description) > DESCRIPTION_MAX:
        raise InvalidRequest(
            f"description is {len(description)} characters: resend at most {DESCRIPTION_MAX}"
        )
    if len(instructions.encode()) > INSTRUCTIONS_MAX:
        raise InvalidRequest(f"instructions are over {INSTRUCTIONS_MAX} bytes: resend less")
    return {"description": description, "instructions": instructions}
