"""`loki up` as a person runs it: URL printed, page served, Ctrl-C stops everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from loki_shared import servers

from .loki_up import children_of, cmdline


def test_loki_up_serves_and_stops_cleanly(tmp_path: Path) -> None:
    port = servers.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(LOKI_HOME=str(tmp_path / "data"), LOKI_WEB_PORT=str(port), LOKI_CTX="2048")
    loki = Path(sys.executable).parent / "loki"
    proc = subprocess.Popen(
        [str(loki), "up"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: list[str] = []
    up = threading.Event()

    def read() -> None:
        assert proc.stdout
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            if "Loki is up" in line:
                up.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert up.wait(240), "".join(lines[-40:])
        assert any(f"http://127.0.0.1:{port}/" in line for line in lines)
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        children = children_of(proc.pid)  # each in a session of its own
        assert len(children) >= 9, children  # NATS, Redis, 6 services, llama-server
        assert any("loki_memory" in cmdline(pid) for pid in children), children
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(lines[-40:])
        # Nothing is left listening: the gateway port is closed and no child survives.
        assert not servers.port_open("127.0.0.1", port)
        time.sleep(0.5)
        leftover = [pid for pid in children if Path(f"/proc/{pid}").exists()]
        assert leftover == [], [cmdline(pid) for pid in leftover]
        assert (tmp_path / "data" / "secret.key").stat().st_mode & 0o777 == 0o600
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
