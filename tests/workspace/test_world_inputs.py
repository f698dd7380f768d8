"""Inputs from the world against the workspace service (issue 43): what a model or a person
sends — odd paths, odd file contents, odd arguments — each answered with a clear error or
handled, nothing lost, the service alive (its health, a command) afterwards.

The service runs in-process on the real NATS and Redis, with a real sandbox.
"""

from __future__ import annotations

import asyncio
import shutil
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from loki_shared import subjects
from loki_workspace.service import WorkspaceService
from tests.workspace.conftest import ask, healthy, workspace_settings

P = "world"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.drain()


@pytest.fixture
async def service(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[WorkspaceService]:
    """The service with a short grep bound, and project :data:`P`'s workspace made."""
    settings = workspace_settings(
        nats_url,
        redis_db,
        tmp_path / "home",
        workspace_grep_max_s=3.0,
        workspace_preview_timeout_s=8.0,
    )
    svc = WorkspaceService(settings)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


@pytest.fixture
async def ws(service: WorkspaceService, nc: NATS) -> Path:
    reply = await ask(nc, subjects.WORKSPACE_CREATE, project=P)
    assert reply.error is None, reply.error
    return service.workspaces.path(P)


async def write(nc: NATS, path: str, content: str) -> None:
    reply = await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="write", path=path, content=content
    )
    assert reply.error is None, reply.error


async def edit(nc: NATS, path: str, old: str, new: str, **kw: object) -> object:
    return await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="edit", path=path, old=old, new=new, **kw
    )


async def alive(nc: NATS) -> None:
    assert await healthy(nc)
    echo = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="echo alive")
    assert (echo.exit_code, echo.output) == (0, "alive\n")


# --- grep: a pattern that backtracks without end, an invalid one ------------------------------
async def test_a_catastrophic_grep_pattern_is_bounded(nc: NATS, ws: Path) -> None:
    await write(nc, "a.txt", "a" * 64 + "!\n")
    reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="(a+)+$")
    assert reply.error is not None and reply.error.type == "invalid_request"
    assert "pattern" in reply.error.message and "resend" in reply.error.message
    await alive(nc)
    ok = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="a+!")
    assert [(m.path, m.line) for m in ok.matches] == [("a.txt", 1)]


async def test_an_invalid_grep_pattern_says_what_to_resend(nc: NATS, ws: Path) -> None:
    await write(nc, "a.txt", "x\n")
    reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="(unclosed")
    assert reply.error is not None and reply.error.type == "invalid_request"
    assert "resend" in reply.error.message


# --- file contents ----------------------------------------------------------------------------
async def test_edit_keeps_crlf_line_ends(nc: NATS, ws: Path) -> None:
    await write(nc, "w.bat", "echo one\r\necho two\r\necho three\r\n")
    reply = await edit(nc, "w.bat", "echo one\necho two\n", "echo 1\necho 2\n")
    assert reply.error is None, reply.error
    assert (ws / "w.bat").read_bytes() == b"echo 1\r\necho 2\r\necho three\r\n"


async def test_edit_with_the_same_text_is_refused(nc: NATS, ws: Path) -> None:
    await write(nc, "a.py", "x = 1\n")
    reply = await edit(nc, "a.py", "x = 1", "x = 1")
    assert reply.error is not None and reply.error.type == "invalid_request"
    assert "same" in reply.error.message


async def test_lines_are_cut_at_newlines_only(nc: NATS, ws: Path) -> None:
    # a form feed, a lone CR, a U+2028 inside a line: one line each, as an editor or grep -n
    await write(nc, "f.c", "int a;\x0c int b;\nvar s = 'x\u2028y';\rz\nlast")
    reply = await ask(nc, subjects.WORKSPACE_READ, project=P, path="f.c")
    assert reply.error is None, reply.error
    assert reply.total_lines == 3
    assert (reply.first_line, reply.last_line) == (1, 3)
    found = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="last")
    assert [(m.path, m.line) for m in found.matches] == [("f.c", 3)]


