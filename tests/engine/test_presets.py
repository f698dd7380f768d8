"""Presets through the gateway's routes (``/api/presets``, switch, test, cacheram,
``/api/engine``) → NATS → a real supervisor → the real engine; external presets against a
scripted OpenAI-compatible server (deterministic errors and key checks)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from loki_shared import servers

pytestmark = pytest.mark.engine

LOCAL_KEY = "local-engine-secret-123"


class FakeOpenAI:
    """A scripted OpenAI-compatible API: ``GET /v1/models`` answers 200 for ``sk-good`` and
    OpenAI's 401 body otherwise; every Authorization header received is recorded."""

    def __init__(self) -> None:
        self.auth_seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                outer.auth_seen.append(self.headers.get("Authorization", ""))
                if self.path != "/v1/models":
                    self._send(404, {"error": {"message": "no route", "type": "not_found"}})
                elif self.headers.get("Authorization") == "Bearer sk-good":
                    self._send(200, {"object": "list", "data": [{"id": "remote-model"}]})
                else:
                    self._send(
                        401,
                        {
                            "error": {
                                "message": "Incorrect API key provided: sk-b***.",
                                "type": "invalid_request_error",
                                "code": "invalid_api_key",
                            }
                        },
                    )

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def fake_api():
    api = FakeOpenAI()
    yield api
    api.close()


@pytest.fixture
def gateway(nats_url, tmp_path):
    from fastapi.testclient import TestClient

    from loki_gateway.app import create_app
    from loki_gateway.settings import Settings

    app = create_app(Settings(nats_url=nats_url, home=tmp_path / "gw"))
    with TestClient(app) as client:
        yield client


def wait_engine(client, predicate, timeout=120.0) -> dict:
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        r = client.get("/api/engine")
        if r.status_code == 200:
            body = r.json()
            if predicate(body):
                return body
        time.sleep(0.25)
    pytest.fail(f"engine never matched: {body}")


def lease(nats_url: str, kind: str = "main"):
    import asyncio

    import nats

    from loki_shared import subjects
    from loki_shared.messages.engine import Lease, LeaseRequest, ReleaseReply, ReleaseRequest

    async def go():
        nc = await nats.connect(nats_url)
        try:
            r = await nc.request(
                subjects.ENGINE_LEASE,
                LeaseRequest(kind=kind, wait_s=30).model_dump_json().encode(),
                35,
            )
            got = Lease.model_validate_json(r.data)
            assert got.error is None, got.error
            r = await nc.request(
                subjects.ENGINE_RELEASE,
                ReleaseRequest(lease_id=got.lease_id).model_dump_json().encode(),
                5,
            )
            assert ReleaseReply.model_validate_json(r.data).ok
            return got
        finally:
            await nc.drain()

    return asyncio.run(go())


