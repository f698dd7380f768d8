"""The sandbox's refusals and containments (issue 43, "Security"), against ``python -m
loki_workspace`` as a real process logged in as its own users: each case is refused or
contained, and the service still answers afterwards (its health, and a command).

Nothing here sends a packet anywhere: the network case only looks at what the sandbox has
(no interface but ``lo``, no route) and asks the kernel for a connection to TEST-NET-1
(192.0.2.1, never routed), which fails before anything could leave.
"""

from __future__ import annotations

import os
import time

import pytest
from nats.aio.client import Client as NATS

from loki_shared import subjects
from loki_workspace import git
from loki_workspace.sandbox import ENV
from tests.workspace.conftest import SECRET_ENV, WorkspaceProcess, ask, healthy, new_project

pytestmark = pytest.mark.slow


async def _workspace(nc: NATS) -> str:
    project = new_project()
    reply = await ask(nc, subjects.WORKSPACE_CREATE, project=project)
    assert reply.error is None, reply.error
    return project


async def _still_serving(nc: NATS, proc: WorkspaceProcess, project: str) -> None:
    assert proc.alive(), "\n".join(proc.proc.tail)
    assert await healthy(nc)
    echo = await ask(nc, subjects.WORKSPACE_RUN, project=project, command="echo alive")
    assert (echo.exit_code, echo.output) == (0, "alive\n")