async def test_a_file_without_trailing_newline_and_an_empty_one(nc: NATS, ws: Path) -> None:
    await write(nc, "n.txt", "one\ntwo")
    reply = await edit(nc, "n.txt", "two", "deux")
    assert reply.error is None, reply.error
    assert (ws / "n.txt").read_text() == "one\ndeux"
    await write(nc, "e.txt", "")
    empty = await ask(nc, subjects.WORKSPACE_READ, project=P, path="e.txt")
    assert (empty.error, empty.total_lines, empty.text) == (None, 0, "")
    past = await ask(nc, subjects.WORKSPACE_READ, project=P, path="n.txt", offset=10)
    assert past.error is not None and "offset" in past.error.message


async def test_a_huge_single_line_stays_within_the_read_cap(
    nc: NATS,
    ws: Path,
    service: WorkspaceService,
) -> None:
    cap = service.settings.workspace_read_max
    await write(nc, "min.js", "var a=1;" * (cap // 4))
    reply = await ask(nc, subjects.WORKSPACE_READ, project=P, path="min.js")
    assert reply.error is None, reply.error
    assert reply.truncated and 0 < len(reply.text.encode()) <= cap


# --- paths --------------------------------------------------------------------------------------
async def test_a_name_in_another_unicode_form_is_the_same_file(nc: NATS, ws: Path) -> None:
    nfd = unicodedata.normalize("NFD", "café.txt")
    nfc = unicodedata.normalize("NFC", "café.txt")
    await write(nc, nfd, "v1\n")
    reply = await ask(nc, subjects.WORKSPACE_READ, project=P, path=nfc)
    assert reply.error is None, reply.error
    assert reply.text == "v1\n"
    await write(nc, nfc, "v2\n")  # replaces it: never a second file that looks the same
    assert [p.name for p in ws.iterdir() if p.name != ".git"] == [nfd]
    assert (ws / nfd).read_text() == "v2\n"


async def test_a_home_path_is_refused_with_what_to_send(nc: NATS, ws: Path) -> None:
    reply = await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="write", path="~/notes.txt", content="x"
    )
    assert reply.error is not None and "~" in reply.error.message
    assert not (ws / "~").exists()


async def test_names_starting_with_a_dash_are_plain_names(nc: NATS, ws: Path) -> None:
    await write(nc, "-rf.txt", "x\n")
    await write(nc, "--help", "y\n")
    done = await ask(
        nc, subjects.WORKSPACE_GIT, project=P, op="commit", message="-m dash", paths=["-rf.txt"]
    )
    assert done.exit_code == 0, done.output
    log = await ask(nc, subjects.WORKSPACE_GIT, project=P, op="log")
    assert "-m dash" in log.output
    status = await ask(nc, subjects.WORKSPACE_GIT, project=P, op="status")
    assert "--help" in status.output and "-rf.txt" not in status.output


async def test_odd_paths_are_refused_clearly(nc: NATS, ws: Path) -> None:
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    (ws / "d").mkdir()
    cases = [
        ("read", "loop1"),
        ("read", "x" * 300),
        ("read", "d"),
        ("read", "."),
        ("write", "d"),
        ("write", ".git/hooks/pre-commit"),
        ("write", "d/../.git/config"),
        ("write", "x" * 300),
    ]
    for op, path in cases:
        if op == "read":
            reply = await ask(nc, subjects.WORKSPACE_READ, project=P, path=path)
        else:
            reply = await ask(
                nc, subjects.WORKSPACE_WRITE, project=P, op="write", path=path, content="x"
            )
        assert reply.error is not None, (op, path)
        assert reply.error.type != "internal", (op, path, reply.error)
    await alive(nc)


async def test_a_nul_in_a_command_or_a_message_is_refused(nc: NATS, ws: Path) -> None:
    run = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="echo a\0b")
    assert run.error is not None and run.error.type == "invalid_request", run.error
    assert "NUL" in run.error.message
    await write(nc, "a.txt", "x\n")
    git = await ask(nc, subjects.WORKSPACE_GIT, project=P, op="commit", message="a\0b")
    assert git.error is not None and git.error.type == "invalid_request", git.error
    made = await ask(nc, subjects.WORKSPACE_CREATE, project="other", clone_from="/tmp/\0x")
    assert made.error is not None and made.error.type == "invalid_request", made.error
    await alive(nc)


