"""The pure rules of the workspace service: paths (:mod:`loki_workspace.paths`), the sandbox's
command line (:func:`loki_workspace.sandbox.build_argv`), the kept output, git's command
lines and the preview's text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loki_shared.errors import Forbidden, InvalidRequest
from loki_shared.messages.workspace import GitRequest
from loki_workspace import git, paths, preview, seccomp
from loki_workspace.sandbox import ENV, Bind, Host, Limits, _Output, build_argv

# --- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "want"),
    [
        (".", ()),
        ("", ()),
        ("a/b.py", ("a", "b.py")),
        ("./a//b/./c", ("a", "b", "c")),
        ("a/../b", ("b",)),
        ("a/b/../../c", ("c",)),
        (".gitignore", (".gitignore",)),
        ("..foo/x", ("..foo", "x")),
    ],
)
def test_parts_normalises_relative_paths(path: str, want: tuple[str, ...]) -> None:
    assert paths.parts(path) == want


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "a/b/../../../etc/passwd", "./.."])
def test_a_dotdot_above_the_root_is_forbidden(path: str) -> None:
    with pytest.raises(Forbidden, match="leaves the workspace"):
        paths.parts(path)


@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/self/environ", "/workspace/x", "//x"])
def test_an_absolute_path_is_forbidden(path: str) -> None:
    with pytest.raises(Forbidden, match="absolute"):
        paths.parts(path)


def test_a_nul_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="NUL"):
        paths.parts("a\0b")


def test_is_inside_compares_whole_components() -> None:
    assert paths.is_inside("/w/p", "/w/p")
    assert paths.is_inside("/w/p", "/w/p/x")
    assert not paths.is_inside("/w/p", "/w/p2/x")
    assert not paths.is_inside("/w/p", "/w")


def test_resolve_refuses_a_symlink_leading_outside(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("x")
    os.symlink("/etc/passwd", root / "out")
    os.symlink("../..", root / "src" / "up")
    os.symlink("src/a.py", root / "in")
    assert paths.resolve(root, "in") == (("src", "a.py"), root / "src" / "a.py")
    assert paths.resolve(root, "src/new/file.txt")[0] == ("src", "new", "file.txt")
    for bad in ("out", "src/up/x", "src/up"):
        with pytest.raises(Forbidden, match="outside the workspace"):
            paths.resolve(root, bad)


def test_git_internals_are_recognised() -> None:
    assert paths.touches_git((".git", "hooks", "pre-commit"))
    assert paths.touches_git(("sub", ".git", "config"))
    assert not paths.touches_git((".gitignore",))


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.py", ["a.py", "src/b.py", "a/b/c.py"], ["a.pyc", "py"]),
        ("src/**/*.py", ["src/a.py", "src/x/y/a.py"], ["a.py", "lib/src/a.py", "src/a.txt"]),
        ("src/*.py", ["src/a.py"], ["src/x/a.py"]),
        ("test_?.py", ["test_1.py", "t/test_a.py"], ["test_10.py"]),
        ("[ab].txt", ["a.txt", "b.txt"], ["c.txt"]),
        ("docs/**", ["docs/a", "docs/x/y.md"], ["doc/a"]),
    ],
)
def test_glob_regex(pattern: str, yes: list[str], no: list[str]) -> None:
    rx = paths.glob_regex(pattern)
    assert [p for p in yes if not rx.match(p)] == []
    assert [p for p in no if rx.match(p)] == []


def test_an_absolute_glob_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        paths.glob_regex("/etc/*")


# --- the sandbox's command line ----------------------------------------------------------------

LIMITS = Limits(
    timeout_s=5, output_max=1000, output_kill=10_000, memory=1 << 30, procs=64, file_size=1 << 20
)
HOST = Host(
    dirs=("/usr",),
    links=(("/bin", "usr/bin"), ("/lib", "usr/lib")),
    etc=("passwd", "ld.so.cache"),
)


def _pairs(argv: list[str], flag: str, n: int = 2) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1 : i + 1 + n]) for i, a in enumerate(argv) if a == flag]


def test_the_argv_isolates_the_command() -> None:
    argv = build_argv("bwrap", ["sh", "-c", "make"], HOST, [Bind(7, "/workspace", True)], LIMITS)
    before = argv[: argv.index("--")]
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in before
    assert "--new-session" in before and "--clearenv" in before
    assert "--share-net" not in argv
    # the system read-only, the workspace the only writable bind, by descriptor
    assert _pairs(argv, "--ro-bind") == [("/usr", "/usr"), ("/etc/passwd", "/etc/passwd"),
                                         ("/etc/ld.so.cache", "/etc/ld.so.cache")]  # fmt: skip
    assert _pairs(argv, "--bind-fd") == [("7", "/workspace")]
    assert "--bind" not in argv and "--dev-bind" not in argv
    assert _pairs(argv, "--symlink") == [("usr/bin", "/bin"), ("usr/lib", "/lib")]
    assert ("/tmp",) in _pairs(argv, "--tmpfs", 1) and ("/proc",) in _pairs(argv, "--proc", 1)
    # the environment is exactly ENV
    assert dict(_pairs(argv, "--setenv")) == dict(ENV)  # type: ignore[arg-type]
    # the limits, then the command
    tail = argv[argv.index("--") + 1 :]
    assert tail[0] == "prlimit"
    assert {"--nproc=64", "--as=1073741824", "--fsize=1048576", "--core=0"} <= set(tail)
    assert tail[tail.index("--") + 1 :] == ["sh", "-c", "make"]


def test_the_argv_binds_a_source_read_only_and_adds_env() -> None:
    argv = build_argv(
        "bwrap",
        ["git", "clone"],
        HOST,
        [Bind(7, "/workspace", True), Bind(8, "/source")],
        Limits(5, 1000, 10_000, None, 64, 1 << 20),
        cwd="/workspace/src",
        env={"GIT_AUTHOR_NAME": "Loki"},
    )
    assert _pairs(argv, "--ro-bind-fd") == [("8", "/source")]
    assert ("/workspace/src",) in _pairs(argv, "--chdir", 1)
    assert dict(_pairs(argv, "--setenv"))["GIT_AUTHOR_NAME"] == "Loki"  # type: ignore[arg-type]
    assert not any(a.startswith("--as=") for a in argv)


def test_the_environment_carries_no_secret() -> None:
    assert set(ENV) == {
        "PATH", "HOME", "TMPDIR", "LANG", "TERM", "SHELL", "USER", "LOGNAME", "PYTHONPYCACHEPREFIX",
    }  # fmt: skip
    assert not any("LOKI" in k or "LOKI" in v for k, v in ENV.items())


def test_the_output_keeps_head_and_tail() -> None:
    out = _Output(half=10)
    for chunk in (b"0123456789", b"abcdefghij", b"KLMNOPQRST", b"uvwxyz"):
        out.add(chunk)
    text, truncated = out.text()
    assert truncated and out.total == 36
    assert text.startswith("0123456789") and text.endswith("QRSTuvwxyz")
    assert "16 bytes of output cut" in text
    small = _Output(half=10)
    small.add(b"hello")
    assert small.text() == ("hello", False)


# --- git, preview ------------------------------------------------------------------------------


def test_git_commit_adds_then_commits_and_needs_a_message() -> None:
    req = GitRequest(project="p", op="commit", message="first", paths=["src/a.py"])
    add, commit = git.commands(req)
    assert add[-4:] == ["add", "-A", "--", "src/a.py"]
    assert commit[-5:] == ["commit", "-m", "first", "--", "src/a.py"]
    with pytest.raises(InvalidRequest, match="message"):
        git.commands(GitRequest(project="p", op="commit"))
    with pytest.raises(Forbidden):
        git.commands(GitRequest(project="p", op="diff", paths=["../x"]))


def test_git_info_output_parses() -> None:
    assert git.parse_info("main\n@@\nabc123\n@@\n M x\n") == ("main", "abc123", True)
    assert git.parse_info("main\n@@\n@@\n") == ("main", "", False)


def test_page_text_keeps_what_a_reader_sees() -> None:
    html = (
        "<html><head><title> My  page </title><style>p{color:red}</style></head>"
        "<body><h1>Hello</h1><script>var x = 'hidden';</script><p>one &amp; two</p>"
        "<ul><li>a</li><li>b</li></ul></body></html>"
    )
    title, text = preview.page_text(html)
    assert title == "My page"
    assert text == "Hello\none & two\na\nb"


def test_preview_output_parses() -> None:
    import base64

    png = base64.b64encode(b"\x89PNG\r\n\x1a\nrest").decode()
    out = f"{preview.DOM_MARK}\n<p>x</p>\n{preview.PNG_MARK}\n{png}"
    assert preview.parse_output(out) == ("<p>x</p>\n", png)
    assert preview.parse_output(f"{preview.DOM_MARK}\n<p>x</p>\n{preview.PNG_MARK}\n")[1] == ""
    assert preview.parse_output("garbage") == ("", "")


def test_under_root_the_command_is_made_the_sandbox_user_inside() -> None:
    argv = build_argv(
        "bwrap", ["id"], HOST, [Bind(7, "/workspace", True)], LIMITS, as_user=(65534, 65533)
    )
    before = argv[: argv.index("--")]
    # no user namespace (bwrap as root), every other one; only the two capabilities setpriv needs
    assert "--unshare-all" not in before and "--unshare-user" not in before
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"):
        assert flag in before
    assert _pairs(argv, "--cap-add", 1) == [("CAP_SETUID",), ("CAP_SETGID",)]
    tail = argv[argv.index("--") + 1 :]
    assert tail[:4] == ["setpriv", "--reuid=65534", "--regid=65533", "--clear-groups"]
    assert "--bounding-set=-all" in tail and "--inh-caps=-all" in tail
    assert tail[tail.index("prlimit") - 1] == "--" and tail[-1] == "id"


def test_the_mount_points_parents_are_made_walkable() -> None:
    host = Host(dirs=("/usr",), links=(), etc=("passwd",), extra=("/var/cache/fontconfig",))
    argv = build_argv("bwrap", ["id"], host, [Bind(7, "/workspace", True)], LIMITS)
    made = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert made == ["/etc", "/var", "/var/cache"]
    tmpfs = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
    assert tmpfs == ["/tmp", "/dev/shm"]
    assert argv[argv.index("/tmp") - 5 : argv.index("/tmp") - 3] == ["--perms", "1777"]


# --- the seccomp filter (root mode) ------------------------------------------------------------


def _run_bpf(prog: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """The filter's answer to one call: a small interpreter of the instructions it uses."""
    import struct

    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:  # jeq k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x45:  # jset k
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_the_filter_refuses_user_namespaces_only(machine: str) -> None:
    import errno

    prog = seccomp.program(machine)
    assert prog is not None
    audit, clone, unshare, clone3 = seccomp.ARCHES[machine]
    allow, eperm, enosys = 0x7FFF0000, 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS
    newuser = seccomp.CLONE_NEWUSER
    assert _run_bpf(prog, audit, unshare, newuser) == eperm
    assert _run_bpf(prog, audit, unshare, newuser | 0x20000) == eperm  # with CLONE_NEWNS too
    assert _run_bpf(prog, audit, clone, newuser | 0x11) == eperm
    assert _run_bpf(prog, audit, clone, 0x01200011) == allow  # fork's flags
    assert _run_bpf(prog, audit, unshare, 0x20000) == allow  # a mount namespace (no right to)
    assert _run_bpf(prog, audit, clone3) == enosys  # the C library falls back to clone
    assert _run_bpf(prog, audit, 0) == allow and _run_bpf(prog, audit, 59) == allow
    assert _run_bpf(prog, 0x40000003, 120, newuser) == enosys  # a 32-bit call on x86-64
    if machine == "x86_64":
        assert _run_bpf(prog, audit, seccomp.X32_BIT | 272, newuser) == enosys
    assert seccomp.program("sparc") is None


