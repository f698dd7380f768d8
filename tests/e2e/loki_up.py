"""``loki up`` run as a person runs it: a child process whose output is read line by line."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from loki_shared import servers

#: Linux capabilities that let root read any file (``capability.h``); dropped from the
#: launcher's bounding set so a mode-000 file is unreadable to it, as to any user.
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
PR_CAPBSET_DROP = 24


def _drop_file_read_override() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def children_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class LokiUp:
    """``loki up`` in a child process with ``env`` (on top of the test's environment without
    its ``LOKI_*`` variables).

    Args:
        home: ``LOKI_HOME``.
        env: more variables (``LOKI_MODEL``, ``LOKI_EXTRA_ARGS`` ...).
        no_file_read_override: run it without root's power to read any file.
        args: more ``loki up`` arguments.
    """

    def __init__(
        self,
        home: Path,
        env: dict[str, str] | None = None,
        no_file_read_override: bool = False,
        args: tuple[str, ...] = (),
    ) -> None:
        self.port = int((env or {}).get("LOKI_WEB_PORT") or servers.free_port())
        full = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
        full.update(LOKI_HOME=str(home), LOKI_WEB_PORT=str(self.port), LOKI_CTX="2048")
        full.update(env or {})
        loki = Path(sys.executable).parent / "loki"
        preexec = _drop_file_read_override if no_file_read_override and os.geteuid() == 0 else None
        self.proc = subprocess.Popen(
            [str(loki), "up", *args],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for raw in self.proc.stdout:
            with self._new:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def launcher_lines(self) -> list[str]:
        """The launcher's own lines (not the services' output it echoes, ``[name] ...``)."""
        return [line for line in self.lines if not line.startswith("[")]

    def wait_for(self, text: str, timeout: float) -> str:
        """Return the first output line containing ``text``.

        Raises:
            AssertionError: not seen within ``timeout`` seconds (or the launcher exited).
        """
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new:
            while True:
                for line in self.lines[seen:]:
                    if text in line:
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and seen == len(self.lines)):
                    break
                self._new.wait(min(left, 0.5))
        raise AssertionError(f"{text!r} not seen; output:\n" + "\n".join(self.lines[-60:]))

    def exit_status(self, timeout: float) -> int:
        """Wait for the launcher to exit; its status (output read to the end)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"loki up still running after {timeout:g} s:\n" + "\n".join(self.lines[-60:])
            ) from None
        time.sleep(0.2)  # the reader thread takes the last lines
        return rc

    def engine_info(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.port}/api/engine", timeout=10).json()

    def kill(self) -> None:
        """SIGKILL the launcher and everything it started (test clean-up)."""
        for pid in [*children_of(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