def _sandbox_processes() -> list[str]:
    """Live processes (not zombies) whose command line runs in a sandbox: bwrap's, and
    anything of the sandbox's user that has the sandbox's environment (``LOGNAME=loki``:
    another program of that user on this machine, a container's ``nobody``, is not one)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                status = fh.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state = status.split("State:", 1)[1].split()[0]
        uid = status.split("Uid:", 1)[1].split()[0]
        if uid == "65534" and "bwrap" not in cmd.split(" ")[0]:
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    sandboxed = b"LOGNAME=loki\0" in fh.read() + b"\0"
            except OSError:
                sandboxed = True  # unreadable: counted, to be safe
            if not sandboxed:
                continue
        if state != "Z" and ("bwrap" in cmd.split(" ")[0] or uid == "65534"):
            out.append(f"{entry} {cmd[:120]}")
    return out


async def test_paths_leaving_the_workspace_are_forbidden(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    for path in ("../../etc/passwd", "a/../../x", "/etc/passwd", "/proc/self/environ"):
        read = await ask(nc, subjects.WORKSPACE_READ, project=project, path=path)
        assert read.error is not None and read.error.type == "forbidden", path
        wrote = await ask(nc, subjects.WORKSPACE_WRITE, project=project, op="write", path=path,
                          content="x")  # fmt: skip
        assert wrote.error is not None and wrote.error.type == "forbidden", path
    listed = await ask(nc, subjects.WORKSPACE_FILES, project=project, op="list", path="..")
    assert listed.error.type == "forbidden"
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project, command="pwd", cwd="../..")
    assert run.error.type == "forbidden"
    await _still_serving(nc, workspace_process, project)


async def test_a_symlink_pointing_outside_is_forbidden(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    made = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                     command="ln -s /etc/passwd x && ln -s / root && ln -s x y")  # fmt: skip
    assert made.exit_code == 0, made.output
    for path in ("x", "y", "root/etc/passwd"):
        read = await ask(nc, subjects.WORKSPACE_READ, project=project, path=path)
        assert read.error is not None and read.error.type == "forbidden", path
        assert "outside the workspace" in read.error.message
        assert "'/" not in read.error.message  # the host's path (the target) is not told
    wrote = await ask(nc, subjects.WORKSPACE_WRITE, project=project, op="write", path="x",
                      content="root::0:0::/:/bin/sh\n")  # fmt: skip
    assert wrote.error.type == "forbidden"
    listed = await ask(nc, subjects.WORKSPACE_FILES, project=project, op="list")
    assert {(e.path, e.kind) for e in listed.entries} == {
        ("x", "symlink"), ("y", "symlink"), ("root", "symlink"),
    }  # fmt: skip
    await _still_serving(nc, workspace_process, project)


async def test_a_fifo_never_blocks_the_file_tools(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    made = await ask(nc, subjects.WORKSPACE_RUN, project=project, command="mkfifo pipe")
    assert made.exit_code == 0, made.output
    t0 = time.monotonic()
    read = await ask(nc, subjects.WORKSPACE_READ, project=project, path="pipe", timeout=10)
    assert read.error.type == "invalid_request"
    wrote = await ask(nc, subjects.WORKSPACE_WRITE, project=project, op="write", path="pipe",
                      content="x", timeout=10)  # fmt: skip
    assert wrote.error.type == "invalid_request"
    grep = await ask(nc, subjects.WORKSPACE_FILES, project=project, op="grep", pattern="x",
                     timeout=10)  # fmt: skip
    assert grep.error is None and grep.matches == []
    assert time.monotonic() - t0 < 10
    await _still_serving(nc, workspace_process, project)


async def test_the_sandbox_environment_is_clean(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    secret = workspace_process.env[SECRET_ENV]
    nats_password = workspace_process.env["LOKI_NATS_PASSWORD"]
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                    command="cat /proc/self/environ | tr '\\0' '\\n'; echo; env")  # fmt: skip
    assert run.exit_code == 0, run.output
    assert secret not in run.output and SECRET_ENV not in run.output
    assert nats_password not in run.output and "LOKI_" not in run.output
    names = {line.split("=", 1)[0] for line in run.output.splitlines() if "=" in line}
    # the fixed environment, git's identity (a commit by `run` is Loki's too), the shell's own
    assert names <= {*ENV, *git.IDENTITY, "PWD", "SHLVL", "_", "OLDPWD"}
    # nor the service's own environment, through its /proc: another pid namespace
    peek = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                     command=f"cat /proc/{workspace_process.proc.proc.pid}/environ; ls /proc")  # type: ignore[union-attr]  # fmt: skip
    assert secret not in peek.output
    await _still_serving(nc, workspace_process, project)


async def test_loki_home_is_not_there(workspace_process: WorkspaceProcess, nc: NATS) -> None:
    project = await _workspace(nc)
    home = str(workspace_process.home)
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project, command=f"ls -la {home}")
    assert run.exit_code != 0 and "No such file or directory" in run.output
    found = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                      command="find / -xdev -name credentials.json 2>/dev/null; ls / /run 2>&1")  # fmt: skip
    assert "credentials.json" not in found.output
    assert "workspaces" not in found.output
    await _still_serving(nc, workspace_process, project)


async def test_a_fork_bomb_is_contained(workspace_process: WorkspaceProcess, nc: NATS) -> None:
    project = await _workspace(nc)
    t0 = time.monotonic()
    bomb = await ask(nc, subjects.WORKSPACE_RUN, project=project, timeout_s=10,
                     command="bomb() { bomb | bomb & }; bomb; sleep 5")  # fmt: skip
    assert time.monotonic() - t0 < 30
    assert bomb.error is None
    assert "fork" in bomb.output.lower() or bomb.killed == "timeout", bomb.output[-500:]
    assert _sandbox_processes() == []
    await _still_serving(nc, workspace_process, project)


async def test_output_past_the_limit_kills_the_command(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                    command="head -c 100000000 /dev/zero | tr '\\0' 'a'")  # fmt: skip
    assert run.killed == "output" and run.exit_code is None
    assert run.truncated and run.output_bytes < 100_000_000
    assert len(run.output.encode()) <= 256 * 1024 + 100  # LOKI_WORKSPACE_OUTPUT_MAX + marker
    assert "bytes of output cut" in run.output
    assert _sandbox_processes() == []
    await _still_serving(nc, workspace_process, project)


async def test_a_command_past_its_timeout_is_killed(
    workspace_process: WorkspaceProcess, nc: NATS
) -> None:
    project = await _workspace(nc)
    t0 = time.monotonic()
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project, timeout_s=1,
                    command="sleep 30 & sleep 30")  # fmt: skip
    assert time.monotonic() - t0 < 10
    assert (run.killed, run.exit_code) == ("timeout", None)
    assert _sandbox_processes() == []
    await _still_serving(nc, workspace_process, project)


async def test_no_network_but_loopback(workspace_process: WorkspaceProcess, nc: NATS) -> None:
    project = await _workspace(nc)
    look = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                     command="cat /proc/net/dev; echo @@; cat /proc/net/route; ls /sys/class/net 2>&1")  # fmt: skip
    devices, routes = look.output.split("@@\n")
    interfaces = {line.split(":")[0].strip() for line in devices.splitlines() if ":" in line}
    assert interfaces == {"lo"}
    assert len(routes.strip().splitlines()) == 2  # the header line, and no route at all
    # the kernel refuses a connection before anything could leave (TEST-NET-1, never routed)
    connect = (
        'python3 -c "import socket,errno\n'
        "s = socket.socket()\n"
        "try:\n    s.connect(('192.0.2.1', 80))\n"
        "except OSError as e:\n    print('refused', errno.errorcode[e.errno])\""
    )
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project, command=connect, timeout_s=20)
    assert run.output.strip() == "refused ENETUNREACH", run.output
    # loopback works inside (a test server of the workspace's own)
    loop = await ask(nc, subjects.WORKSPACE_RUN, project=project, timeout_s=20, command=(
        "python3 -c \"import socket\n"
        "srv = socket.create_server(('127.0.0.1', 0)); port = srv.getsockname()[1]\n"
        "c = socket.create_connection(('127.0.0.1', port)); print('loopback ok')\""
    ))  # fmt: skip
    assert loop.output.strip() == "loopback ok", loop.output
    await _still_serving(nc, workspace_process, project)


async def test_no_user_namespace_inside(workspace_process: WorkspaceProcess, nc: NATS) -> None:
    project = await _workspace(nc)
    run = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                    command="unshare -U -r id; echo status $?")  # fmt: skip
    assert "Operation not permitted" in run.output and run.output.endswith("status 1\n")
    await _still_serving(nc, workspace_process, project)


async def test_memory_and_file_size_limits(workspace_process: WorkspaceProcess, nc: NATS) -> None:
    project = await _workspace(nc)
    mem = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                    command="python3 -c 'x = bytearray(3 * 1024**3)'")  # fmt: skip
    assert mem.exit_code != 0 and "MemoryError" in mem.output
    limits = await ask(nc, subjects.WORKSPACE_RUN, project=project,
                       command="ulimit -v; ulimit -f; ulimit -c")  # fmt: skip
    assert limits.output.split() == [str(2 * 1024 * 1024), str(2 * 1024 * 1024), "0"]
    await _still_serving(nc, workspace_process, project)
