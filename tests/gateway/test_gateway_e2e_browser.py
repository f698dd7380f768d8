"""Issue 45 in the browser (Debian chromium): the Devices dialog pairs a phone (the QR and
the code shown once), at 1280x800 and at 390x844; the e2e PWA at 390x844, loaded through
the relay stand-in, pairs with the code, sends and streams, its offline copy then serves
every asset (no script through the relay), and the relay never sees the message."""

from __future__ import annotations

import json

import pytest

from tests.fakes.relay import Relay, frame_fields
from tests.gateway.a11y import assert_accessible, assert_targets
from tests.gateway.conftest import ARTIFACTS

WAIT_MS = 20_000
DRAWER_OPEN = "document.body.classList.contains('drawer-open')"
MESSAGE = "Phone says: the parcel is under the blue bench"


KEY = "e2e-browser-key"


@pytest.fixture(scope="module")
def gw(gateway_factory, peers):
    return gateway_factory(KEY)  # pairing needs LOKI_API_KEY


def desk_page(browser, width: int, height: int):
    """The desktop's chat page, its API key already entered (chat-api.js keeps it)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.add_init_script(f"localStorage.setItem('lokiKey', {KEY!r})")
    return page


@pytest.fixture(scope="module")
def relay(gw):
    proxy = Relay(gw.url).start()
    yield proxy
    proxy.stop()


def flip_event(path: str, frame: bytes) -> list[bytes]:
    """Every sealed event with one character of its ciphertext changed."""
    fields = frame_fields(frame)
    if "id" not in fields:
        return [frame]
    wire = json.loads(fields["data"])
    wire["ct"] = ("B" if wire["ct"][0] == "A" else "A") + wire["ct"][1:]
    return [f"id: {fields['id']}\ndata: {json.dumps(wire)}".encode()]


def _pair_in_dialog(page, name: str, phone: bool) -> str:
    if phone:
        page.click("#menu-btn")
        page.wait_for_function(DRAWER_OPEN)
    page.click("#devices-btn")
    page.wait_for_selector("#devices-dialog[open]")
    page.fill("#devices-name", name)
    page.click("#devices-form button[type=submit]")
    page.wait_for_selector("#devices-new:not([hidden]) #devices-qr svg", timeout=WAIT_MS)
    code = page.input_value("#devices-code")
    assert code.startswith("loki-e2e1:")
    page.wait_for_function(
        f"document.getElementById('devices-list').textContent.includes({name!r})",
        timeout=WAIT_MS,
    )
    assert_accessible(page, f"the Devices dialog ({'phone' if phone else 'desktop'})")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"e2e-devices-{'phone' if phone else 'desktop'}.png"))
    if phone:
        assert_targets(page, 44, "the Devices dialog on a phone")
    # shown once: closed and opened again, the code and the QR are gone
    page.click("#devices-close")
    if phone and not page.evaluate(DRAWER_OPEN):
        page.click("#menu-btn")
        page.wait_for_function(DRAWER_OPEN)
    page.click("#devices-btn")
    page.wait_for_selector("#devices-dialog[open]")
    assert page.is_hidden("#devices-new")
    assert page.input_value("#devices-code") == ""
    assert page.query_selector("#devices-qr svg") is None
    page.click("#devices-close")
    return code


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_devices_dialog_pairs_once(browser, gw, size):
    page = desk_page(browser, size[0], size[1])
    try:
        page.goto(gw.url + "/")
        page.wait_for_selector("#devices-btn", state="attached")
        _pair_in_dialog(page, f"phone {size[0]}", phone=size[0] < 600)
    finally:
        page.close()


def test_pwa_pairs_and_chats_through_the_relay(browser, gw, relay, peers):
    desk = desk_page(browser, 1280, 800)
    desk.goto(gw.url + "/")
    desk.wait_for_selector("#devices-btn")
    code = _pair_in_dialog(desk, "the phone", phone=False)
    desk.close()
    # axe-core (assert_accessible) is injected as an inline script, which the PWA's CSP
    # refuses: this context bypasses it; test_pwa_hardened_against_the_relay runs under it.
    context = browser.new_context(viewport={"width": 390, "height": 844}, bypass_csp=True)
    page = context.new_page()
    try:
        page.goto(relay.url + "/e2e/")
        page.wait_for_selector("#pair-view:not([hidden])")
        assert_accessible(page, "the PWA's pairing view")
        page.fill("#pair-code", "not a code")
        page.click("#pair-form button[type=submit]")
        page.wait_for_selector("#error:not([hidden])")
        assert "loki-e2e1:" in page.inner_text("#error")
        page.fill("#pair-code", code)
        page.click("#pair-form button[type=submit]")
        page.wait_for_selector("#chat-view:not([hidden])")
        page.fill("#composer-input", MESSAGE)
        page.click("#send-btn")
        reply = "".join(peers.reply_pieces)
        page.wait_for_function(
            "(t) => [...document.querySelectorAll('.msg.assistant')].some(m => m.textContent === t)",
            arg=reply,
            timeout=WAIT_MS,
        )
        assert page.inner_text(".msg.user") == MESSAGE
        assert page.is_hidden("#error")
        assert_accessible(page, "the PWA's chat")
        assert_targets(page, 44, "the PWA's chat")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "e2e-pwa-phone.png"))
        # the offline copy: once installed, a reload fetches no asset through the relay
        assert page.evaluate("navigator.serviceWorker.ready.then((r) => !!r.active)")
        page.wait_for_function("!!navigator.serviceWorker.controller", timeout=WAIT_MS)
        before = len(relay.requests)
        page.reload()
        page.wait_for_function(
            "(t) => [...document.querySelectorAll('.msg.assistant')].some(m => m.textContent === t)",
            arg=reply,
            timeout=WAIT_MS,
        )
        after = [r[1] for r in relay.requests[before:]]
        assert after and all(p.startswith("/api/e2e/") for p in after), after
        # the stream cut in the middle of a turn: the page resumes from its last seq
        cuts: list[str] = []

        def cut_once(path, frame):
            seq = frame_fields(frame).get("id", "")
            if seq.isdigit() and int(seq) >= 11 and not cuts:
                cuts.append(seq)
                raise ConnectionResetError("the relay cuts the stream")
            return [frame]

        relay.on_frame = cut_once
        page.fill("#composer-input", "and again")
        page.click("#send-btn")
        page.wait_for_function(
            "(t) => [...document.querySelectorAll('.msg.assistant')].filter("
            "m => m.textContent === t).length === 2",
            arg=reply,
            timeout=WAIT_MS,
        )
        assert cuts
        assert page.locator(".msg.assistant").count() == 2
        assert page.locator(".msg.user").count() == 2
        # a tampered event: the page stops and says why
        relay.on_frame = flip_event
        page.reload()
        page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
        assert "does not open" in page.inner_text("#error")
        assert_accessible(page, "the PWA showing an error")
    finally:
        relay.reset()
        context.close()
    recorded = relay.recorded()
    assert MESSAGE.encode() not in recorded and b"blue bench" not in recorded
    assert "wörld".encode() not in recorded


TWO_TAB_RUN = """async (code) => {
  const c = E2ESeal.readCode(code);
  const client = new E2EClient.Client(c.device, await E2ESeal.importKey(c.key), "");
  window.runs = Promise.allSettled(Array.from({ length: 12 }, () => client.request("state", {})));
}"""
TWO_TAB_FAILED = "window.runs.then((rs) => rs.filter((r) => r.status === 'rejected').map((r) => String(r.reason)))"


def test_pwa_hardened_against_the_relay(browser, gw, relay):
    with gw.client() as c:
        made = c.post("/api/e2e/devices", json={"name": "hardened"}).json()
    code = made["code"]
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        page.goto(relay.url + "/e2e/")
        page.wait_for_selector("#pair-view:not([hidden])")
        # a code wrapped over lines and spaced, as messengers paste it
        wrapped = "\n".join(code[i : i + 24] for i in range(0, len(code), 24))
        page.fill("#pair-code", "  " + wrapped[:30] + " " + wrapped[30:] + "\n")
        page.click("#pair-form button[type=submit]")
        page.wait_for_selector("#chat-view:not([hidden])", timeout=WAIT_MS)
        assert page.is_hidden("#error")
        # the key is a non-extractable CryptoKey in IndexedDB, never in localStorage
        assert made["key"] not in page.evaluate("JSON.stringify(localStorage)")
        assert page.evaluate(
            "E2EKeys.load().then((k) => k.extractable === false && k.algorithm.name === 'AES-GCM')"
        )
        page.wait_for_function("!!navigator.serviceWorker.controller", timeout=WAIT_MS)
        # a downgrade: the relay answers the sealed state with plain JSON (a 200)
        relay.on_body = lambda path, data: (
            b'{"conversations": []}' if path == "/api/e2e/state" else data
        )
        page.reload()
        page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
        assert "not sealed" in page.inner_text("#error")
        relay.reset()
        page.reload()
        page.wait_for_selector("#chat-view:not([hidden])", timeout=WAIT_MS)
        page.wait_for_function("!!navigator.serviceWorker.controller", timeout=WAIT_MS)
        # two tabs of one device, each sending at once: no counter collides (409)
        other = context.new_page()
        other.goto(relay.url + "/e2e/")
        other.wait_for_selector("#chat-view:not([hidden])", timeout=WAIT_MS)
        page.evaluate(TWO_TAB_RUN, code)
        other.evaluate(TWO_TAB_RUN, code)
        assert page.evaluate(TWO_TAB_FAILED) == [] and other.evaluate(TWO_TAB_FAILED) == []
        other.close()
        # the relay answers the update check with another sw.js: the page stops and says so
        # (its answer is never a 304: it drops the browser's conditional headers)
        relay.on_request = lambda m, p, h, b: (
            m,
            p,
            {k: v for k, v in h.items() if not k.lower().startswith("if-")},
            b,
        )
        relay.on_body = lambda path, data: (
            data + b"\n// the relay's own code\n" if path.endswith("/sw.js") else data
        )
        page.evaluate("navigator.serviceWorker.getRegistration().then((r) => r.update())")
        page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
        assert "changed through the network" in page.inner_text("#error")
        before = len(relay.requests)
        page.fill("#composer-input", "must not leave")
        page.click("#send-btn")
        page.wait_for_timeout(300)
        assert not any(r[1].startswith("/api/e2e/send") for r in relay.requests[before:])
    finally:
        relay.reset()
        context.close()
