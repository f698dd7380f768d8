"""Start-up wiring and clean shutdown of the gateway process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from loki_shared import servers

from .sse_client import read_events


def test_memory_state_is_wired_at_start(gateway):
    r = httpx.get(gateway.url + "/api/memory")
    assert r.status_code == 200 and r.json() == {"state": "off"}


def test_sigterm_stops_cleanly_with_an_open_stream(gateway_factory, peers):
    gw = gateway_factory()
    cid = peers.new_conv("bye").info.id
    frames: list = []
    errors: list = []

    def reader() -> None:
        try:
            with gw.client() as c:
                frames.extend(read_events(c, cid, timeout=30))
        except Exception as exc:  # noqa: BLE001 - the server goes away: the stream ends, any way it can
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(1.0)
    gw.proc.proc.send_signal(signal.SIGTERM)
    code = gw.proc.proc.wait(timeout=20)
    t.join(20)
    # uvicorn ends by re-raising the signal it handled: SIGTERM's status, after a full shutdown
    assert code in (0, -signal.SIGTERM), gw.logs()
    assert not t.is_alive()
    assert "Application shutdown complete" in gw.logs()
    assert "returned without completing response" not in gw.logs()
    reconnect = [f for f in frames if f.event == "reconnect"]
    assert reconnect and reconnect[0].json()["reason"] == "server shutting down", errors


def test_a_router_that_fails_to_import_stops_the_start_up(tmp_path):
    """The gateway imports its routers directly: one that cannot be imported ends the process
    with the import error, before it listens; its routes never silently become 404s."""
    port = servers.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(LOKI_WEB_PORT=str(port), LOKI_HOME=str(tmp_path), LOKI_NATS_URL="nats://127.0.0.1:1")
    # None in sys.modules makes `import loki_gateway.routes.perf` raise (ModuleNotFoundError:
    # the case the gateway used to skip as "not written yet")
    script = (
        "import runpy, sys; sys.modules['loki_gateway.routes.perf'] = None; "
        "runpy.run_module('loki_gateway', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "Error" in last and "loki_gateway.routes.perf" in last, done.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
