"""The workspace service over real NATS and Redis (in-process): workspaces created empty or
cloned, the file tools, commands, git."""

from __future__ import annotations

import subprocess
from pathlib import Path

from nats.aio.client import Client as NATS

from loki_shared import subjects
from loki_workspace.service import WorkspaceService
from tests.workspace.conftest import ask

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


async def _create(nc: NATS, project: str = "demo") -> None:
    reply = await ask(nc, subjects.WORKSPACE_CREATE, project=project)
    assert reply.error is None, reply.error


async def test_an_empty_workspace_is_a_git_repository_on_main(
    workspace: WorkspaceService, nc: NATS
) -> None:
    before = await ask(nc, subjects.WORKSPACE_INFO, project="demo")
    assert before.error is None and before.info.exists is False
    reply = await ask(nc, subjects.WORKSPACE_CREATE, project="demo")
    assert reply.error is None, reply.error
    info = reply.info
    assert (info.exists, info.branch, info.head, info.dirty, info.origin) == (
        True,
        "main",
        "",
        False,
        "",
    )
    assert info.sandbox.startswith("bubblewrap")
    assert info.agents_md is None
    assert (workspace.workspaces.root / "demo" / ".git").is_dir()
    again = await ask(nc, subjects.WORKSPACE_CREATE, project="demo")
    assert again.error.type == "conflict"


async def test_write_read_edit(workspace: WorkspaceService, nc: NATS) -> None:
    await _create(nc)
    wrote = await ask(
        nc,
        subjects.WORKSPACE_WRITE,
        project="demo",
        op="write",
        path="pkg/mod.py",
        content="def f():\n    return 1\n\ndef g():\n    return 1\n",
    )
    assert wrote.error is None, wrote.error
    assert (wrote.path, wrote.created, wrote.size) == ("pkg/mod.py", True, 45)
    read = await ask(
        nc, subjects.WORKSPACE_READ, project="demo", path="pkg/mod.py", offset=2, limit=2
    )
    assert (read.text, read.first_line, read.last_line, read.total_lines) == (
        "    return 1\n\n",
        2,
        3,
        5,
    )
    # ambiguous: two occurrences, nothing written
    amb = await ask(
        nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="pkg/mod.py",
        old="return 1", new="return 2",
    )  # fmt: skip
    assert amb.error.type == "conflict" and "2 times" in amb.error.message
    absent = await ask(
        nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="pkg/mod.py",
        old="return 3", new="return 2",
    )  # fmt: skip
    assert absent.error.type == "conflict"
    unique = await ask(
        nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="pkg/mod.py",
        old="def g():\n    return 1", new="def g():\n    return 2",
    )  # fmt: skip
    assert unique.error is None and unique.replacements == 1 and not unique.created
    every = await ask(
        nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="pkg/mod.py",
        old="return", new="yield", replace_all=True,
    )  # fmt: skip
    assert every.replacements == 2
    text = (workspace.workspaces.root / "demo" / "pkg" / "mod.py").read_text()
    assert text == "def f():\n    yield 1\n\ndef g():\n    yield 2\n"
    # the sandbox's user can change what the service wrote
    run = await ask(nc, subjects.WORKSPACE_RUN, project="demo", command="echo '# x' >> pkg/mod.py")
    assert run.exit_code == 0, run.output
    missing = await ask(nc, subjects.WORKSPACE_READ, project="demo", path="nope.txt")
    assert missing.error.type == "not_found"
    git_write = await ask(
        nc, subjects.WORKSPACE_WRITE, project="demo", op="write", path=".git/hooks/pre-commit",
        content="#!/bin/sh\n",
    )  # fmt: skip
    assert git_write.error.type == "forbidden"


async def test_a_read_past_the_cap_is_truncated(
    nats_url: str, redis_db: str, tmp_path: Path
) -> None:
    from tests.workspace.conftest import workspace_settings

    settings = workspace_settings(nats_url, redis_db, tmp_path / "home", workspace_read_max=1024)
    service = WorkspaceService(settings)
    await service.start()
    try:
        import nats

        nc = await nats.connect(nats_url)
        await _create(nc)
        line = "x" * 99 + "\n"
        await ask(nc, subjects.WORKSPACE_WRITE, project="demo", op="write", path="big.txt",
                  content=line * 100)  # fmt: skip
        read = await ask(nc, subjects.WORKSPACE_READ, project="demo", path="big.txt")
        assert read.truncated and read.last_line == 10 and read.total_lines == 100
        assert len(read.text) == 1000
        await nc.drain()
    finally:
        await service.stop()


