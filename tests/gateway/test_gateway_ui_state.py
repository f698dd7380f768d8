"""The web UI shows what is going on, in headless Debian chromium (issue 17, items 3 and 4).

A message sent while a reply runs shows at once, marked queued, below the running reply, and
becomes the ordinary user bubble when its turn starts. The header title, the context gauge
and the engine pill tell the truth during a first reply and after a reload; Compact says when
it runs and what it did (including "nothing to compact").
"""

from __future__ import annotations

import pytest

from .conftest import ARTIFACTS

HELLO = ["Hello", ", ", "wörld", " 🌍", "!"]


def _restore(peers):
    peers.reply_pieces = list(HELLO)
    peers.delay_s = 0.01
    peers.state_n_ctx = 4096
    peers.engine_url = ""
    peers.compact_reply = (True, "compact")
    peers.compact_delay_s = 0.0


def _gauge_used(page) -> int:
    return int(page.inner_text("#gauge-text").split("/")[0].strip())


def test_a_message_sent_during_a_reply_shows_queued_at_once(browser, gateway, peers):
    peers.reply_pieces = [f"piece{i} " for i in range(50)]
    peers.delay_s = 0.06  # about 3 s
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.fill("#input", "first question")
        page.press("#input", "Enter")
        page.wait_for_selector("#stop-btn", state="visible")
        page.wait_for_selector(".msg.assistant")
        page.fill("#input", "second question")
        page.press("#input", "Enter")
        # at once: the box is empty and the message shows, pending then marked queued
        page.wait_for_selector(".msg.user.pending", timeout=1000)
        assert page.input_value("#input") == ""
        page.wait_for_selector(".msg.user.pending.queued", timeout=2000)
        assert page.inner_text(".msg.user.pending .text") == "second question"
        assert page.is_visible("#stop-btn")  # the first reply still runs
        # below the running reply, which goes on growing above it
        reply = page.locator(".msg.assistant").first
        queued = page.locator(".msg.user.pending")
        assert queued.bounding_box()["y"] > reply.bounding_box()["y"]
        length = len(reply.inner_text())
        page.wait_for_function(
            f"document.querySelector('.msg.assistant').textContent.length > {length + 10}"
        )
        assert page.locator(".msg.user.pending").count() == 1
        page.screenshot(path=str(ARTIFACTS / "ui-queued.png"))
        # its turn starts: the queued bubble becomes the ordinary one, after the first reply
        page.wait_for_function("document.querySelectorAll('.msg.user:not(.pending)').length == 2")
        assert page.locator(".msg.user.pending").count() == 0
        order = page.eval_on_selector_all(
            "#messages > *", "els => els.map(e => e.className + ':' + e.textContent.slice(0, 15))"
        )
        users = [i for i, o in enumerate(order) if o.startswith("msg user")]
        badges = [i for i, o in enumerate(order) if o.startswith("badge")]
        assert users[0] < badges[0] < users[1], order
        page.wait_for_function("document.querySelectorAll('.badge').length == 2", timeout=30000)
        assert errors == []
    finally:
        _restore(peers)
        page.close()


@pytest.mark.parametrize("size", [(390, 844), (1280, 800)], ids=["phone", "desktop"])
def test_a_queued_message_is_cancelled_from_its_bubble(browser, gateway, peers, size):
    """Cancel on the queued bubble drops it (it never becomes a turn); a message whose turn
    started is not cancelled and the page says so."""
    peers.reply_pieces = [f"piece{i} " for i in range(80)]
    peers.delay_s = 0.05  # about 4 s: the queue waits through a reload
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.fill("#input", "first question")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant")
        for text in ("keep me", "drop me"):
            page.fill("#input", text)
            page.press("#input", "Enter")
        page.wait_for_function("document.querySelectorAll('.msg.user.queued').length == 2")
        # a reload while they wait: drawn again from the conversation's state, in order
        page.reload()
        page.wait_for_function("document.querySelectorAll('.msg.user.queued').length == 2")
        queued = page.eval_on_selector_all(
            ".msg.user.queued .text", "els => els.map(e => e.textContent)"
        )
        assert queued == ["keep me", "drop me"]
        drop = page.locator(".msg.user.queued", has_text="drop me")
        button = drop.locator("button.cancel-queued")
        box = button.bounding_box()
        assert box and box["x"] + box["width"] <= size[0] and box["height"] >= 20
        page.screenshot(path=str(ARTIFACTS / f"ui-queued-cancel-{size[0]}.png"))
        button.click()
        page.wait_for_function("document.querySelectorAll('.msg.user.queued').length == 1")
        assert "cancelled" in page.inner_text("#notice").lower()
        # the first reply and the kept message run; the cancelled one never shows as a turn
        page.wait_for_function("document.querySelectorAll('.badge').length == 2", timeout=30000)
        users = page.eval_on_selector_all(".msg.user", "els => els.map(e => e.textContent)")
        assert users == ["first question", "keep me"], users
        cid = page.eval_on_selector("#messages", "el => el.dataset.conversation")
        sent = [m.content for m in peers.convs[cid].messages if m.role == "user"]
        assert sent == ["first question", "keep me"]
        # the API refuses to cancel a message whose turn started: nothing changes
        with gateway.client() as http:
            r = http.post(
                "/api/chat/cancel_queued", json={"conversation": cid, "content": "keep me"}
            )
            assert r.status_code == 200 and r.json()["ok"] is False
            assert "already started" in r.json()["detail"]
            r = http.post("/api/chat/cancel_queued", json={"conversation": cid, "content": ""})
            assert r.status_code in (400, 422) and "error" in r.json()
        assert errors == []
    finally:
        _restore(peers)
        page.close()