def test_under_root_the_filter_is_given_to_bwrap() -> None:
    argv = build_argv("bwrap", ["id"], HOST, [], LIMITS, as_user=(1, 1), seccomp_fd=9)
    assert argv[argv.index("--seccomp") + 1] == "9"
    assert argv.index("--seccomp") < argv.index("--")


def test_a_search_past_its_deadline_answers_what_it_found_truncated(tmp_path: Path) -> None:
    """The deadline is read before each file (grep) and each entry (glob): what was found
    before it is answered, ``truncated``; nothing after it is read."""
    import re
    import time

    from loki_shared.messages.workspace import FileEntry, FilesRequest
    from loki_workspace.files import Caps, Files

    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("needle\n")
    files = Files(tmp_path, Caps(read_max=1 << 20, write_max=1 << 20), owner=None)

    def targets():  # the clock runs out after the first file
        yield ("a.txt",), FileEntry(path="a.txt", kind="file")
        files.deadline = time.monotonic() - 1
        yield ("b.txt",), FileEntry(path="b.txt", kind="file")
        yield ("c.txt",), FileEntry(path="c.txt", kind="file")

    reply = files.grep_files(targets(), re.compile("needle"), limit=100)
    assert [m.path for m in reply.matches] == ["a.txt"] and reply.truncated
    files.deadline = None
    whole = files.grep_files(
        [((n,), FileEntry(path=n, kind="file")) for n in ("a.txt", "b.txt")],
        re.compile("needle"),
        limit=100,
    )
    assert len(whole.matches) == 2 and not whole.truncated
    files.deadline = time.monotonic() - 1
    globbed = files.files(FilesRequest(project="p", op="glob", pattern="*.txt"))
    assert globbed.entries == [] and globbed.truncated and files.stopped