async def test_a_binary_file_is_refused_with_its_mime(
    workspace: WorkspaceService, nc: NATS
) -> None:
    await _create(nc)
    (workspace.workspaces.root / "demo" / "logo.png").write_bytes(PNG)
    read = await ask(nc, subjects.WORKSPACE_READ, project="demo", path="logo.png")
    assert read.error is None
    assert (read.binary, read.mime, read.text, read.size) == (True, "image/png", "", len(PNG))
    edit = await ask(nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="logo.png",
                     old="PNG", new="GIF")  # fmt: skip
    assert edit.error.type == "invalid_request"


async def test_list_glob_grep(workspace: WorkspaceService, nc: NATS) -> None:
    await _create(nc)
    files = {
        "README.md": "# Demo\nTODO: docs\n",
        "src/app.py": "import os\n# TODO: more\n",
        "src/lib/util.py": "def util():\n    pass\n",
        "tests/test_app.py": "def test():\n    assert True\n",
    }
    for path, content in files.items():
        await ask(
            nc, subjects.WORKSPACE_WRITE, project="demo", op="write", path=path, content=content
        )
    listed = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="list", depth=1)
    assert [(e.path, e.kind) for e in listed.entries] == [
        ("README.md", "file"),
        ("src", "dir"),
        ("tests", "dir"),
    ]  # never .git
    deep = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="list", path="src")
    assert [e.path for e in deep.entries] == ["src/app.py", "src/lib", "src/lib/util.py"]
    globbed = await ask(
        nc, subjects.WORKSPACE_FILES, project="demo", op="glob", pattern="src/**/*.py"
    )
    assert [e.path for e in globbed.entries] == ["src/app.py", "src/lib/util.py"]
    anywhere = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="glob", pattern="*.py",
                         max_results=2)  # fmt: skip
    assert len(anywhere.entries) == 2 and anywhere.truncated
    grep = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="grep", pattern=r"TODO:\s")
    assert [(m.path, m.line, m.text) for m in grep.matches] == [
        ("README.md", 2, "TODO: docs"),
        ("src/app.py", 2, "# TODO: more"),
    ]
    only_py = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="grep", pattern="TODO",
                        include="*.py")  # fmt: skip
    assert [m.path for m in only_py.matches] == ["src/app.py"]
    bad = await ask(nc, subjects.WORKSPACE_FILES, project="demo", op="grep", pattern="(")
    assert bad.error.type == "invalid_request"
    none = await ask(nc, subjects.WORKSPACE_FILES, project="other", op="list")
    assert none.error.type == "not_found"


async def test_run_and_git_commit_log(workspace: WorkspaceService, nc: NATS) -> None:
    await _create(nc)
    await ask(nc, subjects.WORKSPACE_WRITE, project="demo", op="write", path="calc.py",
              content="def add(a, b):\n    return a + b\n")  # fmt: skip
    await ask(nc, subjects.WORKSPACE_WRITE, project="demo", op="write", path="AGENTS.md",
              content="# Rules\nRun the tests with python3 -m unittest.\n")  # fmt: skip
    run = await ask(
        nc,
        subjects.WORKSPACE_RUN,
        project="demo",
        command="python3 -c 'import calc; print(calc.add(2, 3))'; echo err >&2; exit 4",
    )
    assert run.error is None
    assert (run.exit_code, run.killed, run.truncated) == (4, "", False)
    assert run.output == "5\nerr\n" and run.output_bytes == 6
    # python's bytecode stays out of the workspace (a commit would carry it)
    assert not list((workspace.workspaces.root / "demo").rglob("*.pyc"))
    sub = await ask(nc, subjects.WORKSPACE_RUN, project="demo", command="pwd", cwd="sub")
    assert sub.error.type == "invalid_request"
    status = await ask(nc, subjects.WORKSPACE_GIT, project="demo", op="status")
    assert "?? calc.py" in status.output
    commit = await ask(nc, subjects.WORKSPACE_GIT, project="demo", op="commit", message="add calc")
    assert commit.exit_code == 0, commit.output
    log = await ask(nc, subjects.WORKSPACE_GIT, project="demo", op="log")
    assert log.exit_code == 0 and log.output.strip().endswith("Loki: add calc")
    info = (await ask(nc, subjects.WORKSPACE_INFO, project="demo")).info
    assert len(info.head) == 40 and info.branch == "main" and not info.dirty
    assert info.agents_md == "# Rules\nRun the tests with python3 -m unittest.\n"
    await ask(nc, subjects.WORKSPACE_WRITE, project="demo", op="edit", path="calc.py",
              old="a + b", new="b + a")  # fmt: skip
    diff = await ask(nc, subjects.WORKSPACE_GIT, project="demo", op="diff")
    assert "-    return a + b" in diff.output and "+    return b + a" in diff.output
    assert (await ask(nc, subjects.WORKSPACE_INFO, project="demo")).info.dirty
    nothing = await ask(nc, subjects.WORKSPACE_GIT, project="demo", op="commit")
    assert nothing.error.type == "invalid_request"


