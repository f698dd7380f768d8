"""Issue 45 attacked: a hostile relay (tests/fakes/relay.py) and sloppy clients against the
end-to-end sealed routes. Each test is one attack and the refusal it must meet: an
OpenAI-shaped error saying why, or the client stopping with a reason; nothing processed twice.

Real gateways (with an API key, and one without), real NATS and Redis, the fake chat peers.
"""

from __future__ import annotations

import json
import os
import socket

import httpx
import pytest

from loki_cli.e2e import E2EClient, E2EError, E2ERefused
from loki_shared import e2e_envelope as env
from tests.fakes.relay import CutMidFrame, Relay, frame_fields
from tests.gateway.test_gateway_e2e import until_end

KEY = "e2e-attack-key"


@pytest.fixture(scope="module")
def gw(gateway_factory, peers):
    return gateway_factory(KEY)


@pytest.fixture(scope="module")
def relay(gw):
    proxy = Relay(gw.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture(autouse=True)
def _clean(relay, peers):
    relay.reset()
    yield
    relay.reset()
    peers.turn_events = []


def pair(gw, name: str = "phone") -> dict:
    with gw.client() as c:
        r = c.post("/api/e2e/devices", json={"name": name})
    assert r.status_code == 201, r.text
    return r.json()


def sealed_post(url: str, made: dict, route: str, payload: object) -> httpx.Response:
    """POST ``payload`` sealed (as the device) to ``url``'s ``/api/e2e/<route>``."""
    device, key, _ = env.read_code(made["code"])
    wire = env.seal(key, device, payload, env.aad(device, route, "request"))
    return httpx.post(f"{url}/api/e2e/{route}", json=wire, timeout=30)


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code"}, body
    return body["error"]


def test_stream_cut_mid_frame_resumes_exactly(gw, relay, peers):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        cid = client.send("cut me mid-frame")["conversation"]
        whole = until_end(client.events(cid))
        cut: list[str] = []

        def half_frame(path, frame):
            if frame_fields(frame).get("id") == "4" and not cut:
                cut.append("4")
                raise CutMidFrame(frame[: len(frame) // 2])
            return [frame]

        relay.on_frame = half_frame
        first = list(client.events(cid))  # ends at the cut: the half frame is not an event
        assert cut and [e.seq for e in first] == [1, 2, 3]
        rest = until_end(client.events(cid, after=first[-1].seq))
        assert [e.data for e in first + rest] == [e.data for e in whole]
    finally:
        client.close()


def test_truncated_envelopes_refused(gw, relay):
    made = pair(gw)
    client = E2EClient(made["code"], relay.url)
    try:
        relay.on_request = lambda m, p, h, b: (m, p, h, b[: len(b) // 2])
        with pytest.raises(E2ERefused) as refused:
            client.state()
        assert refused.value.status == 400 and refused.value.error["code"] == "invalid_envelope"
        relay.reset()
        relay.on_body = lambda path, data: data[: len(data) // 2]
        with pytest.raises(E2EError, match="not JSON"):
            client.state()
        relay.reset()
        assert "conversations" in client.state()  # nothing broken for the next request
    finally:
        client.close()


def test_old_event_resent_after_reconnect_detected(gw, relay):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        cid = client.send("resume me")["conversation"]
        start = len(relay.records)
        until_end(client.events(cid))
        old = [
            f
            for _, data in relay.records[start:]
            for f in data.split(b"\n\n")
            if f.startswith(b"id: 2\n")
        ][0]

        # the relay rewrites the resume point to 0: refused, never re-sent from the start
        relay.on_request = lambda m, p, h, b: (m, p, {**h, "Last-Event-ID": "0"}, b)
        with pytest.raises(E2ERefused) as refused:
            list(client.events(cid, after=3))
        assert refused.value.error["code"] == "invalid_last_event_id"
        # the relay slips an old event (seq 2 of the earlier stream) into the resumed one
        relay.reset()
        injected: list[bool] = []

        def inject(path, frame):
            if not injected and frame.startswith(b"id:"):
                injected.append(True)
                return [old, frame]
            return [frame]

        relay.on_frame = inject
        with pytest.raises(E2EError, match="not sealed for this stream in this place"):
            until_end(client.events(cid, after=3))
    finally:
        client.close()


def test_replay_after_gateway_restart_and_after_revocation(gw, relay, gateway_factory):
    made = pair(gw)
    client = E2EClient(made["code"], relay.url)
    try:
        client.state()
    finally:
        client.close()
    method, path, headers, body = relay.requests[-1]
    restarted = gateway_factory(KEY)  # a new gateway process on the same Redis
    r = httpx.post(restarted.url + path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 409 and error_of(r)["code"] == "replayed_request"
    with gw.client() as c:
        assert c.delete(f"/api/e2e/devices/{made['device']['id']}").status_code == 200
    r = httpx.post(restarted.url + path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_device"
    again = pair(gw)  # pairing again makes another id and key: the old request names neither
    assert again["device"]["id"] != made["device"]["id"]


@pytest.mark.parametrize(
    "counter",
    [True, 0, -1, 1.5, "12", 2**53, 2**64, None, [1]],
    ids=["true", "zero", "negative", "float", "string", "2^53", "2^64", "null", "list"],
)
def test_bad_request_counters_refused(gw, peers, counter):
    made = pair(gw)
    sends = len(peers.sends)
    r = sealed_post(gw.url, made, "send", {"counter": counter, "body": {"content": "x"}})
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["code"] == "invalid_envelope" and "counter" in error["message"]
    assert len(peers.sends) == sends
    # the largest counter a client may use is accepted, and then nothing above it exists
    ok = sealed_post(gw.url, made, "state", {"counter": 2**53 - 1, "body": {}})
    assert ok.status_code == 200


def test_oversized_envelope_refused_before_it_is_read(gw):
    host, port = "127.0.0.1", int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/e2e/send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 104857600\r\n\r\n{"
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

    # chunked (no length declared): counted as it is read, refused past the limit (the
    # route never holds more than the limit; the client writes its 100 MB before reading)
    def body():
        block = b" " * (1024 * 1024)
        for _ in range(100):
            yield block

    r = httpx.post(gw.url + "/api/e2e/send", content=body(), timeout=60)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_deeply_nested_json_refused_outside_and_inside(gw, peers):
    made = pair(gw)
    deep = "[" * 100_000 + "]" * 100_000
    r = httpx.post(
        gw.url + "/api/e2e/send", content=deep, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_envelope"
    device, key, _ = env.read_code(made["code"])
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    plain = ('{"counter":5,"body":{"content":' + deep + "}}").encode()
    ct = AESGCM(key).encrypt(nonce, plain, env.aad(device, "send", "request"))
    wire = env.Envelope(device, nonce, ct).to_json()
    sends = len(peers.sends)
    r = httpx.post(gw.url + "/api/e2e/send", json=wire)
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "invalid_envelope" and "nested" in error_of(r)["message"]
    assert len(peers.sends) == sends


def _good_wire(made: dict) -> dict:
    device, key, _ = env.read_code(made["code"])
    return env.seal(key, device, {"counter": 1, "body": {}}, env.aad(device, "state", "request"))


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"v": "1"},
        {"nonce": "!!!not base64!!!"},
        {"nonce": env.b64e(b"\0" * 8)},
        {"nonce": env.b64e(b"\0" * 16)},
        {"ct": "A"},
        {"ct": env.b64e(b"\0" * 8)},
        {"device": 7},
    ],
    ids=["v2", "v-text", "bad-b64", "nonce-8", "nonce-16", "ct-1char", "ct-short", "device-int"],
)
def test_malformed_envelopes_refused(gw, change):
    wire = {**_good_wire(pair(gw)), **change}
    r = httpx.post(gw.url + "/api/e2e/state", json=wire)
    assert r.status_code == 400, r.text
    assert error_of(r)["code"] == "invalid_envelope"
    assert "sealed" in error_of(r)["message"]


@pytest.mark.parametrize(
    "device",
    ["dev_*", "loki:e2e:devices", "dev_../../x", "dev_0123456789ABCDEF", "d" * 100_000, "é\0\n"],
    ids=["glob", "redis-key", "path", "upper-hex", "huge", "control-chars"],
)
def test_odd_device_ids_refused(gw, device):
    wire = {**_good_wire(pair(gw)), "device": device}
    r = httpx.post(gw.url + "/api/e2e/state", json=wire)
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_device"
    # the stream's query too (a long id is cut by the query's own limit)
    q = {"device": device[:64], "nonce": wire["nonce"], "ct": wire["ct"]}
    r = httpx.get(gw.url + "/api/e2e/chat", params=q)
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_device"


def test_pairing_code_pasted_with_spaces_and_newlines(gw, relay):
    code = pair(gw)["code"]
    wrapped = "  \n" + "\n".join(code[i : i + 20] for i in range(0, len(code), 20)) + " \r\n"
    spaced = code[:15] + " " + code[15:40] + "\t" + code[40:]
    for pasted in (wrapped, spaced):
        assert env.read_code(pasted) == env.read_code(code)
        client = E2EClient(pasted, relay.url)
        try:
            assert "conversations" in client.state()
        finally:
            client.close()
    with pytest.raises(ValueError, match="copy it again"):
        env.read_code(code[:-5])


def test_downgrade_to_plain_200_json_detected(gw, relay, peers):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        relay.on_body = lambda path, data: json.dumps(
            {"conversation": "c_relay", "queued": False}
        ).encode()
        with pytest.raises(E2EError, match="not sealed"):
            client.send("hello")
        relay.on_body = lambda path, data: b"<html>relay login</html>"
        with pytest.raises(E2EError, match="not JSON"):
            client.state()
    finally:
        client.close()


def test_pairing_refused_without_api_key(gateway_factory, peers):
    open_gw = gateway_factory()  # no LOKI_API_KEY: a relay reaching it could pair itself
    proxy = Relay(open_gw.url).start()
    try:
        r = httpx.post(proxy.url + "/api/e2e/devices", json={"name": "the relay"})
        assert r.status_code == 403, r.text
        error = error_of(r)
        assert error["code"] == "api_key_required" and "LOKI_API_KEY" in error["message"]
        listed = httpx.get(open_gw.url + "/api/e2e/devices").json()["devices"]
        assert all(d["name"] != "the relay" for d in listed)
    finally:
        proxy.stop()


def test_pwa_pages_carry_a_strict_csp(gw, relay):
    for path in ("/e2e/", "/e2e/index.html", "/e2e/app.js", "/e2e/sw.js"):
        r = httpx.get(relay.url + path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp, path
        assert "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = httpx.get(relay.url + "/e2e/").text
    assert "<script>" not in page and " style=" not in page and "onclick" not in page


def test_two_clients_of_one_device_collide_and_are_told_why(gw, relay, peers):
    code = pair(gw)["code"]
    a, b = E2EClient(code, relay.url), E2EClient(code, relay.url)
    try:
        # a seals its request first but is slower to send it; b's later counter lands first
        counter, wire = a._sealed_request("state", {})
        b.state()
        r = httpx.post(relay.url + "/api/e2e/state", json=wire)
        assert counter < b._last
        assert r.status_code == 409
        assert "another client of this device" in error_of(r)["message"]
        assert "conversations" in a.state()  # its next request goes through
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("forged", ["²", "١٢", "9" * 5000, "3 ", "-3"])
def test_forged_seq_ids_stop_the_client(gw, relay, forged):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        cid = client.send("odd ids")["conversation"]

        def odd(path, frame):
            if frame.startswith(b"id: 3\n"):
                return [frame.replace(b"id: 3\n", f"id: {forged}\n".encode(), 1)]
            return [frame]

        relay.on_frame = odd
        with pytest.raises(E2EError):
            until_end(client.events(cid))
    finally:
        client.close()


def test_revocation_between_key_and_counter_refuses_the_request(redis_url, tmp_path):
    """A request whose key was read just before the device was revoked is refused when its
    counter is checked (atomically with the key's presence), and leaves no counter behind."""
    import asyncio

    from redis.asyncio import Redis

    from loki_gateway.e2e.devices import DeviceRefused, DeviceStore
    from loki_shared.sealing import service_sealer

    async def race() -> None:
        redis = Redis.from_url(redis_url)
        store = DeviceStore(redis, service_sealer(tmp_path, "attack-test-secret"))
        try:
            device, key = await store.create("racing")
            assert await store.key(device.id) == key  # the request opened...
            assert await store.accept_counter(device.id, 10)
            await store.revoke(device.id)  # ...and the device is revoked before the next
            with pytest.raises(DeviceRefused):
                await store.accept_counter(device.id, 11)
            assert not await redis.exists(f"loki:e2e:counter:{device.id}")
        finally:
            await redis.aclose()

    asyncio.run(race())


@pytest.mark.parametrize(
    "target",
    [
        "/api/e2e/devices/",
        "//api/e2e/devices",
        "/api/e2e/chat/../devices",
        "/api/e2e/%64evices",
        "/api/e2e/chat%2f..%2fdevices",
        "/API/e2e/devices",
        "/api/e2e/devices?x=/api/e2e/chat",
    ],
)
def test_no_path_trick_pairs_without_the_api_key(gw, target):
    """Only the four sealed routes skip the API key: no spelling of the pairing route does."""
    port = int(gw.url.rsplit(":", 1)[1])
    body = b'{"name": "trick"}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status in (401, 404, 405), answer[:300]
    with gw.client() as c:
        names = [d["name"] for d in c.get("/api/e2e/devices").json()["devices"]]
    assert "trick" not in names
