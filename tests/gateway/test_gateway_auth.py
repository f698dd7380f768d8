"""API key, listen address and body-size limit."""

from __future__ import annotations

import time

import httpx
import pytest

from loki_gateway.auth import bearer_token, is_protected
from loki_gateway.settings import Settings

KEY = "s3cret-Key-for-tests-0123"


@pytest.fixture(scope="module")
def keyed(gateway_factory, peers):
    return gateway_factory(key=KEY, LOKI_MAX_BODY_BYTES="4096")


@pytest.mark.parametrize(
    "path",
    [
        "/api/conversations",
        "/v1/models",
        "/api/chat/state",
        "/v1/chat/completions",
        "/api",
        "/api/perf/summary",
    ],
)
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key-xyz", "Basic " + KEY, f"Bearer {KEY}x"])
def test_every_api_and_v1_route_needs_the_key(keyed, path, auth):
    headers = {"Authorization": auth} if auth else {}
    r = httpx.get(keyed.url + path, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"] == {
        "message": "missing or invalid API key",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }


def test_right_key_passes_and_the_page_needs_none(keyed):
    r = httpx.get(keyed.url + "/api/conversations", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert httpx.get(keyed.url + "/").status_code == 200
    assert httpx.get(keyed.url + "/healthz").status_code == 200


def test_refusal_is_logged_without_the_key(keyed):
    wrong = "Bearer leaked-candidate-key-777"
    httpx.get(keyed.url + "/api/conversations?probe=1", headers={"Authorization": wrong})
    time.sleep(0.3)
    logs = keyed.logs()
    assert "401 GET /api/conversations" in logs
    assert "leaked-candidate-key-777" not in logs
    assert KEY not in logs


def test_body_over_the_limit_is_413(keyed):
    h = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(keyed.url + "/api/chat/send", headers=h, json={"content": "z" * 5000})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted while read
        for _ in range(10):
            yield b"x" * 1000

    r = httpx.post(keyed.url + "/v1/chat/completions", headers=h, content=chunks())
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (from /proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, state = fields[1], fields[3]
            host, p = addr.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":
                found.add(host)
    return found


def test_without_a_key_it_listens_on_loopback_only(gateway):
    assert _listening_addresses(gateway.port) == {"0100007F"}  # 127.0.0.1


def test_listen_host_rules(monkeypatch):
    for name in ("LOKI_API_KEY", "LOKI_WEB_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().listen_host() == "127.0.0.1"
    monkeypatch.setenv("LOKI_API_KEY", "k")
    assert Settings().listen_host() == "0.0.0.0"
    monkeypatch.setenv("LOKI_WEB_HOST", "127.0.0.2")
    assert Settings().listen_host() == "127.0.0.2"
    monkeypatch.setenv("LOKI_API_KEY", "")
    monkeypatch.delenv("LOKI_WEB_HOST")
    assert Settings().listen_host() == "127.0.0.1"  # an empty key is no key


def test_helpers():
    assert is_protected("/api") and is_protected("/v1/x") and not is_protected("/apix")
    assert not is_protected("/") and not is_protected("/static/app.js")
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"authorization", b"bearer  abc ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([]) is None
