"""Each project's workspace: where it lives, how it is made (an empty repository, or a clone
of a local repository the person names) and what it is (:class:`WorkspaceInfo`).

Storage: ``LOKI_WORKSPACE_ROOT/<project>/`` is the repository (its files belong to the
sandbox's user); Redis keeps, per project, ``loki:workspace:<project>`` (a hash: ``origin``,
the path it was cloned from, and ``created``, a Unix time) — nothing else is stored.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from loki_shared.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from loki_shared.messages.workspace import CreateRequest, ReadRequest, WorkspaceInfo

from . import git, paths
from .files import Caps, Files
from .sandbox import Limits, RunResult, Sandbox
from .settings import Settings

#: Redis key of a workspace's record (a hash).
KEY = "loki:workspace:{project}"
#: Where a clone's source appears in the sandbox (read-only).
SOURCE = "/source"


def check_clone_source(source: str, forbidden: list[Path]) -> Path:
    """The folder a clone is made from, checked: an absolute path of an existing folder
    (never a URL), outside every folder of ``forbidden`` (``LOKI_HOME``, the workspaces).

    Returns:
        Its real path (symlinks resolved).

    Raises:
        InvalidRequest: a URL, a relative path, or no such folder.
        Forbidden: inside one of ``forbidden``.
    """
    if "\0" in source:
        raise InvalidRequest(f"clone_from {source!r} holds a NUL character: resend it without")
    if "://" in source or source.startswith("git@") or not source.startswith("/"):
        raise InvalidRequest(
            f"clone_from {source!r}: give the absolute path of a git repository on this "
            "machine (URLs are not cloned: the sandbox has no network)"
        )
    real = Path(os.path.realpath(source))
    if not real.is_dir():
        raise InvalidRequest(f"clone_from {source!r}: no such folder on this machine")
    for folder in forbidden:
        if paths.is_inside(os.path.realpath(folder), str(real)):
            raise Forbidden(f"clone_from {source!r} is inside Loki's own data: refused")
    return real


class Workspaces:
    """The workspaces under :meth:`Settings.root`, their sandbox and their Redis records.

    Args:
        settings: the service's settings.
        sandbox: the sandbox commands run in.
        redis: the service's Redis client.
    """

    def __init__(self, settings: Settings, sandbox: Sandbox, redis: Redis) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.redis = redis
        self.root = settings.root()
        self.home = Path(os.path.realpath(settings.home))
        self.caps = Caps(settings.workspace_read_max, settings.workspace_write_max)

    def prepare(self) -> Path:
        """Make the workspaces' folder (mode 0700: only the service walks it; a sandbox gets
        its workspace by file descriptor) and a scratch folder for the sandbox's probe.
        Returns the scratch folder."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root = Path(os.path.realpath(self.root))
        scratch = self.root / ".probe"
        scratch.mkdir(exist_ok=True)
        self._own(scratch)
        self.reclaim()
        return scratch

    def reclaim(self) -> list[str]:
        """Give back to the sandbox's user every workspace whose folder it does not own (one
        restored from a backup, or copied in by root): their files, links not followed, are
        chowned to it. Only when the service runs as root; a workspace whose folder is the
        user's is not walked (a start stays quick). Returns the projects reclaimed."""
        owner = self.sandbox.owner()
        if owner is None:
            return []
        done = []
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(".") or folder.is_symlink() or not folder.is_dir():
                continue
            if folder.stat().st_uid == owner[0]:
                continue
            for base, dirs, files in os.walk(folder):
                for name in (*dirs, *files):
                    os.lchown(os.path.join(base, name), *owner)
            os.lchown(folder, *owner)
            done.append(folder.name)
        return done

    def _own(self, path: Path) -> None:
        owner = self.sandbox.owner()
        if owner is not None:
            os.chown(path, *owner)

    def limits(self, timeout_s: float, memory: bool = True) -> Limits:
        """The limits of a command stopped after ``timeout_s`` (capped by
        ``LOKI_WORKSPACE_RUN_MAX_S``); ``memory`` false: no address-space limit."""
        s = self.settings
        return Limits(
            timeout_s=min(timeout_s, s.workspace_run_max_s),
            output_max=s.workspace_output_max,
            output_kill=s.workspace_output_kill,
            memory=s.workspace_memory_max if memory else None,
            procs=s.workspace_procs_max,
            file_size=s.workspace_file_max,
        )

    def path(self, project: str) -> Path:
        """The folder of ``project``'s workspace (it may not exist)."""
        return self.root / project

    def require(self, project: str) -> Path:
        """The folder of ``project``'s workspace.

        Raises: NotFound: it has none."""
        folder = self.path(project)
        if not folder.is_dir() or folder.is_symlink():
            raise NotFound(
                f"project {project!r} has no workspace: create it first (loki.workspace.create)"
            )
        return folder

    def files(self, project: str) -> Files:
        """The file tools over ``project``'s workspace. Raises: NotFound."""
        return Files(self.require(project), self.caps, self.sandbox.owner())

    async def run(
        self, project: str, command: list[str], timeout_s: float, cwd: str = "."
    ) -> RunResult:
        """``command`` (an argv) run in the sandbox over ``project``'s workspace, in ``cwd``
        (workspace-relative, an existing folder), with git's identity set.

        Raises: NotFound, Forbidden, InvalidRequest (cwd), Unavailable (no sandbox)."""
        folder = self.require(project)
        rel, real = paths.resolve(folder, cwd)
        if not real.is_dir():
            raise InvalidRequest(f"cwd {cwd!r} is not a folder of the workspace")
        inside = "/".join(("/workspace", *rel))
        return await self.sandbox.run(
            command, folder, self.limits(timeout_s), cwd=inside, env=git.IDENTITY
        )

    # --- create, info ------------------------------------------------------------------------
    async def create(self, req: CreateRequest) -> WorkspaceInfo:
        """Make ``req.project``'s workspace: ``git init`` (branch ``main``) or ``git clone
        --no-hardlinks`` of ``req.clone_from`` (bound read-only in the sandbox).

        Raises:
            Conflict: it exists. InvalidRequest, Forbidden: see :func:`check_clone_source`;
            InvalidRequest also when git fails (its output said). Unavailable: no sandbox.
        """
        source = None
        if req.clone_from is not None:
            source = check_clone_source(req.clone_from, [self.home, self.root])
        folder = self.path(req.project)
        try:
            folder.mkdir(mode=0o755)
        except FileExistsError:
            raise Conflict(f"project {req.project!r} already has a workspace") from None
        try:
            self._own(folder)
            timeout = self.settings.workspace_run_max_s
            if source is None:
                cmd = git.trusted([*git.GIT, "init", "-q", "-b", "main"])
                done = await self.sandbox.run(cmd, folder, self.limits(timeout), env=git.IDENTITY)
            else:
                cmd = git.trusted([*git.GIT, "clone", "-q", "--no-hardlinks", "--", SOURCE, "."])
                done = await self.sandbox.run(
                    cmd, folder, self.limits(timeout), env=git.IDENTITY, extra=[(source, SOURCE)]
                )
                if done.exit_code == 0:  # the remote would name a path of the sandbox
                    unset = git.trusted([*git.GIT, "remote", "remove", "origin"])
                    await self.sandbox.run(unset, folder, self.limits(60.0), env=git.IDENTITY)
            if done.exit_code != 0:
                what = "git init" if source is None else f"git clone of {req.clone_from!r}"
                raise InvalidRequest(f"{what} failed: {done.output.strip()[-2000:]}")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        record = {"origin": str(source or ""), "created": str(int(time.time()))}
        try:
            await self.redis.hset(KEY.format(project=req.project), mapping=record)
        except RedisError as exc:
            raise Unavailable(f"Redis: {exc}") from exc
        return await self.info(req.project)

    async def info(self, project: str) -> WorkspaceInfo:
        """What ``project``'s workspace is (``exists`` false when it has none).

        Raises: Unavailable: Redis or the sandbox is not there."""
        folder = self.path(project)
        sandbox = self.sandbox.version
        if not folder.is_dir():
            return WorkspaceInfo(project=project, sandbox=sandbox)
        try:
            origin = await self.redis.hget(KEY.format(project=project), "origin")
        except RedisError as exc:
            raise Unavailable(f"Redis: {exc}") from exc
        branch = head = ""
        dirty = False
        if sandbox:
            done = await self.sandbox.run(git.info_script(), folder, self.limits(30.0))
            branch, head, dirty = git.parse_info(done.output)
        return WorkspaceInfo(
            project=project,
            exists=True,
            branch=branch,
            head=head,
            dirty=dirty,
            origin=origin.decode() if origin else "",
            agents_md=await asyncio.to_thread(self._agents, project),
            sandbox=sandbox,
        )

    def _agents(self, project: str) -> str | None:
        """The text of the workspace's ``AGENTS.md`` (cut at ``LOKI_WORKSPACE_AGENTS_MAX``
        characters), None when it has none or it is not text."""
        try:
            got = self.files(project).read(ReadRequest(project=project, path="AGENTS.md"))
        except (NotFound, InvalidRequest, Forbidden):
            return None
        if got.binary:
            return None
        return got.text[: self.settings.workspace_agents_max]