# --- git --------------------------------------------------------------------------------------
async def test_commit_messages_and_nothing_to_commit(nc: NATS, ws: Path) -> None:
    await write(nc, "a.txt", "x\n")
    message = "Say \"hi\" and 'bye'\n\n- a list\n$(touch pwned) `touch pwned2`"
    done = await ask(nc, subjects.WORKSPACE_GIT, project=P, op="commit", message=message)
    assert done.exit_code == 0, done.output
    assert not (ws / "pwned").exists() and not (ws / "pwned2").exists()
    again = await ask(nc, subjects.WORKSPACE_GIT, project=P, op="commit", message="again")
    assert "nothing to commit" in again.output


async def test_python_leaves_no_bytecode_in_the_workspace(nc: NATS, ws: Path) -> None:
    await write(nc, "mod.py", "X = 1\n")
    done = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="python3 -c 'import mod'")
    assert done.exit_code == 0, done.output
    assert not list(ws.rglob("__pycache__")) and not list(ws.rglob("*.pyc"))


# --- concurrency ------------------------------------------------------------------------------
async def test_concurrent_edits_of_one_file_lose_nothing(nc: NATS, ws: Path) -> None:
    n = 16
    filler = "# " + "-" * 78 + "\n"
    await write(nc, "big.py", "".join(f"m{i} = 0\n" + filler * 2000 for i in range(n)))
    replies = await asyncio.gather(
        *(edit(nc, "big.py", f"m{i} = 0", f"m{i} = 1") for i in range(n))
    )
    assert all(r.error is None for r in replies), [r.error for r in replies]  # type: ignore[attr-defined]
    text = (ws / "big.py").read_text()
    assert [i for i in range(n) if f"m{i} = 1" not in text] == []


async def test_text_in_another_encoding_is_named_as_text(nc: NATS, ws: Path) -> None:
    (ws / "latin.c").write_bytes("/* café, naïve */\nint x;\n".encode("latin-1"))
    (ws / "wide.txt").write_bytes("hello\r\n".encode("utf-16"))
    latin = await ask(nc, subjects.WORKSPACE_READ, project=P, path="latin.c")
    assert latin.binary and latin.mime == "text/plain; charset=iso-8859-1"
    wide = await ask(nc, subjects.WORKSPACE_READ, project=P, path="wide.txt")
    assert wide.binary and wide.mime == "text/plain; charset=utf-16"
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 20
    (ws / "x.png").write_bytes(png)
    image = await ask(nc, subjects.WORKSPACE_READ, project=P, path="x.png")
    assert image.mime == "image/png"
    refused = await edit(nc, "latin.c", "int x;", "int y;")
    assert refused.error is not None and "iso-8859-1" in refused.error.message
    assert (ws / "latin.c").read_bytes().endswith(b"int x;\n")  # nothing written


