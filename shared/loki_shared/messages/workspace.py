"""The workspace service's messages: a project's workspace (a git repository) and the file
operations and commands run in it (issue 43, Code mode).

One workspace per project (``project``: the project id, :data:`PROJECT_ID`); the service
keeps it under ``LOKI_WORKSPACE_ROOT/<project>``. Every ``path`` is relative to the
workspace's root, in POSIX form; an absolute path, a ``..`` that leaves the root, or a
symlink resolving outside it is refused (``forbidden``) before anything is touched. Every
command runs in the sandbox (:mod:`loki_workspace.sandbox`): only the workspace writable, no
network but loopback, limits on time, memory, processes and output, a clean environment.

Errors are the replies' ``error`` (:class:`~loki_shared.messages.base.ErrorInfo`):
``invalid_request`` (say what to resend), ``forbidden`` (a path outside the workspace),
``not_found`` (no workspace, no file), ``conflict`` (an ``edit`` whose text is ambiguous or
absent), ``unavailable`` (the sandbox cannot start here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .base import Msg, Reply

#: A project id as the memory service writes it (also the workspace's directory name).
PROJECT_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
#: A workspace-relative path as sent (checked again against the file system).
MAX_PATH = 1024


class _Strict(Msg):
    """A request part the model or a person writes: an unknown field is refused."""

    model_config = ConfigDict(extra="forbid")


class WorkspaceInfo(Msg):
    """What a workspace is: ``project``, ``exists``, ``branch`` and ``head`` (the current
    commit's id, "" before the first commit), ``dirty`` (uncommitted changes),
    ``origin`` (the local path it was cloned from, "" when created empty), ``agents_md``
    (the text of ``AGENTS.md`` at its root, None when it has none; cut at
    ``LOKI_WORKSPACE_AGENTS_MAX`` characters), ``sandbox`` (the sandbox in use, e.g.
    ``bubblewrap 0.8.0``; "" when none works here)."""

    project: str
    exists: bool = False
    branch: str = ""
    head: str = ""
    dirty: bool = False
    origin: str = ""
    agents_md: str | None = None
    sandbox: str = ""


class CreateRequest(_Strict):
    """``loki.workspace.create``: make ``project``'s workspace: an empty git repository, or
    a clone of ``clone_from`` (an absolute local path to a git repository the person names;
    never a URL, never a path inside ``LOKI_HOME``). An existing workspace is ``conflict``."""

    project: str = Field(pattern=PROJECT_ID)
    clone_from: str | None = Field(default=None, max_length=4096)


class InfoRequest(_Strict):
    """``loki.workspace.info``: the :class:`WorkspaceInfo` of ``project`` (``exists`` false
    when it has none: not an error)."""

    project: str = Field(pattern=PROJECT_ID)


class WorkspaceReply(Reply):
    """``info``: the workspace (create, info)."""

    info: WorkspaceInfo | None = None


class FileEntry(Msg):
    """One entry: ``path`` (workspace-relative), ``kind``, ``size`` (bytes; 0 for a dir)."""

    path: str
    kind: Literal["file", "dir", "symlink"]
    size: int = 0


class GrepMatch(Msg):
    """One matching line: ``path``, ``line`` (1-based), ``text`` (the line, cut at 500
    characters)."""

    path: str
    line: int
    text: str


class FilesRequest(_Strict):
    """``loki.workspace.files``: ``list`` (the entries under ``path``, ``depth`` levels;
    ``.git`` never listed), ``glob`` (the files matching ``pattern``, e.g. ``src/**/*.py``),
    ``grep`` (the lines matching the regular expression ``pattern`` in the files under
    ``path``, optionally only those matching ``include``, a glob). At most ``max_results``
    entries or matches; ``truncated`` says more exist."""

    project: str = Field(pattern=PROJECT_ID)
    op: Literal["list", "glob", "grep"]
    path: str = Field(default=".", max_length=MAX_PATH)
    pattern: str | None = Field(default=None, max_length=1000)
    include: str | None = Field(default=None, max_length=1000)
    depth: int = Field(default=3, ge=1, le=20)
    max_results: int = Field(default=500, ge=1, le=5000)


class FilesReply(Reply):
    """``entries`` (list, glob), ``matches`` (grep), ``truncated``."""

    entries: list[FileEntry] = Field(default_factory=list)
    matches: list[GrepMatch] = Field(default_factory=list)
    truncated: bool = False


class ReadRequest(_Strict):
    """``loki.workspace.read``: the text of ``path`` from line ``offset`` (1-based), at most
    ``limit`` lines (None: to the end, within the service's byte cap)."""

    project: str = Field(pattern=PROJECT_ID)
    path: str = Field(max_length=MAX_PATH)
    offset: int = Field(default=1, ge=1)
    limit: int | None = Field(default=None, ge=1)


class ReadReply(Reply):
    """``text`` (the lines asked for), ``first_line``/``last_line`` (1-based, inclusive; 0
    when empty), ``total_lines``, ``size`` (bytes), ``truncated`` (the byte cap cut it), and
    for a file that is not UTF-8 text: ``binary`` true, ``text`` empty, ``mime`` (what it
    looks like: ``image/png``...), so the caller can point at ``see_image`` or ``preview``."""

    path: str = ""
    text: str = ""
    first_line: int = 0
    last_line: int = 0
    total_lines: int = 0
    size: int = 0
    truncated: bool = False
    binary: bool = False
    mime: str = ""


class WriteRequest(_Strict):
    """``loki.workspace.write``: ``write`` (``content`` replaces the file, parents made) or
    ``edit`` (``old`` replaced by ``new``: exactly one occurrence, or every one with
    ``replace_all``; none or several without it is ``conflict``, nothing written)."""

    project: str = Field(pattern=PROJECT_ID)
    op: Literal["write", "edit"]
    path: str = Field(max_length=MAX_PATH)
    content: str | None = None
    old: str | None = None
    new: str | None = None
    replace_all: bool = False


class WriteReply(Reply):
    """``path``, ``created`` (it did not exist), ``size`` (bytes now), ``replacements``
    (edit: how many)."""

    path: str = ""
    created: bool = False
    size: int = 0
    replacements: int = 0


class RunRequest(_Strict):
    """``loki.workspace.run``: run ``command`` (a ``sh -c`` line) in the sandbox, in the
    workspace's root (``cwd``: a workspace-relative directory), stopped after ``timeout_s``
    (capped by ``LOKI_WORKSPACE_RUN_MAX_S``)."""

    project: str = Field(pattern=PROJECT_ID)
    command: str = Field(min_length=1, max_length=20_000)
    cwd: str = Field(default=".", max_length=MAX_PATH)
    timeout_s: float = Field(default=60.0, gt=0)


class RunReply(Reply):
    """A command's end: ``exit_code`` (None when it was killed), ``output`` (stdout and
    stderr interleaved as written, at most ``LOKI_WORKSPACE_OUTPUT_MAX`` bytes kept: the
    head and the tail), ``output_bytes`` (how many it wrote in all), ``truncated``,
    ``killed`` (why the sandbox stopped it: ``timeout``, ``output`` (past the output
    limit), ``memory``, ``processes``; "" when it exited by itself), ``duration_s``."""

    exit_code: int | None = None
    output: str = ""
    output_bytes: int = 0
    truncated: bool = False
    killed: Literal["", "timeout", "output", "memory", "processes"] = ""
    duration_s: float = 0.0


class GitRequest(_Strict):
    """``loki.workspace.git``: ``status``, ``diff`` (``paths`` to narrow; ``staged``),
    ``commit`` (every change, or ``paths``, with ``message``; the author is Loki), ``log``
    (the last ``limit`` commits). Run in the sandbox like any command; the reply is a
    :class:`RunReply`."""

    project: str = Field(pattern=PROJECT_ID)
    op: Literal["status", "diff", "commit", "log"]
    message: str | None = Field(default=None, max_length=10_000)
    paths: list[str] = Field(default_factory=list, max_length=200)
    staged: bool = False
    limit: int = Field(default=10, ge=1, le=200)


class PreviewRequest(_Strict):
    """``loki.workspace.preview``: render the HTML file ``path`` of the workspace with
    headless chromium inside the sandbox (no network), ``width`` x ``height`` CSS pixels."""

    project: str = Field(pattern=PROJECT_ID)
    path: str = Field(max_length=MAX_PATH)
    width: int = Field(default=1280, ge=200, le=2560)
    height: int = Field(default=800, ge=200, le=2560)


class PreviewReply(Reply):
    """``png`` (the screenshot, base64; "" when no browser could render it), ``title``
    (the page's title) and ``text`` (its visible text, cut at 4,000 characters: what a
    model without vision is told), ``note`` (why the page is the file's own text, not what
    a browser rendered: none here, or it gave nothing within its time — a script that
    never ends; "" when rendered)."""

    png: str = ""
    title: str = ""
    text: str = ""
    note: str = ""