def test_presets_external_key_switch_test_and_cacheram(
    engine_env, supervisor_factory, gateway, fake_api, redis_db, nats_url
):
    sup = supervisor_factory({**engine_env, "LOKI_ENGINE_API_KEY": LOCAL_KEY})
    info = wait_engine(gateway, lambda b: b["state"] == "ready")
    r = gateway.get("/api/engine")
    assert LOCAL_KEY not in r.text and "api_key" not in info
    assert "***" in info["argv"]
    local_url = info["base_url"]
    # the template probe ran with the engine's key and its verdicts reach GET /api/engine
    assert info["template"]["supports_tools"] is False and info["template"]["error"] is None

    listed = gateway.get("/api/presets").json()
    assert listed["active"] == "env" and [p["id"] for p in listed["presets"]] == ["env"]

    # Connection test: the API's own error message, not its JSON.
    bad = gateway.post(
        "/api/presets/test",
        json={"base_url": fake_api.url + "/v1", "api_model": "remote-model", "api_key": "sk-bad"},
    ).json()
    assert bad == {
        "ok": False,
        "status": 401,
        "message": "Incorrect API key provided: sk-b***.",
        "models": [],
    }

    # Save an external preset: the key is sealed in Redis and never returned in clear.
    saved = gateway.post(
        "/api/presets",
        json={
            "id": "remote",
            "name": "Remote",
            "external": True,
            "base_url": fake_api.url + "/v1",
            "api_model": "remote-model",
            "api_key": "sk-good",
        },
    ).json()
    assert saved["preset"]["api_key"] is None and saved["preset"]["api_key_set"] is True
    raw = redis.Redis.from_url(redis_db).hget("loki:engine:presets", "remote")
    assert raw and b"sk-good" not in raw and b"api_key_sealed" in raw
    assert "sk-good" not in gateway.get("/api/presets").text

    # Saving again with an empty key keeps the stored key.
    again = gateway.post(
        "/api/presets",
        json={
            "id": "remote",
            "name": "Remote 2",
            "external": True,
            "base_url": fake_api.url + "/v1",
            "api_model": "remote-model",
            "api_key": "",
        },
    ).json()
    assert again["preset"]["api_key_set"] is True and again["preset"]["name"] == "Remote 2"
    ok = gateway.post("/api/presets/test", json={"id": "remote"}).json()
    assert ok["ok"] is True and ok["models"] == ["remote-model"]
    assert fake_api.auth_seen[-1] == "Bearer sk-good"

    # Switch by id to the external preset: the local engine stops.
    assert gateway.post("/api/presets/switch", json={"id": "nope"}).status_code == 404
    sw = gateway.post("/api/presets/switch", json={"id": "remote"}).json()
    assert sw["active"] == "remote"
    ext = wait_engine(gateway, lambda b: b["external"] and b["state"] == "ready")
    assert ext["base_url"] == fake_api.url and ext["total_slots"] == 0
    assert ext["template"] is None  # an external API is not probed
    assert not servers.port_open("127.0.0.1", int(local_url.rsplit(":", 1)[1]))
    assert sup.engine_pids() == []
    got = lease(nats_url, "main")
    assert got.external and got.id_slot is None and got.base_url == fake_api.url
    assert got.api_key == "sk-good" and got.model == "remote-model"
    assert gateway.get("/api/presets").json()["active"] == "remote"

    # Back to the local engine (its own key again); the external API never saw it.
    gateway.post("/api/presets/switch", json={"id": "env"})
    local = wait_engine(gateway, lambda b: not b["external"] and b["state"] == "ready")
    got = lease(nats_url, "main")
    assert not got.external and got.api_key == LOCAL_KEY and got.base_url == local["base_url"]
    assert all(LOCAL_KEY not in a for a in fake_api.auth_seen)

    # The active preset cannot be deleted; another one can.
    assert gateway.delete("/api/presets/env").status_code == 400
    assert gateway.delete("/api/presets/remote").status_code == 200
    assert [p["id"] for p in gateway.get("/api/presets").json()["presets"]] == ["env"]

    # CACHE_RAM and SIDE_SLOT verdicts for the preset editor (CPU-only machine).
    cram = gateway.get("/api/preset/cacheram").json()
    assert cram["cache_ram"]["value_mib"] is None and cram["cache_ram"]["effective_mib"] == 8192
    assert cram["placement"] == "cpu"
    cram = gateway.get(
        "/api/preset/cacheram", params={"cache_ram": "4096", "side_slot": "on"}
    ).json()
    assert cram["cache_ram"]["value_mib"] == 4096
    # Second slot: 2048 tokens × 23040 bytes (30 layers × 3 KV heads × 128 values × 2 B).
    assert cram["side_slot"] is True and cram["side_slot_mib"] == 45
    refused = gateway.get("/api/preset/cacheram", params={"side_slot": "on", "parallel": 3}).json()
    assert refused["side_slot"] is False and "PARALLEL=3" in refused["side_slot_refusal"]

    # Editing the preset in service applies it.
    env = gateway.get("/api/presets").json()["presets"][0]
    env["ctx"] = 1024
    saved = gateway.post("/api/presets", json=env).json()
    assert saved["detail"]["applied"] is True
    info = wait_engine(gateway, lambda b: b["state"] == "ready" and b["slot_n_ctx"] == [1024])
    assert info["n_ctx"] == 1024 and info["restarts"] == 0
