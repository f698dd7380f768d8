"""The sandbox every command of a workspace runs in: Debian's bubblewrap (``bwrap``).

What a sandboxed command sees (:func:`build_argv`, pure, tested as such):

- the workspace, writable, at :data:`WORKSPACE` (``/workspace``), bound by an open file
  descriptor (``--bind-fd``): the path to it (inside ``LOKI_HOME``) is never walked by the
  sandbox and never visible in it;
- the system read-only: ``/usr`` (``/bin``, ``/lib``... as the host has them: symlinks into
  ``/usr`` on Debian) and the few files of ``/etc`` programs need (:data:`ETC`: the loader
  cache, the users and groups, name resolution of ``localhost``, fonts, the alternatives'
  links...) — not the rest of ``/etc``;
- a fresh ``/tmp`` and ``/dev/shm`` (tmpfs), a ``/proc`` of its own pid namespace, a minimal
  ``/dev``; no
  ``/sys``, no ``/run``, no ``/home``, nothing of ``LOKI_HOME``;
- every namespace unshared (``--unshare-all``): its network namespace has only ``lo``, so no
  packet can leave; a user namespace in which it may not make another (``--disable-userns``;
  a service running as root starts it otherwise, see below);
- a clean environment (``--clearenv``, then :data:`ENV`): never the service's, so never
  the NATS or Redis credentials;
- ``--die-with-parent`` (the service gone, the sandbox goes) and ``--new-session`` (no
  terminal to push keystrokes into).

Limits: the command runs under ``prlimit`` *inside* the sandbox (hard limits, which it cannot
raise): ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE`` (a file's size), ``RLIMIT_NOFILE``,
``RLIMIT_CORE`` 0 and ``RLIMIT_NPROC`` (processes and threads). Why ``RLIMIT_NPROC`` and not a
cgroup: a cgroup's pids limit needs a writable cgroup tree, which a container seldom has,
while the kernel keeps the process count per (user namespace, uid): a limit set inside the
sandbox's own user namespace counts that sandbox's processes only, and a fork bomb fails to
fork past it. Time and output are the runner's (:class:`Sandbox`): past the deadline or the
output limit the whole sandbox is killed (bwrap's process group; its pid namespace dies with
its first process, every process in it with it).

Memory, processes and file size are limits a command meets (an allocation, a fork or a write
fails: a ``MemoryError``, "Cannot fork"), not reasons to stop it: its reply's ``killed`` stays
"" for them, and only time and output kill a sandbox.

Two ways to start it, by who the service runs as:

- **not root** (the compose container, a person's ``loki up``): bwrap makes a user namespace
  (``--unshare-all``, ``--disable-userns``: none further inside) and the command runs as the
  service's user; the workspaces belong to it.
- **root**: the kernel never applies ``RLIMIT_NPROC`` to a process whose real user is root,
  and an unprivileged bwrap could not even reach a workspace below a ``LOKI_HOME`` of mode
  0700. So bwrap runs as root without a user namespace (every other namespace unshared, all
  capabilities dropped but ``CAP_SETUID``/``CAP_SETGID``), and inside, ``setpriv`` makes the
  command the unprivileged ``LOKI_WORKSPACE_UID``/``GID`` (default 65534) with no capability
  left, before ``prlimit``: its processes are then counted and limited (this count is that
  user's on the whole machine: sandboxes running at once share it). The workspaces belong to
  that user. The seccomp filter of :mod:`.seccomp` keeps it from making a user namespace
  (what ``--disable-userns`` does in the other way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loki_shared.errors import InvalidRequest, Unavailable

from . import seccomp

log = logging.getLogger("loki.workspace.sandbox")

#: Where the workspace appears inside the sandbox.
WORKSPACE = "/workspace"
#: The sandbox's whole environment (``HOME`` is the fresh ``/tmp``: a tool's caches and a
#: ``git config --global`` never land in the repository).
ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "SHELL": "/bin/sh",
    "USER": "loki",
    "LOGNAME": "loki",
    # Python's bytecode caches in /tmp, not beside the sources: a commit never carries them
    "PYTHONPYCACHEPREFIX": "/tmp/pycache",
}
#: Top-level system folders bound read-only (or re-made as the symlinks they are).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What of ``/etc`` a program needs: the dynamic loader's cache and configuration, the users
#: and groups (``whoami``, git's default identity), name resolution (``localhost`` for a test
#: server on loopback), the time zone, the alternatives' links (``python3``, ``editor``...),
#: the MIME table, fonts (the preview's browser) and the browser's own settings. Neither the
#: rest of ``/etc`` (the shadow file, the host's ssh keys...) nor its certificates (no network).
ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "localtime",
    "timezone",
    "alternatives",
    "mime.types",
    "fonts",
    "chromium",
    "chromium.d",
)
#: Other read-only paths, bound when the host has them: the fonts' cache.
EXTRA_RO = ("/var/cache/fontconfig",)

Killed = Literal["", "timeout", "output", "memory", "processes"]


@dataclass(frozen=True)
class Limits:
    """A command's limits.

    Attributes:
        timeout_s: seconds before the sandbox is killed (``killed: timeout``).
        output_max: bytes of output kept (first half, last half).
        output_kill: bytes of output after which the sandbox is killed (``killed: output``).
        memory: ``RLIMIT_AS`` of each process, bytes (None: none; a browser reserves far
            more address space than it uses and cannot run under one).
        procs: ``RLIMIT_NPROC``, processes and threads in the sandbox at once.
        file_size: ``RLIMIT_FSIZE``, bytes.
        tmp_size: the size of the sandbox's ``/tmp`` (a tmpfs, held in memory), bytes.
    """

    timeout_s: float
    output_max: int
    output_kill: int
    memory: int | None
    procs: int
    file_size: int
    tmp_size: int = 512 * 1024 * 1024


@dataclass(frozen=True)
class Bind:
    """A host folder given to the sandbox by an open file descriptor ``fd`` at ``dest``,
    writable or not."""

    fd: int
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class Host:
    """What the host has of :data:`SYSTEM`, :data:`ETC` and :data:`EXTRA_RO` (read once by
    :func:`host_layout`): ``dirs`` bound read-only, ``links`` (path, target) re-made as
    symlinks, ``etc`` the entries of ``/etc`` that exist, ``extra`` other read-only paths."""

    dirs: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    etc: tuple[str, ...]
    extra: tuple[str, ...] = ()


def host_layout(etc_dir: str = "/etc") -> Host:
    """This machine's :class:`Host` (reads the file system)."""
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    for path in SYSTEM:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    etc = tuple(e for e in ETC if os.path.lexists(os.path.join(etc_dir, e)))
    extra = tuple(p for p in EXTRA_RO if os.path.isdir(p))
    return Host(tuple(dirs), tuple(links), etc, extra)


