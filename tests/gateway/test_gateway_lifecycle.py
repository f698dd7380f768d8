"""Start-up wiring and clean shutdown of the gateway process."""

from __future__ import annotations

import signal
import threading
import time

import httpx

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