def test_title_gauge_and_engine_show_the_truth_during_a_first_reply(browser, gateway, peers):
    peers.reply_pieces = [f"tok{i} " for i in range(60)]
    peers.delay_s = 0.06
    peers.state_n_ctx = None  # the chat service does not know the window before a first turn
    peers.engine_url = "http://127.0.0.1:9"  # the supervisor says "ready"
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.wait_for_selector("#engine-state.ready")
        page.fill("#input", "Plan a trip to Oslo\nwith details")
        page.press("#input", "Enter")
        page.wait_for_selector("#stop-btn", state="visible")
        page.wait_for_function("document.getElementById('conv-title').textContent !== 'New chat'")
        assert page.inner_text("#conv-title") == "Plan a trip to Oslo"
        # the engine pill says it generates
        page.wait_for_selector("#engine-state.generating")
        assert page.inner_text("#engine-state").startswith("Engine: Generating")
        # the gauge knows the window (the engine's n_ctx) and moves while the reply streams
        page.wait_for_function("document.querySelector('.msg.assistant')")
        text = page.inner_text("#gauge-text")
        assert "?" not in text and "/ 4096" in text, text
        first = _gauge_used(page)
        page.wait_for_function(
            f"parseInt(document.getElementById('gauge-text').textContent) > {first + 5}"
        )
        # a reload in the middle of the reply keeps the title
        page.reload()
        page.wait_for_selector(".msg.assistant")
        page.wait_for_function("document.getElementById('conv-title').textContent !== 'New chat'")
        assert page.inner_text("#conv-title") == "Plan a trip to Oslo"
        page.wait_for_selector(".badge", timeout=30000)
        # the turn over: the pill is back to ready
        page.wait_for_selector("#engine-state.ready")
        assert errors == []
    finally:
        _restore(peers)
        page.close()


def test_compact_shows_that_it_runs_and_what_it_did(browser, gateway, peers):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.fill("#input", "something to compact")
        page.press("#input", "Enter")
        page.wait_for_selector(".badge", timeout=30000)

        peers.compact_reply = (False, "nothing compacted")
        peers.compact_delay_s = 1.5
        page.click("#compact-btn")
        # busy while it runs
        page.wait_for_selector("#compact-btn[disabled]", timeout=1000)
        assert page.inner_text("#compact-btn") == "Compacting…"
        assert page.is_visible("#notice") and "Compacting" in page.inner_text("#notice")
        # then says what it did, and the button is back
        page.wait_for_function("!document.getElementById('compact-btn').disabled", timeout=10000)
        assert page.inner_text("#compact-btn") == "Compact"
        assert page.inner_text("#notice") == "Nothing to compact (nothing compacted)"

        peers.compact_reply = (True, "compacted")
        peers.compact_delay_s = 0.0
        page.click("#compact-btn")
        page.wait_for_function("document.getElementById('notice').textContent === 'Compacted'")
        page.wait_for_selector(".marker.compaction")
        assert errors == []
    finally:
        _restore(peers)
        page.close()


def test_memory_lock_controls(browser, gateway_factory, redis_url, peers):
    import redis

    db_url = redis_url.rsplit("/", 1)[0] + "/7"  # a database of its own: the passphrase stays here
    redis.Redis.from_url(db_url).flushdb()
    gw = gateway_factory(LOKI_REDIS_URL=db_url)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gw.url + "/")
        page.wait_for_selector("#memory-state.memory-off")
        assert page.inner_text("#memory-btn") == "Set passphrase"
        # the first unlock sets the passphrase
        page.click("#memory-btn")
        page.wait_for_selector("#memory-dialog[open]")
        page.fill("#memory-pass", "correct horse")
        page.click("#memory-ok")
        page.wait_for_selector("#memory-state.memory-unlocked", timeout=30000)
        assert not page.is_visible("#memory-dialog")
        assert page.inner_text("#memory-btn") == "Lock"
        # lock
        page.click("#memory-btn")
        page.wait_for_selector("#memory-state.memory-locked")
        assert page.inner_text("#memory-btn") == "Unlock"
        # a wrong passphrase: the server's message, the dialog stays, still locked
        page.click("#memory-btn")
        page.fill("#memory-pass", "wrong one")
        page.click("#memory-ok")
        page.wait_for_selector("#memory-error:not([hidden])", timeout=30000)
        assert "passphrase" in page.inner_text("#memory-error").lower()
        assert page.is_visible("#memory-dialog")
        assert page.get_attribute("#memory-state", "class").endswith("memory-locked")
        # the right one unlocks
        page.fill("#memory-pass", "correct horse")
        page.press("#memory-pass", "Enter")
        page.wait_for_selector("#memory-state.memory-unlocked", timeout=30000)
        with gw.client() as c:
            assert c.get("/api/memory").json() == {"state": "unlocked"}
        assert errors == []
    finally:
        page.close()
        gw.proc.stop()
        redis.Redis.from_url(db_url).flushdb()


def test_favicon_is_served_without_a_key(gateway_factory):
    import httpx

    gw = gateway_factory(key="fav-key")
    try:
        r = httpx.get(gw.url + "/favicon.ico", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert r.content.startswith(b"<svg")
        page = httpx.get(gw.url + "/", timeout=10).text
        assert 'rel="icon" href="/static/favicon.svg"' in page
    finally:
        gw.proc.stop()