def build_argv(
    bwrap: str,
    command: Sequence[str],
    host: Host,
    binds: Sequence[Bind],
    limits: Limits,
    cwd: str = WORKSPACE,
    env: Mapping[str, str] | None = None,
    as_user: tuple[int, int] | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` (an argv) in the sandbox.

    Args:
        bwrap: the bubblewrap program.
        command: what to run inside, e.g. ``["sh", "-c", "make test"]``.
        host: the host's system layout (:func:`host_layout`).
        binds: the folders given by file descriptor (the workspace at :data:`WORKSPACE`,
            writable; a clone's source read-only...), each fd passed to the child.
        limits: the limits set inside by ``prlimit``.
        cwd: the working directory inside the sandbox.
        env: variables added to :data:`ENV` (a git identity).
        as_user: (uid, gid) the command is made inside by ``setpriv`` (the service runs as
            root: bwrap then makes no user namespace); None: the user bwrap runs as, in a
            user namespace of its own.
        seccomp_fd: a descriptor bwrap reads a seccomp program from (``--seccomp``): with
            ``as_user``, the filter of :mod:`.seccomp` that forbids user namespaces.

    Returns:
        The argv, starting with ``bwrap``.
    """
    if as_user is None:
        argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    else:
        argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    # Folders bwrap would make for the mount points below are private to root (0700): the
    # sandbox's user must be able to walk them.
    dests = [*(f"/etc/{e}" for e in host.etc), *host.extra, *(b.dest for b in binds)]
    for folder in _parents(dests, skip=host.dirs):
        argv += ["--perms", "0755", "--dir", folder]
    for path in host.dirs:
        argv += ["--ro-bind", path, path]
    for path, target in host.links:
        argv += ["--symlink", target, path]
    for entry in host.etc:
        argv += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
    for path in host.extra:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):
        argv += ["--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", tmp]
    for bind in binds:
        argv += ["--bind-fd" if bind.writable else "--ro-bind-fd", str(bind.fd), bind.dest]
    argv += ["--chdir", cwd, "--clearenv"]
    for key, value in {**ENV, **(env or {})}.items():
        argv += ["--setenv", key, value]
    argv.append("--")
    if as_user is not None:
        uid, gid = as_user
        argv += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all", "--"]
    return [*argv, *prlimit_argv(limits), *command]


def _parents(paths: Sequence[str], skip: Sequence[str]) -> list[str]:
    """The folders above ``paths`` (absolute), parents first, but ``/`` and those in or
    under ``skip`` (folders bound whole)."""
    out: dict[str, None] = {}
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/" + "/".join(parts[:i])
            if not any(folder == s or folder.startswith(s + "/") for s in skip):
                out[folder] = None
    return list(out)


def prlimit_argv(limits: Limits) -> list[str]:
    """``prlimit`` (util-linux) with the hard and soft limits of ``limits``, then ``--``."""
    out = ["prlimit", f"--nproc={limits.procs}", f"--fsize={limits.file_size}"]
    out += ["--nofile=1024", "--core=0"]
    if limits.memory is not None:
        out.append(f"--as={limits.memory}")
    return [*out, "--"]


@dataclass
class RunResult:
    """A command's end (see :class:`~loki_shared.messages.workspace.RunReply`)."""

    exit_code: int | None
    output: str
    output_bytes: int
    truncated: bool
    killed: Killed
    duration_s: float


@dataclass
class _Output:
    """A command's output as it comes: the first ``half`` bytes and the last ``half``."""

    half: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> tuple[str, bool]:
        """(the output kept, UTF-8 with invalid bytes replaced; whether bytes were cut)."""
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), False
        marker = f"\n[... {cut} bytes of output cut ...]\n"
        head = bytes(self.head).decode("utf-8", "replace")
        return head + marker + bytes(self.tail).decode("utf-8", "replace"), True


class Sandbox:
    """Runs commands in bubblewrap (see the module's description).

    Args:
        bwrap: the bubblewrap program (a name looked up on ``PATH``, or a path).
        run_as: (uid, gid) the command is made inside the sandbox when the service runs as
            root; ignored otherwise (it then runs as the service's own user).
    """

    def __init__(self, bwrap: str, run_as: tuple[int, int]) -> None:
        self.bwrap = shutil.which(bwrap) or bwrap
        self.host = host_layout()
        self.run_as: tuple[int, int] | None = run_as if os.geteuid() == 0 else None
        self.filter = seccomp.program()
        self.version = ""
        self.problem = "not probed yet"

    def owner(self) -> tuple[int, int] | None:
        """The (uid, gid) the workspaces' files must belong to (None: the service's own)."""
        return self.run_as

    async def probe(self, scratch: Path) -> str:
        """Check that a sandbox starts here (runs ``true`` in one over ``scratch``, a folder
        the sandbox user can use). Sets :attr:`version` (``bubblewrap 0.8.0``, "" when it
        does not work) and :attr:`problem`; returns the version."""
        try:
            done = await asyncio.to_thread(
                subprocess.run, [self.bwrap, "--version"], capture_output=True, timeout=10
            )
            version = done.stdout.decode().strip()
        except (OSError, subprocess.SubprocessError) as exc:
            self.version, self.problem = "", f"bubblewrap ({self.bwrap}) not found: {exc}"
            return ""
        limits = Limits(10.0, 4096, 65536, None, 64, 1 << 20)
        self.version = version  # run() below refuses when it is empty
        result = await self.run(["true"], scratch, limits)
        if result.exit_code != 0:
            self.version = ""
            self.problem = f"bubblewrap cannot start a sandbox here: {result.output.strip()}"
        else:
            self.problem = ""
        return self.version

    async def run(
        self,
        command: Sequence[str],
        workspace: Path,
        limits: Limits,
        cwd: str = WORKSPACE,
        env: Mapping[str, str] | None = None,
        extra: Sequence[tuple[Path, str]] = (),
    ) -> RunResult:
        """Run ``command`` (an argv) in a sandbox over ``workspace`` (bound writable at
        :data:`WORKSPACE`) and ``extra`` (host folder, place inside: read-only), within
        ``limits``.

        Raises:
            Unavailable: no sandbox works here (:attr:`problem` says why), or bwrap could
                not be started.
            InvalidRequest: an argument holds a NUL character.
        """
        if not self.version:
            raise Unavailable(f"the sandbox is not available: {self.problem}")
        if any("\0" in arg for arg in command) or "\0" in cwd:
            raise InvalidRequest(
                "the command (or its message, a path) holds a NUL character, which no "
                "program's argument can carry: resend it without"
            )
        fds: list[int] = []
        try:
            fds.append(os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            binds = [Bind(fds[0], WORKSPACE, writable=True)]
            for src, dest in extra:
                fds.append(os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
                binds.append(Bind(fds[-1], dest))
            seccomp_fd = None
            if self.run_as is not None and self.filter is not None:
                seccomp_fd, writer = os.pipe()
                fds.append(seccomp_fd)
                os.write(writer, self.filter)  # a few hundred bytes: the pipe holds them
                os.close(writer)
            argv = build_argv(
                self.bwrap,
                command,
                self.host,
                binds,
                limits,
                cwd,
                env,
                as_user=self.run_as,
                seccomp_fd=seccomp_fd,
            )
            return await self._execute(argv, fds, limits)
        finally:
            for fd in fds:
                os.close(fd)

    async def _execute(self, argv: list[str], fds: list[int], limits: Limits) -> RunResult:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=fds,
                process_group=0,
                env={},
            )
        except OSError as exc:
            raise Unavailable(f"the sandbox could not start: {exc}") from exc
        out = _Output(limits.output_max // 2)
        killed: Killed = ""
        deadline = started + limits.timeout_s
        assert proc.stdout is not None
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    killed = "timeout"
                    break
                try:
                    chunk = await asyncio.wait_for(proc.stdout.read(65536), left)
                except TimeoutError:
                    killed = "timeout"
                    break
                if not chunk:
                    break
                out.add(chunk)
                if out.total > limits.output_kill:
                    killed = "output"
                    break
        finally:
            if killed:
                _kill_group(proc.pid)
            code = await _finish(proc)
        text, truncated = out.text()
        return RunResult(
            exit_code=None if killed else code,
            output=text,
            output_bytes=out.total,
            truncated=truncated,
            killed=killed,
            duration_s=round(time.monotonic() - started, 3),
        )


async def _finish(proc: asyncio.subprocess.Process) -> int:
    """Read ``proc``'s output to its end (discarded: asyncio reports the exit only once the
    pipe is closed) and wait for it; a sandbox still there after 5 s is killed."""
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(5.0):
            while await proc.stdout.read(65536):
                pass
            return await proc.wait()
    except TimeoutError:
        _kill_group(proc.pid)
        async with asyncio.timeout(5.0):
            while await proc.stdout.read(65536):
                pass
        return await proc.wait()


def _kill_group(pgid: int) -> None:
    """SIGKILL bwrap's process group (bwrap and its pid namespace's first process: the
    namespace, every process in it, dies with it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
