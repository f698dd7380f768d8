"""The code tools on files: ``read``, ``write``, ``edit``, ``list``, ``glob``, ``grep``.

Rules (docs/behaviour.md (chat, code mode)):

- Every path is relative to the workspace's root; the workspace service refuses any other
  (``forbidden``) and the result says so and what to send.
- ``read`` shows numbered lines and says the range and the total (``offset`` 1-based,
  ``limit`` lines, :data:`READ_LINES` by default); a file that is not text is refused with a
  hint (``preview`` for an HTML page; an image of the workspace cannot be shown by
  ``see_image``, which shows the images attached to the conversation).
- ``edit`` replaces an exact string: one occurrence, or all with ``replace_all``; absent or
  ambiguous, nothing is written and the result says what to resend.
- Any failure (service unreachable, a path refused, a bad argument) is a result that says
  why and what to do, never a failed turn.
"""

from __future__ import annotations

from typing import Any

from loki_shared import subjects
from loki_shared.messages.workspace import (
    FileEntry,
    FilesReply,
    FilesRequest,
    ReadReply,
    ReadRequest,
    WriteReply,
    WriteRequest,
)

from ..box import ToolSpec
from .target import CodeTarget, bool_arg, failure_text, int_arg, missing, text_arg

#: Lines ``read`` returns when the model names no ``limit``.
READ_LINES = 1000

_PATH = {"type": "string", "description": "a path relative to the workspace's root"}


def numbered(reply: ReadReply) -> str:
    """``read``'s result: a header (path, range, total), then ``<n>\\t<line>`` lines."""
    if reply.total_lines == 0 or not reply.text:
        return f"{reply.path}: empty (0 lines, {reply.size} bytes)."
    header = f"{reply.path}: lines {reply.first_line}-{reply.last_line} of {reply.total_lines}"
    if reply.last_line < reply.total_lines:
        header += f" (read on with offset={reply.last_line + 1})"
    if reply.truncated and reply.first_line == reply.last_line:
        header += (
            f" (line {reply.first_line} is longer than the byte cap and was cut: see the rest "
            f"with run, e.g. `sed -n {reply.first_line}p FILE | fold -w 200 | sed -n 1,100p`)"
        )
    elif reply.truncated:
        header += " (cut at the byte cap: read on with offset)"
    lines = reply.text.split("\n")
    if lines and lines[-1] == "" and reply.text.endswith("\n"):
        lines.pop()
    body = "\n".join(f"{reply.first_line + i:>6}\t{line}" for i, line in enumerate(lines))
    return f"{header}\n{body}"


def entry_line(entry: FileEntry) -> str:
    """One entry of ``list``/``glob``: ``dir/``, ``file (N bytes)`` or ``link (link)``."""
    if entry.kind == "dir":
        return f"{entry.path}/"
    if entry.kind == "file":
        return f"{entry.path} ({entry.size} bytes)"
    return f"{entry.path} (link)"


def binary_hint(reply: ReadReply) -> str:
    """The refusal of a file that is not text, with what to use instead."""
    kind = reply.mime or "binary data"
    hint = "Use run (e.g. `file`, `xxd | head`) to inspect it."
    if kind.startswith("text/"):
        charset = kind.partition("charset=")[2] or "its encoding"
        hint = (
            f"It is text in another encoding than UTF-8 ({charset}): read it with run, e.g. "
            f"`iconv -f {charset} -t UTF-8 {reply.path} | cat -n | sed -n 1,200p`; edit "
            "changes UTF-8 text only (change it with run, e.g. sed, or convert it with iconv "
            "if the user agrees)."
        )
    elif kind.startswith("image/"):
        hint = (
            "An image of the workspace cannot be shown to you by see_image (it shows only the "
            "images attached to the conversation); preview renders an HTML page that shows it."
        )
    return f"Error: {reply.path} is not a text file ({kind}, {reply.size} bytes). {hint}"


