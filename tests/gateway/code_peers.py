"""Scripted responders of ``loki.chat.code`` and ``loki.workspace.create/info/files/read``
for the gateway's code-mode tests, on the fake peers' NATS connection and event loop
(:class:`tests.fakes.gateway_peers.FakePeers`), so they follow its conversations.

- ``loki.chat.code``: a :class:`CodeState` per conversation (in code mode only, ``project``
  from :attr:`CodePeers.projects`, else :attr:`CodePeers.default_project`); ``mode`` switches and
  appends the display event ``mode_changed`` to the conversation's log, as the chat service
  says it does; ``criteria`` replaces them (``c1``, ``c2``... all pending) and emits the
  display event ``criteria``; ``check`` marks each one ``met`` when its command is in
  :attr:`CodePeers.passing`, else ``failed``; a conversation in :attr:`CodePeers.busy` refuses
  a mode switch (``busy``, a turn runs).
- ``loki.workspace.*``: workspaces are real directories under ``root`` (one per project; a
  clone copies the directory named). ``files`` lists everything, ``.git`` included (as a
  careless service would: the gateway must hide it); ``read`` refuses a path leaving the
  workspace (``forbidden``), answers a file that is not UTF-8 as ``binary`` with its type,
  and cuts a text at :attr:`CodePeers.read_cap` bytes (``truncated``).

Every request is kept in :attr:`CodePeers.seen` (subject, request) for the tests to check.
With ``serve_workspace`` false only ``loki.chat.code`` is answered here (the real workspace
service answers the rest).
"""

from __future__ import annotations

import mimetypes
import shutil
import time
from pathlib import Path
from typing import Any

from loki_shared import subjects
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.code import CodeReply, CodeRequest, CodeState, Criterion
from loki_shared.messages.workspace import (
    CreateRequest,
    FileEntry,
    FilesReply,
    FilesRequest,
    InfoRequest,
    ReadReply,
    ReadRequest,
    WorkspaceInfo,
    WorkspaceReply,
)
from tests.fakes.fake_supervisor import responder
from tests.fakes.gateway_peers import FakePeers


def _error(kind: str, message: str) -> ErrorInfo:
    return ErrorInfo(type=kind, message=message)  # type: ignore[arg-type]