async def test_clone_from_a_local_repository(
    workspace: WorkspaceService, nc: NATS, tmp_path: Path
) -> None:
    src = tmp_path / "upstream"
    src.mkdir()
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # fmt: skip
    (src / "hello.txt").write_text("hi\n")
    for cmd in (
        ["git", "init", "-q", "-b", "trunk"],
        ["git", "add", "."],
        ["git", "commit", "-qm", "one"],
    ):
        subprocess.run(cmd, cwd=src, env=env, check=True)
    reply = await ask(nc, subjects.WORKSPACE_CREATE, project="cloned", clone_from=str(src))
    assert reply.error is None, reply.error
    assert (reply.info.branch, reply.info.origin, len(reply.info.head)) == ("trunk", str(src), 40)
    read = await ask(nc, subjects.WORKSPACE_READ, project="cloned", path="hello.txt")
    assert read.text == "hi\n"
    # a URL, a relative path, a missing folder, LOKI_HOME itself
    home = workspace.settings.home
    for bad, kind in (
        ("https://example.invalid/repo.git", "invalid_request"),
        ("relative/path", "invalid_request"),
        (str(tmp_path / "missing"), "invalid_request"),
        (str(home), "forbidden"),
        (str(workspace.workspaces.root / "cloned"), "forbidden"),
    ):
        refused = await ask(nc, subjects.WORKSPACE_CREATE, project="bad", clone_from=bad)
        assert refused.error is not None and refused.error.type == kind, bad
    assert not (workspace.workspaces.root / "bad").exists()
    # a folder that is not a repository: git's answer, nothing left behind
    plain = tmp_path / "plain"
    plain.mkdir()
    failed = await ask(nc, subjects.WORKSPACE_CREATE, project="bad", clone_from=str(plain))
    assert failed.error.type == "invalid_request" and "git clone" in failed.error.message
    assert not (workspace.workspaces.root / "bad").exists()


async def test_a_workspace_restored_as_root_is_given_back_to_the_sandbox(
    nats_url: str, redis_db: str, tmp_path: Path
) -> None:
    """A backup restores files as root: at the next start the workspace belongs to the
    sandbox's user again and commands can change it."""
    import os

    import nats

    from tests.workspace.conftest import workspace_settings

    settings = workspace_settings(nats_url, redis_db, tmp_path / "home")
    service = WorkspaceService(settings)
    await service.start()
    owner = service.sandbox.owner()
    await service.stop()
    assert owner is not None, "runs as root here: the sandbox's user is another"
    folder = settings.root() / "restored"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "a.txt").write_text("from the backup\n")
    service = WorkspaceService(settings)
    await service.start()
    try:
        for path in (folder, folder / "src", folder / "src" / "a.txt"):
            assert (os.stat(path).st_uid, os.stat(path).st_gid) == owner, path
        nc = await nats.connect(nats_url)
        run = await ask(nc, subjects.WORKSPACE_RUN, project="restored",
                        command="echo more >> src/a.txt && cat src/a.txt")  # fmt: skip
        assert (run.exit_code, run.output) == (0, "from the backup\nmore\n")
        await nc.drain()
    finally:
        await service.stop()