def file_tools(target: CodeTarget) -> list[ToolSpec]:
    """``read``, ``write``, ``edit``, ``list``, ``glob``, ``grep`` over ``target``."""
    ws = target.workspace

    async def read(args: dict[str, Any]) -> str:
        path = text_arg(args, "path")
        if not path:
            return missing("read", "path", "the file, relative to the workspace's root")
        try:
            reply = await ws.call(
                subjects.WORKSPACE_READ,
                ReadRequest(
                    project=target.project(),
                    path=path,
                    offset=max(1, int_arg(args, "offset") or 1),
                    limit=max(1, int_arg(args, "limit") or READ_LINES),  # 0, -3: the default
                ),
                ReadReply,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            return failure_text("read", exc)
        return binary_hint(reply) if reply.binary else numbered(reply)

    async def write(args: dict[str, Any]) -> str:
        path, content = text_arg(args, "path"), text_arg(args, "content")
        if not path:
            return missing("write", "path", "the file to write")
        if content is None:
            return missing("write", "content", "the whole new text of the file")
        try:
            reply = await ws.call(
                subjects.WORKSPACE_WRITE,
                WriteRequest(project=target.project(), op="write", path=path, content=content),
                WriteReply,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            return failure_text("write", exc)
        made = "created" if reply.created else "replaced"
        return f"Wrote {reply.path or path} ({made}, {reply.size} bytes)."

    async def edit(args: dict[str, Any]) -> str:
        path = text_arg(args, "path")
        old, new = text_arg(args, "old_string"), text_arg(args, "new_string")
        if not path:
            return missing("edit", "path", "the file to change")
        if not old:
            return missing("edit", "old_string", "the exact text to replace, as in the file")
        if new is None:
            return missing("edit", "new_string", "the text that replaces it")
        try:
            reply = await ws.call(
                subjects.WORKSPACE_WRITE,
                WriteRequest(
                    project=target.project(),
                    op="edit",
                    path=path,
                    old=old,
                    new=new,
                    replace_all=bool_arg(args, "replace_all"),
                ),
                WriteReply,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            text = failure_text("edit", exc)
            if getattr(exc, "kind", "") == "conflict":
                text += (
                    " Nothing was written. If old_string is absent, read the file and copy "
                    "the text exactly (spaces, indentation); if it occurs several times, "
                    "resend it with more lines around it, or with replace_all true."
                )
            return text
        done = f"{reply.replacements} replacement(s), {reply.size} bytes now"
        return f"Edited {reply.path or path}: {done}."

    async def files(op: str, args: dict[str, Any]) -> str:
        try:
            reply = await ws.call(
                subjects.WORKSPACE_FILES,
                FilesRequest(
                    project=target.project(),
                    op=op,  # type: ignore[arg-type]
                    path=text_arg(args, "path") or ".",
                    pattern=text_arg(args, "pattern"),
                    include=text_arg(args, "include"),
                    depth=min(20, max(1, int_arg(args, "depth") or 3)),
                ),
                FilesReply,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            return failure_text(op, exc)
        more = "\n(more exist: narrow the call)" if reply.truncated else ""
        if op == "grep":
            if not reply.matches:
                return "No match."
            lines = [f"{m.path}:{m.line}: {m.text}" for m in reply.matches]
            return "\n".join(lines) + more
        if not reply.entries:
            return "Nothing found." if op == "glob" else "Empty."
        return "\n".join(entry_line(e) for e in reply.entries) + more

    async def list_(args: dict[str, Any]) -> str:
        return await files("list", args)

    async def glob(args: dict[str, Any]) -> str:
        if not text_arg(args, "pattern"):
            return missing("glob", "pattern", "a glob such as src/**/*.py")
        return await files("glob", args)

    async def grep(args: dict[str, Any]) -> str:
        if not text_arg(args, "pattern"):
            return missing("grep", "pattern", "a regular expression")
        return await files("grep", args)

    return [
        ToolSpec(
            name="read",
            description=(
                "Read a text file of the workspace: numbered lines, the range and the total. "
                f"`offset` is the first line (1-based), `limit` the lines (default {READ_LINES})."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": _PATH,
                    "offset": {"type": "integer", "description": "first line, 1-based"},
                    "limit": {"type": "integer", "description": "lines to read"},
                },
                "required": ["path"],
            },
            run=read,
        ),
        ToolSpec(
            name="write",
            description="Write a file of the workspace (its whole text; parents made).",
            parameters={
                "type": "object",
                "properties": {
                    "path": _PATH,
                    "content": {"type": "string", "description": "the file's whole text"},
                },
                "required": ["path", "content"],
            },
            run=write,
        ),
        ToolSpec(
            name="edit",
            description=(
                "Replace an exact string in a file of the workspace: `old_string` must occur "
                "exactly once (or set `replace_all`); read the file first."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": _PATH,
                    "old_string": {"type": "string", "description": "the exact text to replace"},
                    "new_string": {"type": "string", "description": "the text replacing it"},
                    "replace_all": {"type": "boolean", "description": "replace every occurrence"},
                },
                "required": ["path", "old_string", "new_string"],
            },
            run=edit,
        ),
        ToolSpec(
            name="list",
            description="List the files and directories under a path of the workspace.",
            parameters={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "a directory; '.' is the root"},
                    "depth": {"type": "integer", "description": "levels to list (default 3)"},
                },
                "required": ["path"],
            },
            run=list_,
        ),
        ToolSpec(
            name="glob",
            description="Find the files of the workspace matching a glob, e.g. src/**/*.py.",
            parameters={
                "type": "object",
                "properties": {"pattern": {"type": "string", "description": "the glob"}},
                "required": ["pattern"],
            },
            run=glob,
        ),
        ToolSpec(
            name="grep",
            description=(
                "Search the files of the workspace for a regular expression: matching lines "
                "with their path and line number."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "a regular expression"},
                    "path": {"type": "string", "description": "where to search (default '.')"},
                    "include": {"type": "string", "description": "only files matching this glob"},
                },
                "required": ["pattern"],
            },
            run=grep,
        ),
    ]