class CodePeers:
    """The scripted code-mode peers (see the module docstring)."""

    def __init__(self, peers: FakePeers, root: Path, serve_workspace: bool = True) -> None:
        self.peers = peers
        self.root = root
        self.serve_workspace = serve_workspace  # False: the real workspace service answers
        self.states: dict[str, CodeState] = {}
        self.projects: dict[str, str | None] = {}  # conversation -> its project
        self.default_project: str | None = "demo"
        self.passing: set[str] = set()  # criterion commands that pass a check
        self.busy: set[str] = set()  # conversations whose turn runs
        self.read_cap = 1_000_000
        self.seen: list[tuple[str, Any]] = []
        self.subs: list[Any] = []

    # -- life ---------------------------------------------------------------------------
    def start(self) -> CodePeers:
        self.peers.call(self._subscribe())
        return self

    def stop(self) -> None:
        async def unsubscribe() -> None:
            for sub in self.subs:
                await sub.unsubscribe()

        self.peers.call(unsubscribe())

    async def _subscribe(self) -> None:
        table = {
            subjects.CHAT_CODE: (CodeRequest, self._code),
            subjects.WORKSPACE_CREATE: (CreateRequest, self._create),
            subjects.WORKSPACE_INFO: (InfoRequest, self._info),
            subjects.WORKSPACE_FILES: (FilesRequest, self._files),
            subjects.WORKSPACE_READ: (ReadRequest, self._read),
        }
        if not self.serve_workspace:
            table = {subjects.CHAT_CODE: table[subjects.CHAT_CODE]}
        for subject, (model, handler) in table.items():

            def keep(req: Any, subject: str = subject, handler: Any = handler) -> Any:
                self.seen.append((subject, req))
                return handler(req)

            self.subs.append(await self.peers.nc.subscribe(subject, cb=responder(model, keep)))
        await self.peers.nc.flush()

    # -- loki.chat.code -------------------------------------------------------------------
    def state(self, conversation: str) -> CodeState:
        """The conversation's state (made on first use: chat mode, no project)."""
        return self.states.setdefault(conversation, CodeState())

    def project_of(self, conversation: str) -> str | None:
        """The project whose workspace the conversation works in once in code mode."""
        return self.projects.get(conversation, self.default_project)

    def code_mode(self, conversation: str, project: str | None = None) -> CodeState:
        """Put the conversation in code mode at once (no event), in ``project``."""
        st = self.state(conversation)
        if project is not None:
            self.projects[conversation] = project
        st.mode, st.project = "code", self.project_of(conversation)
        return st

    async def _code(self, req: CodeRequest) -> CodeReply:
        cid = req.conversation
        if cid not in self.peers.convs:
            return CodeReply(error=_error("not_found", f"no conversation {cid!r}"))
        st = self.state(cid)
        if req.action == "mode" and req.mode and req.mode != st.mode:
            if cid in self.busy:
                return CodeReply(error=_error("busy", "a turn is running: switch when it ends"))
            # as the chat service: the project is the conversation's own, in code mode only
            st.mode, st.project = req.mode, self.project_of(cid) if req.mode == "code" else None
            meta = {"event": "mode_changed", "mode": req.mode}
            if st.project:
                meta["project"] = st.project
            await self.peers.emit(cid, {}, loki=meta)
        elif req.action == "criteria":
            st.criteria = [
                Criterion(id=f"c{i}", text=spec.text, command=spec.command)
                for i, spec in enumerate(req.criteria or [], 1)
            ]
            await self.emit_criteria(cid)
        elif req.action == "check":
            for c in st.criteria:
                ok = c.command in self.passing
                c.state = "met" if ok else "failed"
                c.detail = f"$ {c.command}\nexit code {0 if ok else 1}" if c.command else "judged"
                c.checked = time.time()
            await self.emit_criteria(cid)
        return CodeReply(state=st)

    async def emit_criteria(self, cid: str) -> None:
        """The display event ``criteria`` with the conversation's criteria now."""
        criteria = [c.model_dump(mode="json") for c in self.state(cid).criteria]
        await self.peers.emit(cid, {}, loki={"event": "criteria", "criteria": criteria})

    # -- loki.workspace.* -------------------------------------------------------------------
    def workspace(self, project: str) -> Path:
        return self.root / project

    def _info_of(self, project: str) -> WorkspaceInfo:
        ws = self.workspace(project)
        if not ws.is_dir():
            return WorkspaceInfo(project=project)
        origin = (ws / ".git" / "origin").read_text() if (ws / ".git" / "origin").exists() else ""
        return WorkspaceInfo(
            project=project, exists=True, branch="main", origin=origin, sandbox="fake"
        )

    def _create(self, req: CreateRequest) -> WorkspaceReply:
        ws = self.workspace(req.project)
        if ws.exists():
            return WorkspaceReply(error=_error("conflict", f"{req.project} has a workspace"))
        if req.clone_from:
            source = Path(req.clone_from)
            if not source.is_dir():
                return WorkspaceReply(
                    error=_error("invalid_request", f"{req.clone_from} is not a directory")
                )
            shutil.copytree(source, ws, symlinks=True)
        else:
            ws.mkdir(parents=True)
        (ws / ".git").mkdir(exist_ok=True)
        (ws / ".git" / "origin").write_text(req.clone_from or "")
        return WorkspaceReply(info=self._info_of(req.project))

    def _info(self, req: InfoRequest) -> WorkspaceReply:
        return WorkspaceReply(info=self._info_of(req.project))

    def _inside(self, project: str, path: str) -> Path | ErrorInfo:
        ws = self.workspace(project)
        if not ws.is_dir():
            return _error("not_found", f"{project} has no workspace")
        target = (ws / path).resolve()
        if path.startswith("/") or not target.is_relative_to(ws.resolve()):
            return _error("forbidden", f"{path} is outside the workspace")
        return target

    def _files(self, req: FilesRequest) -> FilesReply:
        base = self._inside(req.project, req.path)
        if isinstance(base, ErrorInfo):
            return FilesReply(error=base)
        if not base.is_dir():
            return FilesReply(error=_error("not_found", f"no directory {req.path}"))
        ws = self.workspace(req.project).resolve()
        entries = []
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(base)
            if len(rel.parts) > req.depth:
                continue
            kind = "symlink" if p.is_symlink() else "dir" if p.is_dir() else "file"
            size = p.lstat().st_size if kind == "file" else 0
            entries.append(FileEntry(path=p.relative_to(ws).as_posix(), kind=kind, size=size))
        truncated = len(entries) > req.max_results
        return FilesReply(entries=entries[: req.max_results], truncated=truncated)

    def _read(self, req: ReadRequest) -> ReadReply:
        target = self._inside(req.project, req.path)
        if isinstance(target, ErrorInfo):
            return ReadReply(error=target)
        if not target.is_file():
            return ReadReply(error=_error("not_found", f"no file {req.path}"))
        data = target.read_bytes()
        try:
            text = data.decode("utf-8")
            if "\x00" in text:
                raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL")
        except UnicodeDecodeError:
            mime = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
            return ReadReply(path=req.path, size=len(data), binary=True, mime=mime)
        truncated = len(data) > self.read_cap
        if truncated:
            text = data[: self.read_cap].decode("utf-8", "ignore")
        lines = text.splitlines(keepends=True)
        total = len(data.decode("utf-8").splitlines())
        first = req.offset
        chosen = lines[first - 1 : (first - 1 + req.limit) if req.limit else None]
        return ReadReply(
            path=req.path,
            text="".join(chosen),
            first_line=first if chosen else 0,
            last_line=first + len(chosen) - 1 if chosen else 0,
            total_lines=total,
            size=len(data),
            truncated=truncated,
            mime="text/plain",
        )
