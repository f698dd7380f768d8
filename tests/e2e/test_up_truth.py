"""``loki up`` tells the truth when something cannot start (issue 27): what cannot start is
said in one line with exit status 1, "Loki is up" is printed only when the gateway it started
answers, a failure that would happen again is not retried, and a crash after a healthy start
is still restarted."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loki_shared import servers

from .loki_up import LokiUp, children_of, cmdline

#: Seconds a failed start may take: NATS, Redis and five services start, then stop.
FAILED_START_S = 90


@pytest.fixture
def launched() -> Iterator[list[LokiUp]]:
    """Launchers started by a test; whatever is left is killed at the end."""
    started: list[LokiUp] = []
    yield started
    for up in started:
        if up.proc.poll() is None:
            up.kill()


def alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(pid)
    return left


def assert_cannot_start(up: LokiUp, *fragments: str) -> str:
    """Exit status 1, one launcher line saying why (with every fragment), never "Loki is up"."""
    assert up.exit_status(FAILED_START_S) == 1, up.output[-4000:]
    why = [line for line in up.launcher_lines if line.startswith("Loki cannot start:")]
    assert len(why) == 1, up.output[-4000:]
    for fragment in fragments:
        assert fragment in why[0], why[0]
    assert "Loki is up" not in up.output
    return why[0]


def test_port_in_use_is_said_before_anything_starts(tmp_path: Path, launched: list[LokiUp]) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        t0 = time.monotonic()
        up = LokiUp(tmp_path / "data", {"LOKI_WEB_PORT": str(port)})
        launched.append(up)
        assert_cannot_start(
            up, f"port {port}", "already in use", "LOKI_WEB_PORT", f"pid {os.getpid()}"
        )
        assert time.monotonic() - t0 < 15, "found before anything starts"
        assert "NATS" not in up.output and "started " not in up.output, up.output
    finally:
        holder.close()


def test_missing_model_is_said_and_not_retried(tmp_path: Path, launched: list[LokiUp]) -> None:
    up = LokiUp(tmp_path / "data", {"LOKI_MODEL": "/nonexistent/model.gguf"})
    launched.append(up)
    up.wait_for("started gateway", 60)
    pids = children_of(up.proc.pid)
    assert_cannot_start(
        up, "the engine failed", "/nonexistent/model.gguf", "LOKI_MODEL", "does not exist"
    )
    # Nothing was launched, nothing retried, nothing left running.
    assert "engine starting" not in up.output and "restart in" not in up.output
    assert alive(pids) == [], [cmdline(p) for p in alive(pids)]


def test_unreadable_model_is_said(tmp_path: Path, launched: list[LokiUp]) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(servers.find_bundled_model().read_bytes()[:4096])
    model.chmod(0o000)
    up = LokiUp(tmp_path / "data", {"LOKI_MODEL": str(model)}, no_file_read_override=True)
    launched.append(up)
    assert_cannot_start(up, "the engine failed", str(model), "cannot be read", "permission")
    assert "engine starting" not in up.output


def test_a_file_that_is_not_gguf_is_said(tmp_path: Path, launched: list[LokiUp]) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("<html>not a model, a download error page</html>")
    up = LokiUp(tmp_path / "data", {"LOKI_MODEL": str(model)})
    launched.append(up)
    assert_cannot_start(up, "the engine failed", str(model), "is not a GGUF file")
    assert "engine starting" not in up.output


def test_a_service_exiting_while_starting_is_said_not_restarted(
    tmp_path: Path, launched: list[LokiUp]
) -> None:
    """A setting every service refuses: the first one to exit is named with its own last
    error line, once (no restart loop), exit status 1."""
    up = LokiUp(tmp_path / "data", {"LOKI_LOG_LEVEL": "LOUD"})
    launched.append(up)
    line = assert_cannot_start(up, "exited while starting (status 1)", "unknown log level")
    assert line.split("Loki cannot start: ")[1].split(" ")[0] in {
        "engine-supervisor",
        "recall",
        "memory",
        "perf",
        "workspace",
        "chat",
        "gateway",
    }, line
    assert "restarting" not in up.output


@pytest.mark.engine
def test_unknown_extra_args_flag_is_said_with_the_engine_words(
    tmp_path: Path, launched: list[LokiUp]
) -> None:
    up = LokiUp(tmp_path / "data", {"LOKI_EXTRA_ARGS": "--no-such-flag"})
    launched.append(up)
    assert_cannot_start(
        up, "the engine failed", "while starting", "invalid argument: --no-such-flag"
    )
    assert "restart in" not in up.output, "a failure that would happen again is not retried"
    assert up.output.count("engine starting") == 1


@pytest.mark.engine
def test_a_gguf_the_engine_refuses_is_said_with_its_words(
    tmp_path: Path, launched: list[LokiUp]
) -> None:
    model = tmp_path / "broken.gguf"
    model.write_bytes(b"GGUF" + os.urandom(4096))  # the magic, then garbage
    up = LokiUp(tmp_path / "data", {"LOKI_MODEL": str(model)})
    launched.append(up)
    line = assert_cannot_start(up, "the engine failed", "while starting", "GGUF")
    assert "restart in" not in up.output
    assert "not retried" in line


@pytest.mark.engine
def test_crash_after_a_healthy_start_is_restarted(tmp_path: Path, launched: list[LokiUp]) -> None:
    up = LokiUp(tmp_path / "data")
    launched.append(up)
    up.wait_for("Loki is up", 240)
    assert f"http://127.0.0.1:{up.port}/" in up.wait_for("Loki is up", 1)
    first = up.engine_info()
    assert first["state"] == "ready" and first["restarts"] == 0
    [engine] = [p for p in children_of(up.proc.pid) if "llama-server" in cmdline(p)]
    os.kill(engine, signal.SIGKILL)
    up.wait_for("restart in 1 s", 30)
    deadline = time.monotonic() + 120
    info = first
    while time.monotonic() < deadline:
        info = up.engine_info()
        if info["state"] == "ready" and info["restarts"] == 1:
            break
        time.sleep(0.5)
    assert info["state"] == "ready" and info["restarts"] == 1, info
    assert up.proc.poll() is None, "the launcher keeps running"
    pids = children_of(up.proc.pid)
    up.proc.send_signal(signal.SIGINT)
    assert up.exit_status(60) == 0, up.output[-4000:]
    assert not any(line.startswith("Loki cannot start") for line in up.launcher_lines)
    # The stop is quiet: no traceback (issue 27's DrainTimeoutError noise), nothing left.
    assert "Traceback" not in up.output, up.output[-6000:]
    assert alive(pids) == [], [cmdline(p) for p in alive(pids)]


def test_second_ctrl_c_stops_at_once(tmp_path: Path, launched: list[LokiUp]) -> None:
    """With NATS frozen, the orderly stop would take each service its whole budget; a second
    Ctrl-C ends it at once and leaves no process behind."""
    up = LokiUp(
        tmp_path / "data",
        {"LOKI_ENGINE_URL": "http://127.0.0.1:9", "LOKI_STOP_TIMEOUT_S": "30"},
        args=("--no-wait-engine",),
    )
    launched.append(up)
    up.wait_for("Loki is up", 90)
    pids = children_of(up.proc.pid)
    [nats] = [p for p in pids if "nats-server" in cmdline(p)]
    os.kill(nats, signal.SIGSTOP)
    up.proc.send_signal(signal.SIGINT)
    up.wait_for("Ctrl-C again to stop at once", 10)
    time.sleep(1.0)
    assert up.proc.poll() is None, "the orderly stop is still waiting on the frozen NATS"
    sent = time.monotonic()
    up.proc.send_signal(signal.SIGINT)
    assert up.exit_status(10) == 130, up.output[-3000:]
    assert time.monotonic() - sent < 3
    time.sleep(0.5)
    assert alive(pids) == [], [cmdline(p) for p in alive(pids)]
