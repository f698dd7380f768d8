"""The engine child's start: a clean signal mask and death with its supervisor.

Deterministic, with a stand-in child (a Python process) instead of llama-server: what is under
test is :class:`loki_supervisor.engine_process.EngineProcess`'s spawn, not the engine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from loki_supervisor.engine_process import EngineProcess

from .conftest import blocked_signals, process_alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_engine_starts_with_an_empty_signal_mask() -> None:
    """Spawned from a thread that blocks SIGTERM (as a relaunch after a crash was), the
    engine still has nothing blocked: a stop's SIGTERM reaches it."""
    result: dict[str, int] = {}

    def spawn_with_sigterm_blocked() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        async def run() -> None:
            engine = EngineProcess(SLEEPER)
            await engine.start()
            assert engine.pid is not None
            for _ in range(50):  # until the child has exec'd (its argv is the sleeper's)
                if b"time.sleep" in Path(f"/proc/{engine.pid}/cmdline").read_bytes():
                    break
                await asyncio.sleep(0.05)
            result["mask"] = blocked_signals(engine.pid)
            await engine.stop(grace=5)
            result["rc"] = engine.proc.returncode if engine.proc else 0

        asyncio.run(run())

    thread = threading.Thread(target=spawn_with_sigterm_blocked)
    thread.start()
    thread.join(30)
    assert result["mask"] == 0, f"engine started with signals blocked: {result['mask']:#x}"
    assert result["rc"] == -signal.SIGTERM, "the stop's SIGTERM ended it"


def test_engine_that_ignores_sigterm_dies_with_its_supervisor(tmp_path: Path) -> None:
    """A supervisor killed outright takes its engine along even when the engine does not
    act on SIGTERM (llama-server's handler can hang): the parent-death signal is SIGKILL."""
    pid_file = tmp_path / "engine.pid"
    engine_code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    )
    supervisor_code = textwrap.dedent(
        f"""
        import asyncio, sys, time
        from pathlib import Path
        from loki_supervisor.engine_process import EngineProcess

        async def main():
            engine = EngineProcess([sys.executable, "-c", {engine_code!r}])
            await engine.start()
            await asyncio.sleep(0.5)  # the child has set SIGTERM to ignored
            Path({str(pid_file)!r}).write_text(str(engine.pid))
            await asyncio.sleep(120)

        asyncio.run(main())
        """
    )
    supervisor = subprocess.Popen([sys.executable, "-c", supervisor_code])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        engine_pid = int(pid_file.read_text())
        assert process_alive(engine_pid)
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while process_alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = process_alive(engine_pid)
        if alive:
            os.kill(engine_pid, signal.SIGKILL)
        assert not alive, "orphan engine left running after its supervisor was killed"
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
