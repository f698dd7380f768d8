"""``grep`` and ``glob`` bounded in time: the search runs in a child process of the service
that is killed past ``LOKI_WORKSPACE_GREP_MAX_S``.

Why a process: Python's regular expressions backtrack, and a pattern such as ``(a+)+$``
against a long line (or a glob of many ``*``, a regular expression too, against a long
name) takes longer than the universe lasts while holding the interpreter's
lock — in a thread it would stop every request of the service, and nothing can interrupt
it. A child process can be killed. A search merely wide (a hundred thousand files) stops
itself first and answers the matches it found, ``truncated``. The child runs the service's
own code (:class:`~.files.Files`), never a program of the workspace, so it needs no
sandbox; it only reads.

The child reads one JSON job on its standard input (``root``, ``read_max``, ``write_max``,
``request``: a :class:`~loki_shared.messages.workspace.FilesRequest`) and writes one
:class:`~loki_shared.messages.workspace.FilesReply` (its ``error`` set when refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from loki_shared.errors import InvalidRequest, LokiError, error_info, from_info
from loki_shared.messages.workspace import FilesReply, FilesRequest

from .files import Caps, Files

#: The share of the bound a search over many files spends reading them before it answers
#: what it found (``truncated``); the rest is the child's start and its answer's way back.
SEARCH_SHARE = 0.6


async def grep(files: Files, req: FilesRequest, limit_s: float) -> FilesReply:
    """``req`` (a ``grep`` or a ``glob``) over ``files``' workspace, searched by a child
    process stopped
    after ``limit_s`` seconds.

    Raises:
        InvalidRequest: the search took longer (a pattern that backtracks without end, or a
            search too wide): the message says what to resend. The errors of
            :meth:`Files.files` as they are.
        RuntimeError: the child failed (its error output said).
    """
    job = {
        "root": str(files.root),
        "read_max": files.caps.read_max,
        "write_max": files.caps.write_max,
        "request": req.model_dump(mode="json"),
        "search_s": limit_s * SEARCH_SHARE,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loki_workspace.search",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), limit_s)
    except TimeoutError:
        why = (
            "a repetition inside a repetition, such as (a+)+ or (.*)*"
            if req.op == "grep"
            else "many * in a row"
        )
        raise InvalidRequest(
            f"{req.op} {req.pattern!r} was stopped after {limit_s:g} s: the pattern "
            f"backtracks without end ({why}) or the search is too wide — resend a simpler "
            "pattern, or narrow it with 'path' (or 'include')"
        ) from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"grep's process failed: {err.decode(errors='replace')[-500:]}")
    reply = FilesReply.model_validate_json(out)
    if reply.error is not None:
        raise from_info(reply.error)
    return reply


def main() -> None:
    """The child: one job from standard input, its reply to standard output."""
    job = json.loads(sys.stdin.buffer.read())
    files = Files(Path(job["root"]), Caps(job["read_max"], job["write_max"]), None)
    files.deadline = time.monotonic() + job["search_s"]
    try:
        reply = files.files(FilesRequest.model_validate(job["request"]))
    except LokiError as exc:
        reply = FilesReply(error=error_info(exc))
    sys.stdout.write(reply.model_dump_json())


if __name__ == "__main__":
    main()
