"""CORS (``LOKI_CORS_ORIGINS``): a web app served from another origin uses Loki's ``/v1``
with its key (issue 14, input 4; llama-swap #42). Checked in Debian's chromium (a page served
on another loopback port calls the gateway) and on the wire (the preflight is answered before
the key check)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from loki_shared import servers
from tests.fakes.fake_engine import FakeEngine, text_reply
from tests.fakes.gateway_peers import FakePeers

KEY = "cors-test-key"
PAGE = """<!doctype html><meta charset="utf-8"><title>app</title>
<pre id="out"></pre><pre id="stream"></pre>
<script>
const GW = "__GW__";
const headers = {"Authorization": "Bearer __KEY__", "Content-Type": "application/json"};
const ask = (stream) => fetch(GW + "/v1/chat/completions", {
  method: "POST", headers,
  body: JSON.stringify({messages: [{role: "user", content: "hi"}], stream}),
});
(async () => {
  const r = await ask(false);
  const j = await r.json();
  document.getElementById("out").textContent = r.status + " " + j.choices[0].message.content;
  const s = await ask(true);
  const text = await s.text();
  document.getElementById("stream").textContent = text.includes("data: [DONE]") ? "done" : text;
})().catch(e => { document.getElementById("out").textContent = "failed: " + e; });
</script>"""


@pytest.fixture(scope="module")
def engine():
    with FakeEngine() as fake:
        yield fake


@pytest.fixture(scope="module")
def peers(gw_nats, engine):
    fake = FakePeers(gw_nats, engine.url, id_slot=None).start()
    yield fake
    fake.stop()


class _Page:
    """An HTTP server on its own loopback port serving one page (another origin)."""

    def __init__(self) -> None:
        self.port = servers.free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self.html = ""
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, gateway_url: str) -> str:
        self.html = PAGE.replace("__GW__", gateway_url).replace("__KEY__", KEY)
        return self.origin + "/"


@pytest.fixture(scope="module")
def app_page() -> Iterator[_Page]:
    page = _Page()
    yield page
    page.server.shutdown()


def _run_page(browser, url: str) -> tuple[str, str]:
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_function("document.getElementById('out').textContent.length > 0")
        out = page.inner_text("#out")
        if out.startswith("200"):
            page.wait_for_function("document.getElementById('stream').textContent.length > 0")
        return out, page.inner_text("#stream")
    finally:
        page.close()


def test_a_page_on_another_origin_calls_v1_with_the_key(
    browser,
    gateway_factory,
    peers,
    engine,
    app_page,
):
    gw = gateway_factory(key=KEY, LOKI_CORS_ORIGINS=f"http://localhost:5173, {app_page.origin}")
    engine.push(text_reply("ok"), text_reply("ok"))
    out, stream = _run_page(browser, app_page.serve(gw.url))
    assert out == "200 ok" and stream == "done"
    # with any origin allowed
    star = gateway_factory(key=KEY, LOKI_CORS_ORIGINS="*")
    engine.push(text_reply("ok"), text_reply("ok"))
    assert _run_page(browser, app_page.serve(star.url)) == ("200 ok", "done")


def test_without_cors_origins_the_browser_is_refused(
    browser,
    gateway_factory,
    peers,
    app_page,
):
    gw = gateway_factory(key=KEY)
    out, _ = _run_page(browser, app_page.serve(gw.url))
    assert out.startswith("failed: TypeError")  # the browser blocked it: no CORS answer


PREFLIGHT = {
    "Origin": "http://localhost:5173",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_preflight_is_answered_before_the_key_check(gateway_factory, peers, engine):
    gw = gateway_factory(key=KEY, LOKI_CORS_ORIGINS="http://localhost:5173")
    r = httpx.options(gw.url + "/v1/chat/completions", headers=PREFLIGHT, timeout=10)
    assert r.status_code == 200  # no key on a preflight, and none needed
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    # the real request still needs the key; both answers carry the origin
    body = {"messages": [{"role": "user", "content": "hi"}]}
    origin = {"Origin": "http://localhost:5173"}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=origin, timeout=10)
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    engine.push(text_reply("ok"))
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={**origin, "Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    # an origin not listed gets no CORS answer
    other = {**PREFLIGHT, "Origin": "http://evil.example"}
    r = httpx.options(gw.url + "/v1/chat/completions", headers=other, timeout=10)
    assert "access-control-allow-origin" not in r.headers


def test_cors_unset_answers_no_cors_header(gateway_factory, peers):
    gw = gateway_factory(key=KEY)
    r = httpx.options(gw.url + "/v1/chat/completions", headers=PREFLIGHT, timeout=10)
    assert r.status_code == 401  # as before: no CORS, the key check answers
    assert not any(h.startswith("access-control-") for h in r.headers)