# --- preview --------------------------------------------------------------------------------
PAGE = """<!doctype html><html><head><title>Busy</title>
<script src="http://192.0.2.1/lib.js"></script>
<link rel="stylesheet" href="https://192.0.2.1/x.css"></head>
<body><p>Visible words</p><img src="http://192.0.2.1/pixel.png">
<script>%s</script></body></html>
"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium here")
async def test_a_page_that_never_ends_or_reaches_out_is_bounded(nc: NATS, ws: Path) -> None:
    await write(nc, "remote.html", PAGE % "")
    await write(nc, "busy.html", PAGE % "while (true) {}")
    remote = await ask(nc, subjects.WORKSPACE_PREVIEW, project=P, path="remote.html", timeout=90)
    assert remote.error is None, remote.error
    assert "Visible words" in remote.text and remote.png
    busy = await ask(nc, subjects.WORKSPACE_PREVIEW, project=P, path="busy.html", timeout=90)
    assert busy.error is None, busy.error
    assert busy.title == "Busy" and "Visible words" in busy.text
    assert "browser" in busy.note  # said: the file's own text, the page never finished
    await alive(nc)


async def test_a_grep_over_too_many_files_answers_what_it_found(
    nc: NATS, ws: Path, service: WorkspaceService
) -> None:
    # files enough that reading them all may take longer than the bound, here (3 s); the
    # script spells the word in two halves so that only the 40 files hold it (a machine fast
    # enough reads them all: 40 matches, not truncated)
    script = (
        "import os\n"
        "word = 'nee' + 'dle'\n"
        "for a in range(40):\n"
        "    os.makedirs(f'd{a}/e/f', exist_ok=True)\n"
        "    for b in range(1000):\n"
        "        open(f'd{a}/e/f/x{b}.txt', 'w').write(word + '\\n' if b == 0 else 'hay\\n')\n"
    )
    await write(nc, "make.py", script)
    made = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="python3 make.py")
    assert made.exit_code == 0, made.output
    reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="needle")
    assert reply.error is None, reply.error
    assert reply.matches and (reply.truncated or len(reply.matches) == 40)
    assert all(m.text == "needle" for m in reply.matches)


async def test_bad_or_catastrophic_globs_are_refused_clearly(nc: NATS, ws: Path) -> None:
    deep = "/".join(["a"] * 40)
    await write(nc, f"{deep}/{'a' * 200}", "x\n")
    for pattern in ("[z-a]*.py", "x[", "[!]"):
        reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="glob", pattern=pattern)
        assert reply.error is None or reply.error.type == "invalid_request", (pattern, reply.error)
    reply = await ask(
        nc, subjects.WORKSPACE_FILES, project=P, op="grep", pattern="x", include="[z-a]"
    )
    assert reply.error is not None and reply.error.type == "invalid_request", reply.error
    for pattern in ("**/" * 12 + "b", "*a" * 12 + "*b", "a/" + "*a" * 12 + "*b"):
        reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="glob", pattern=pattern)
        assert reply.error is None or reply.error.type == "invalid_request", (pattern, reply.error)
        assert reply.entries == []
    await alive(nc)


async def test_a_backslash_path_or_a_symlinked_parent(nc: NATS, ws: Path, tmp_path: Path) -> None:
    reply = await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="write", path="src\\main.py", content="x"
    )
    assert reply.error is not None and "'/'" in reply.error.message
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "out").symlink_to(outside)
    reply = await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="write", path="out/new/x.txt", content="x"
    )
    assert reply.error is not None and reply.error.type == "forbidden"
    assert list(outside.iterdir()) == []


async def test_a_glob_over_too_many_files_answers_what_it_found(nc: NATS, ws: Path) -> None:
    script = (
        "import os\n"
        "for a in range(60):\n"
        "    os.makedirs(f'd{a}/e/f/g/h', exist_ok=True)\n"
        "    for b in range(1000):\n"
        "        open(f'd{a}/e/f/g/h/x{b}.js', 'w').close()\n"
    )
    await write(nc, "make.py", script)
    made = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="python3 make.py")
    assert made.exit_code == 0, made.output
    reply = await ask(nc, subjects.WORKSPACE_FILES, project=P, op="glob", pattern="**/x1.js")
    assert reply.error is None, reply.error
    assert reply.entries and (reply.truncated or len(reply.entries) == 60)


async def test_the_workspace_as_commands_see_it_is_refused_with_the_relative_path(
    nc: NATS, ws: Path
) -> None:
    pwd = await ask(nc, subjects.WORKSPACE_RUN, project=P, command="pwd")
    where = pwd.output.strip()  # what a model sees, then sends back
    reply = await ask(
        nc, subjects.WORKSPACE_WRITE, project=P, op="write", path=f"{where}/src/a.py", content="x"
    )
    assert reply.error is not None and reply.error.type == "forbidden"
    assert "'src/a.py'" in reply.error.message
    assert not (ws / "src").exists()
