"""Issue 45: the end-to-end sealed chat through an untrusted relay (tests/fakes/relay.py).

A real gateway (with an API key), real NATS and Redis, the fake chat peers; the paired client
is :class:`loki_cli.e2e.E2EClient`, talking to the relay stand-in only.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis as redis_sync

from loki_cli.e2e import E2EClient, E2EError, E2ERefused
from loki_shared import e2e_envelope as env
from tests.fakes.relay import Relay, frame_fields

KEY = "e2e-api-key"
SECRET_MESSAGE = "Meet me at the old mill, password swordfish"
TOOL_OUTPUT = "TOOLOUT-7731-private"


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


def until_end(events, limit: int = 200) -> list:
    out = []
    for event in events:
        out.append(event)
        choices = event.data.get("choices") or [{}]
        if event.name == "message" and choices[0].get("finish_reason"):
            return out
        assert len(out) < limit
    raise AssertionError("stream ended before the turn did")


def text_of(events) -> str:
    return "".join(
        ((e.data.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
        for e in events
        if e.name == "message" and e.data["choices"][0]["delta"].get("role") not in ("user", "tool")
    )


def test_pairing_key_given_once_sealed_at_rest(gw, redis_url):
    made = pair(gw, "Anna's phone")
    device, key = made["device"]["id"], env.b64d(made["key"])
    assert made["qr_svg"].lstrip().startswith("<svg") and made["code"].startswith("loki-e2e1:")
    assert env.read_code(made["code"])[:2] == (device, key)
    with gw.client() as c:
        listed = c.get("/api/e2e/devices")
        assert (
            c.patch(f"/api/e2e/devices/{device}", json={"name": "Anna"}).json()["device"]["name"]
            == "Anna"
        )
        again = c.get("/api/e2e/devices").text
    assert listed.status_code == 200
    row = next(d for d in listed.json()["devices"] if d["id"] == device)
    assert set(row) == {"id", "name", "created", "last_seen", "revoked"}
    for text in (listed.text, again):
        assert made["key"] not in text and made["code"] not in text
    # behind the API key
    import httpx

    assert httpx.get(gw.url + "/api/e2e/devices").status_code == 401
    assert httpx.post(gw.url + "/api/e2e/devices", json={"name": "x"}).status_code == 401
    # at rest: sealed, not the raw key
    stored = redis_sync.Redis.from_url(redis_url).hget(f"loki:e2e:device:{device}", "key")
    assert stored and key not in stored and len(stored) > len(key)


def test_chat_through_relay_resume_and_no_plaintext(gw, relay, peers):
    peers.turn_events = [
        (
            {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": TOOL_OUTPUT},
            {"loki": {"event": "tool_result"}},
        )
    ]
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        listing_before = client.state()
        assert "conversations" in listing_before
        cid = client.send(SECRET_MESSAGE)["conversation"]
        events = until_end(client.events(cid))
        seqs = [e.seq for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        assert text_of(events) == "".join(peers.reply_pieces)
        assert events[0].data["choices"][0]["delta"]["content"] == SECRET_MESSAGE
        # resume by Last-Event-ID: exactly the events after it
        resumed = until_end(client.events(cid, after=3))
        assert [e.seq for e in resumed] == seqs[3:]
        assert [e.data for e in resumed] == [e.data for e in events[3:]]
        state = client.state(cid)
        assert state["last_seq"] == seqs[-1]
        titles = [c["title"] for c in client.state()["conversations"]]
        assert SECRET_MESSAGE[:60] in titles
        # the API key was never needed, nor sent
        assert all(b"authorization" not in data.lower() for _, data in relay.records)
    finally:
        client.close()
    recorded = relay.recorded()
    for secret in (SECRET_MESSAGE, "swordfish", "wörld", TOOL_OUTPUT, "old mill"):
        for form in (secret.encode(), json.dumps(secret).encode(), secret.encode("unicode_escape")):
            assert form not in recorded, secret
    assert b"/api/e2e/chat" in recorded  # the relay did carry the stream


def _flip(text: str) -> str:
    """``text`` (base64url) with one character changed in the middle."""
    i = len(text) // 2
    return text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :]


def test_tampered_or_replayed_request_is_refused_nothing_processed(gw, relay, peers):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        cid = client.send("first")["conversation"]
        until_end(client.events(cid))
        sent = len(peers.sends)

        def flip_body(method, path, headers, body):
            wire = json.loads(body)
            wire["ct"] = _flip(wire["ct"])
            return method, path, headers, json.dumps(wire).encode()

        relay.on_request = flip_body
        with pytest.raises(E2ERefused) as refused:
            client.send("tampered", cid)
        assert refused.value.status == 401 and refused.value.error["code"] == "envelope_rejected"
        assert not refused.value.sealed
        relay.reset()
        client.send("second", cid)
        assert len(peers.sends) == sent + 1
        status, body = relay.replay()  # the "second" send, byte for byte
        assert status == 409 and json.loads(body)["error"]["code"] == "replayed_request"
        assert len(peers.sends) == sent + 1
        # a request sealed for one route does not open on another
        relay.on_request = lambda m, p, h, b: (m, p.replace("/send", "/control"), h, b)
        with pytest.raises(E2ERefused) as moved:
            client.send("moved", cid)
        assert moved.value.error["code"] == "envelope_rejected"
        assert len(peers.sends) == sent + 1
    finally:
        client.close()


def test_forged_device_and_wrong_key_refused(gw, relay):
    made = pair(gw)
    device, _, base = env.read_code(made["code"])
    forged = E2EClient(env.pairing_code(device, b"\x01" * 32, base), relay.url)
    unknown = E2EClient(env.pairing_code("dev_0000000000000000", b"\x01" * 32, base), relay.url)
    try:
        with pytest.raises(E2ERefused) as wrong:
            forged.send("hi")
        assert wrong.value.status == 401 and wrong.value.error["code"] == "envelope_rejected"
        with pytest.raises(E2ERefused) as nobody:
            list(unknown.events("abc"))
        assert nobody.value.status == 401 and nobody.value.error["code"] == "invalid_device"
    finally:
        forged.close()
        unknown.close()


def test_tampered_response_detected(gw, relay):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:

        def flip(path, data):
            wire = json.loads(data)
            wire["ct"] = _flip(wire["ct"])
            return json.dumps(wire).encode()

        relay.on_body = flip
        with pytest.raises(E2EError, match="not sealed for this request"):
            client.state()
        # an answer to another request (a recorded one) does not open either
        relay.reset()
        client.state()
        recorded = relay.records[-1][1]
        relay.on_body = lambda path, data: recorded
        with pytest.raises(E2EError):
            client.state()
    finally:
        client.close()


def _frames_of(relay, start: int) -> list[bytes]:
    out = []
    for direction, data in relay.records[start:]:
        if direction == "response":
            out.extend(f for f in data.split(b"\n\n") if f.startswith(b"id:"))
    return out


@pytest.fixture(scope="module")
def played(gw, relay):
    """Two devices, two conversations of the first: their recorded frames by seq."""
    a, b = pair(gw, "a"), pair(gw, "b")
    ca, cb = E2EClient(a["code"], relay.url), E2EClient(b["code"], relay.url)
    conv1 = ca.send("one")["conversation"]
    start = len(relay.records)
    until_end(ca.events(conv1))
    frames1 = _frames_of(relay, start)
    conv2 = ca.send("two")["conversation"]
    conv3 = cb.send("three")["conversation"]
    start = len(relay.records)
    until_end(cb.events(conv3))
    frames3 = _frames_of(relay, start)
    yield {"a": ca, "b": cb, "conv1": conv1, "conv2": conv2, "frames1": frames1, "frames3": frames3}
    ca.close()
    cb.close()


def _by_seq(frames: list[bytes]) -> dict[str, bytes]:
    return {frame_fields(f)["id"]: f for f in frames}


@pytest.mark.parametrize(
    "tamper",
    ["flip", "repeat", "drop", "swap", "other_conversation", "other_device", "other_stream"],
)
def test_tampered_event_stream_detected(played, relay, tamper):
    client, conv = played["a"], played["conv1"]
    other = {
        "other_conversation": None,
        "other_device": _by_seq(played["frames3"]),
        "other_stream": _by_seq(played["frames1"]),
    }
    held: list[bytes] = []

    def on_frame(path, frame):
        fields = frame_fields(frame)
        if fields.get("id") != "3":
            if tamper == "swap" and fields.get("id") == "4" and held:
                return [frame, held.pop()]
            return [frame]
        if tamper == "flip":
            wire = json.loads(fields["data"])
            wire["ct"] = _flip(wire["ct"])
            return [f"id: 3\ndata: {json.dumps(wire)}".encode()]
        if tamper == "repeat":
            return [frame, frame]
        if tamper == "drop":
            return []
        if tamper == "swap":
            held.append(frame)
            return []
        return [other[tamper]["3"]]

    if tamper == "other_conversation":
        # the same device's frame 3 of another conversation
        start = len(relay.records)
        until_end(client.events(played["conv2"]))
        other["other_conversation"] = _by_seq(_frames_of(relay, start))
    relay.on_frame = on_frame
    with pytest.raises(E2EError, match="not sealed for this stream in this place"):
        until_end(client.events(conv))


def test_downgrade_to_plain_routes_detected(gw, relay, played):
    client, conv = played["a"], played["conv1"]

    def to_plain_stream(method, path, headers, body):
        return method, f"/api/chat?conversation={conv}", {**headers, **gw.headers()}, body

    relay.on_request = to_plain_stream
    with pytest.raises(E2EError, match="not sealed"):
        until_end(client.events(conv))

    def to_plain_send(method, path, headers, body):
        plain = json.dumps({"conversation": conv, "content": "relay says hi"}).encode()
        return method, "/api/chat/send", {**headers, **gw.headers()}, plain

    relay.on_request = to_plain_send
    with pytest.raises(E2EError, match="not sealed"):
        client.send("hello", conv)


def test_last_event_id_must_match_the_sealed_resume_point(gw, relay, played):
    client, conv = played["a"], played["conv1"]
    relay.on_request = lambda m, p, h, b: (m, p, {**h, "Last-Event-ID": "2"}, b)
    with pytest.raises(E2ERefused) as refused:
        until_end(client.events(conv, after=1))
    assert refused.value.error["code"] == "invalid_last_event_id"


def test_revoked_device_refused_at_once_open_stream_included(gw, relay, peers):
    made = pair(gw)
    client = E2EClient(made["code"], relay.url)
    cid = client.send("hello")["conversation"]
    until_end(client.events(cid))
    seen: list[int] = []
    ended = threading.Event()
    failure: list[BaseException] = []

    def watch():
        try:
            for event in client.events(cid):
                seen.append(event.seq)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)
        ended.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen, "the stream replayed nothing"
    assert not ended.is_set()
    with gw.client() as c:
        assert c.delete(f"/api/e2e/devices/{made['device']['id']}").status_code == 200
        row = next(
            d
            for d in c.get("/api/e2e/devices").json()["devices"]
            if d["id"] == made["device"]["id"]
        )
    assert row["revoked"] is not None
    assert ended.wait(15), "the revoked device's open stream went on"
    assert not failure, failure
    with pytest.raises(E2ERefused) as refused:
        client.send("after revocation", cid)
    assert refused.value.status == 401 and refused.value.error["code"] == "invalid_device"
    with pytest.raises(E2ERefused):
        list(client.events(cid))
    client.close()


def test_cli_e2e_chat_through_relay(gw, relay, peers):
    from typer.testing import CliRunner

    from loki_cli.app import app

    code = pair(gw, "cli")["code"]
    start = len(relay.records)
    result = CliRunner().invoke(
        app, ["e2e", "chat", "--code", code, "--url", relay.url, "-m", "cli says hello-cli-77"]
    )
    assert result.exit_code == 0, result.output
    assert "".join(peers.reply_pieces) in result.output
    seen = b"".join(d for _, d in relay.records[start:])
    assert b"/api/e2e/send" in seen and b"hello-cli-77" not in seen
    # the stream cut in the middle of the turn: resumed from the last seq, nothing twice
    cuts: list[str] = []

    def cut_once(path, frame):
        if frame_fields(frame).get("id") == "4" and not cuts:
            cuts.append(path)
            raise ConnectionResetError("the relay cuts the stream")
        return [frame]

    relay.on_frame = cut_once
    resumed = CliRunner().invoke(
        app, ["e2e", "chat", "--code", code, "--url", relay.url, "-m", "cut me"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert cuts and resumed.output.count("".join(peers.reply_pieces)) == 1, resumed.output
    relay.reset()
    # a tampered answer stops it with an error saying so, exit status 1
    relay.on_body = lambda path, data: data.replace(b'"ct":"', b'"ct":"AAAA')
    broken = CliRunner().invoke(
        app, ["e2e", "chat", "--code", code, "--url", relay.url, "-m", "again"]
    )
    assert broken.exit_code == 1
    assert "not sealed for this request" in broken.output


def test_only_the_gateway_and_backup_reach_the_device_keys_in_redis():
    from fnmatch import fnmatch

    from loki_shared import permissions

    key = "loki:e2e:device:dev_0123456789abcdef"
    owners = {g.user for g in permissions.USERS if any(fnmatch(key, p) for p in g.redis_keys)}
    readers = {g.user for g in permissions.USERS if any(fnmatch(key, p) for p in g.redis_reads)}
    assert owners == {"gateway", "backup"} and not readers


def test_controls_and_sealed_errors(gw, relay, peers):
    client = E2EClient(pair(gw)["code"], relay.url)
    try:
        cid = client.send("to be reset")["conversation"]
        until_end(client.events(cid))
        assert client.control("reset", cid)["ok"] is True
        assert client.state(cid)["messages"] == []
        start = len(relay.records)
        for body, code in (
            ({"action": "explode", "conversation": cid}, "invalid_value"),
            ({"action": "stop", "conversation": "not a valid id!"}, "invalid_value"),
        ):
            with pytest.raises(E2ERefused) as refused:
                client.request("control", body)
            assert refused.value.sealed and refused.value.status == 400
            assert refused.value.error["code"] == code
        with pytest.raises(E2ERefused) as attached:
            client.request("send", {"content": "x", "attachments": ["a1"]})
        assert attached.value.sealed and attached.value.status == 400
        assert "attachments" in attached.value.error["message"]
        # the refusals' wording went sealed: the relay saw only the status
        seen = b"".join(d for _, d in relay.records[start:])
        assert b"explode" not in seen and b"attachments are not sent" not in seen
    finally:
        client.close()
