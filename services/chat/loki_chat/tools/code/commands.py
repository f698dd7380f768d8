"""The code tools that run commands in the sandbox: ``run`` and ``git``.

Rules (docs/behaviour.md (chat, code mode)): a result shows the exit code (or why the
sandbox stopped the command: ``timeout``, ``output``, ``memory``, ``processes``), the
duration and the output; an output longer than the model may see keeps its head and its
tail (the middle is said to be cut, with how much), so an error at the end of a long build
log is never lost; the ``tool_result`` display event carries the same as fields (``run``:
command, exit code, killed, output, truncated, output bytes, duration; git's ``op``) for the
UI. A failure to run (service unreachable, sandbox unavailable) is a result
that says why.
"""

from __future__ import annotations

from typing import Any

from loki_shared import subjects
from loki_shared.messages.workspace import GitRequest, RunReply

from ..box import ToolReturn, ToolSpec
from .target import CodeTarget, failure_text, missing, number_arg, text_arg

#: Characters of a result kept for its status line and notes (the rest is output).
_ROOM = 600
_GIT_OPS = ("status", "diff", "commit", "log")
#: The longest time limit a ``run`` asks for, seconds (the workspace service caps it lower
#: with ``LOKI_WORKSPACE_RUN_MAX_S``, 600 by default): a larger one, or an infinite one, is
#: this — so a reply lost when the service restarts mid-command is waited for a bounded time.
RUN_MAX_S = 3600.0
#: Seconds a ``git`` request may take (the service runs each of its git commands for at most
#: 120 s in the sandbox; a commit is two).
GIT_TIMEOUT_S = 260.0


def head_tail(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its head and its tail, the middle replaced by
    a note saying how many characters were left out."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 80)
    head, tail = keep // 3, keep - keep // 3
    cut = len(text) - head - tail
    return f"{text[:head]}\n[… {cut} characters cut here …]\n{text[len(text) - tail :]}"


def run_result(reply: RunReply, limit: int) -> str:
    """A command's result: its status line, then its output (head and tail kept)."""
    if reply.killed:
        status = f"killed: {reply.killed}"
        if reply.killed == "timeout":
            status += " (past its time limit: give a larger timeout_s, or a shorter task)"
        elif reply.killed == "output":
            status += " (past the output limit: filter the output, e.g. | tail -n 50)"
    else:
        status = f"exit code: {reply.exit_code}"
    status += f" | duration: {reply.duration_s:.1f} s | output: {reply.output_bytes} bytes"
    if reply.truncated:
        status += " (the sandbox kept its head and tail)"
    output = head_tail(reply.output, max(200, limit - _ROOM))
    return f"{status}\n{output}" if output else f"{status}\n(no output)"


def run_timeout(args: dict[str, Any], default: float) -> tuple[float, str]:
    """(the seconds a ``run`` gets, a note for the result: "" when ``timeout_s`` was used as
    sent). ``timeout_s`` may be a number or a string holding one; absent, 0, negative or
    unreadable gives ``default`` (said in the note); above :data:`RUN_MAX_S` (or infinite)
    gives :data:`RUN_MAX_S`."""
    raw = args.get("timeout_s")
    value = number_arg(args, "timeout_s")
    if raw is None:
        return default, ""
    if value is None and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = RUN_MAX_S if raw > 0 else None  # an infinite limit: the longest
    if value is None or value <= 0:
        return default, (
            f"(timeout_s {raw!r} is not a positive number of seconds: the default "
            f"{default:g} s was used)\n"
        )
    return min(value, RUN_MAX_S), ""


def run_display(reply: RunReply, command: str, limit: int, op: str | None = None) -> dict[str, Any]:
    """The ``tool_result`` display event's ``run`` field (the UI shows it without parsing
    the text): the command (and git's ``op``), its end and its output as the model got it."""
    shown: dict[str, Any] = {
        "command": command,
        "exit_code": reply.exit_code,
        "killed": reply.killed,
        "output": head_tail(reply.output, max(200, limit - _ROOM)),
        "truncated": reply.truncated or len(reply.output) > max(200, limit - _ROOM),
        "output_bytes": reply.output_bytes,
        "duration_s": reply.duration_s,
    }
    if op is not None:
        shown["op"] = op
    return {"run": shown}


def command_tools(target: CodeTarget) -> list[ToolSpec]:
    """``run`` and ``git`` over ``target``."""
    ws = target.workspace

    async def run(args: dict[str, Any]) -> str | ToolReturn:
        command = text_arg(args, "command")
        if not command or not command.strip():
            return missing("run", "command", "a shell command line")
        timeout, note = run_timeout(args, target.run_timeout_s)
        try:
            reply = await ws.run(target.project(), command, timeout)
        except Exception as exc:  # noqa: BLE001 - said to the model
            return note + failure_text("run", exc)
        return ToolReturn(
            text=note + run_result(reply, target.result_max),
            display=run_display(reply, command, target.result_max),
        )

    async def git(args: dict[str, Any]) -> str | ToolReturn:
        op = text_arg(args, "op")
        if op not in _GIT_OPS:
            return missing("git", "op", "one of " + ", ".join(_GIT_OPS))
        message = text_arg(args, "message")
        if op == "commit" and not (message and message.strip()):
            return missing("git", "message", "the commit message")
        paths = args.get("paths")
        if isinstance(paths, str):  # one path sent as itself
            paths = [paths] if paths.strip() else []
        elif isinstance(paths, list) and all(isinstance(p, str) for p in paths):
            pass
        elif paths is None:
            paths = []
        else:  # never "every change" for paths it cannot read
            return missing("git", "paths", 'a list of workspace paths, e.g. ["src/a.py"]')
        try:
            reply = await ws.call(
                subjects.WORKSPACE_GIT,
                GitRequest(project=target.project(), op=op, message=message, paths=paths),  # type: ignore[arg-type]
                RunReply,
                GIT_TIMEOUT_S,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            return failure_text("git", exc)
        return ToolReturn(
            text=run_result(reply, target.result_max),
            display=run_display(reply, f"git {op}", target.result_max, op),
        )

    return [
        ToolSpec(
            name="run",
            description=(
                "Run a shell command in the workspace's sandbox (no network, limits on time, "
                "memory and output): build, tests, scripts. Shows the exit code and output."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "a sh -c command line"},
                    "timeout_s": {
                        "type": "number",
                        "description": f"time limit in seconds (default {target.run_timeout_s:g})",
                    },
                },
                "required": ["command"],
            },
            run=run,
        ),
        ToolSpec(
            name="git",
            description=(
                "Git in the workspace: status, diff (of `paths`), commit (every change, or "
                "`paths`, with `message`), log."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "op": {"type": "string", "enum": list(_GIT_OPS)},
                    "message": {"type": "string", "description": "the commit message"},
                    "paths": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["op"],
            },
            run=git,
        ),
    ]
