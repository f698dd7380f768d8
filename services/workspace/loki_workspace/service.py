"""The workspace service: NATS handlers (FastStream) over :class:`~.workspaces.Workspaces`.

Subjects served (queue group ``workspace``): ``loki.workspace.create``, ``.info``, ``.files``,
``.read``, ``.write``, ``.run``, ``.git``, ``.preview`` (the contract:
:mod:`loki_shared.messages.workspace`), and its health subjects. It publishes nothing. At start
it checks that a sandbox starts here: when none does, every command is answered
``unavailable`` (the file tools still work) and the health answer says why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from faststream.nats import NatsBroker
from pydantic import BaseModel
from redis.exceptions import RedisError

from loki_shared import lifecycle, subjects
from loki_shared.errors import InvalidRequest
from loki_shared.messages.workspace import (
    CreateRequest,
    FilesReply,
    FilesRequest,
    GitRequest,
    InfoRequest,
    PreviewReply,
    PreviewRequest,
    ReadReply,
    ReadRequest,
    RunReply,
    RunRequest,
    WorkspaceReply,
    WriteReply,
    WriteRequest,
)
from loki_shared.nats import make_broker, stop_broker, until_routable
from loki_shared.redis_client import redis_client
from loki_shared.serve import serve

from . import git, paths, preview, search
from .sandbox import RunResult, Sandbox
from .settings import Settings
from .workspaces import Workspaces

log = logging.getLogger("loki.workspace")


def run_reply(result: RunResult) -> RunReply:
    """A sandbox run as the contract's :class:`RunReply`."""
    return RunReply(
        exit_code=result.exit_code,
        output=result.output,
        output_bytes=result.output_bytes,
        truncated=result.truncated,
        killed=result.killed,
        duration_s=result.duration_s,
    )


class WorkspaceService:
    """One workspace service instance. Use ``await start()`` then ``await stop()``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis_client(settings)
        self.sandbox = Sandbox(
            settings.workspace_bwrap, (settings.workspace_uid, settings.workspace_gid)
        )
        self.workspaces = Workspaces(settings, self.sandbox, self.redis)
        self.broker: NatsBroker = make_broker(
            settings.nats_url, "workspace", health_check=self._health, login=settings.nats_options()
        )
        self._register()

    # --- wiring ------------------------------------------------------------------------------
    def table(self) -> dict[str, Callable[[Any], Awaitable[BaseModel]]]:
        """Subject -> handler, every request subject of the service."""
        return {
            subjects.WORKSPACE_CREATE: self.on_create,
            subjects.WORKSPACE_INFO: self.on_info,
            subjects.WORKSPACE_FILES: self.on_files,
            subjects.WORKSPACE_READ: self.on_read,
            subjects.WORKSPACE_WRITE: self.on_write,
            subjects.WORKSPACE_RUN: self.on_run,
            subjects.WORKSPACE_GIT: self.on_git,
            subjects.WORKSPACE_PREVIEW: self.on_preview,
        }

    def _register(self) -> None:
        for subject, handler in self.table().items():
            serve(
                self.broker,
                subject,
                handler,
                queue=subjects.QUEUE_WORKSPACE,
                max_workers=self.settings.workspace_workers,
            )

    async def _health(self) -> dict[str, str]:
        detail: dict[str, str] = {}
        try:
            await self.redis.ping()
        except RedisError as exc:
            detail["redis"] = type(exc).__name__
        if not self.sandbox.version:
            detail["sandbox"] = self.sandbox.problem
        return detail

    # --- handlers ------------------------------------------------------------------------------
    async def on_create(self, req: CreateRequest) -> WorkspaceReply:
        return WorkspaceReply(info=await self.workspaces.create(req))

    async def on_info(self, req: InfoRequest) -> WorkspaceReply:
        return WorkspaceReply(info=await self.workspaces.info(req.project))

    async def on_files(self, req: FilesRequest) -> FilesReply:
        files = self.workspaces.files(req.project)
        if req.op != "list":  # a pattern may backtrack without end: in a child process
            return await search.grep(files, req, self.settings.workspace_grep_max_s)
        return await asyncio.to_thread(files.files, req)

    async def on_read(self, req: ReadRequest) -> ReadReply:
        files = self.workspaces.files(req.project)
        return await asyncio.to_thread(files.read, req)

    async def on_write(self, req: WriteRequest) -> WriteReply:
        files = self.workspaces.files(req.project)
        return await asyncio.to_thread(files.write, req)

    async def on_run(self, req: RunRequest) -> RunReply:
        command = ["sh", "-c", req.command]
        return run_reply(
            await self.workspaces.run(req.project, command, req.timeout_s, cwd=req.cwd)
        )

    async def on_git(self, req: GitRequest) -> RunReply:
        self.workspaces.require(req.project)
        outputs: list[str] = []
        result: RunResult | None = None
        for command in git.commands(req):
            result = await self.workspaces.run(req.project, git.trusted(command), 120.0)
            outputs.append(result.output)
            if result.exit_code != 0:
                break
        assert result is not None
        reply = run_reply(result)
        reply.output = "".join(outputs)
        return reply

    async def on_preview(self, req: PreviewRequest) -> PreviewReply:
        folder = self.workspaces.require(req.project)
        rel, real = paths.resolve(folder, req.path)
        if not real.is_file():
            raise InvalidRequest(f"{req.path!r} is not a file of the workspace: name an HTML file")
        browser = preview.find_browser(self.settings.workspace_browser)
        if browser is not None and self.sandbox.version:
            url = "file://" + quote("/".join(("/workspace", *rel)))
            command = preview.browser_command(browser, url, req.width, req.height)
            limits = preview.preview_limits(
                self.workspaces.limits(self.settings.workspace_preview_timeout_s)
            )
            done = await self.sandbox.run(command, folder, limits)
            dom, png = preview.parse_output(done.output)
            if dom.strip():
                title, text = preview.page_text(dom)
                return PreviewReply(png=png, title=title, text=text)
            log.warning("preview of %s: the browser gave nothing (%s)", req.path, done.killed)
            note = (
                f"the browser gave no page within {limits.timeout_s:g} s (a script that never "
                "ends?) or failed: this is the file's own text, before any script ran"
            )
        else:
            note = "no browser renders pages here: this is the file's own text"
        got = await asyncio.to_thread(
            self.workspaces.files(req.project).read, ReadRequest(project=req.project, path=req.path)
        )
        title, text = preview.page_text(got.text)
        return PreviewReply(title=title, text=text, note=note)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Make the workspaces' folder, check the sandbox (its absence is logged, not fatal),
        then serve."""
        scratch = self.workspaces.prepare()
        version = await self.sandbox.probe(scratch)
        if version:
            log.info("sandbox: %s", version)
        else:
            log.error("no sandbox: %s — commands will be refused", self.sandbox.problem)
        await self.broker.start()
        probe = InfoRequest(project="probe").model_dump_json().encode()
        await until_routable(self.broker.connection, subjects.WORKSPACE_INFO, probe, log)
        log.info("workspace service serving %s", self.workspaces.root)

    async def stop(self, steps: lifecycle.Steps | None = None) -> None:
        """Stop serving (requests running get the time left: a sandbox dies with the
        process, ``--die-with-parent``), then close Redis."""
        steps = steps or lifecycle.Steps(self.settings.stop_timeout_s, log)
        await stop_broker(self.broker, steps, steps.left() * 0.5)
        await steps.run("close Redis", self.redis.aclose, 1.0)
