"""``GET /api/perf/summary`` and ``GET /api/perf/losses`` through the gateway app, behind the
API key, answered by a real perf service over real NATS."""

from __future__ import annotations

import httpx

from loki_gateway.app import create_app
from loki_gateway.bus import Bus
from loki_gateway.settings import Settings as GatewaySettings
from loki_perf.service import PerfService
from loki_perf.settings import Settings as PerfSettings
from loki_shared.perf_publish import publish_record

from .perf_helpers import record, wait_summary


async def test_summary_and_losses_behind_the_api_key(perf_nats, nc, tmp_path):
    service = PerfService(PerfSettings(nats_url=perf_nats, home=tmp_path, perf_metrics_port=0))
    await service.start()
    bus = await Bus.connect(perf_nats)
    app = create_app(GatewaySettings(nats_url=perf_nats, home=tmp_path, api_key="k3y"), bus=bus)
    app.state.bus = bus  # the lifespan is not run by the in-process transport
    transport = httpx.ASGITransport(app=app)
    try:
        assert await publish_record(nc, record("a", 1, cache_n=0, prompt_n=100))
        assert await publish_record(nc, record("b", 1, cache_n=0, prompt_n=80))
        assert await publish_record(nc, record("a", 2, cache_n=5, prompt_n=130))
        await wait_summary(nc, 3)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            assert (await http.get("/api/perf/summary")).status_code == 401
            auth = {"Authorization": "Bearer k3y"}
            r = await http.get("/api/perf/summary", headers=auth)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["completions"] == 3 and body["prompt_n"] == 310 and body["cache_n"] == 5
            assert "error" not in body
            assert body["detail"]["losses_by_cause"]["conversation"]["count"] == 1
            r = await http.get("/api/perf/losses", params={"limit": "5"}, headers=auth)
            assert r.status_code == 200
            (loss,) = r.json()["losses"]
            assert loss["conversation"] == "a" and loss["cause"] == "conversation"
            assert loss["between"][0]["conversation"] == "b"
            r = await http.get("/api/perf/losses", params={"limit": "x"}, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_limit"
            await service.stop()
            service = None
            r = await http.get("/api/perf/summary", headers=auth)
            assert r.status_code == 503 and "error" in r.json()
    finally:
        if service is not None:
            await service.stop()
        await bus.close()
