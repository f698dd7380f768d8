"""The preset editor and the engine's failure box, in headless Debian chromium at phone size
(issue 17, item 5).

The gateway talks to the fake peers, whose presets store validates with the supervisor's own
rules (``loki_supervisor.presets.validate``): a bad value is refused with the server's message
shown in the dialog, which stays open; fixed, the preset is saved, listed, switched to and
deleted; an external preset's key is never shown back and its connection test shows the
API's message. A failed engine shows its detail, llama-server's last lines and when it is
retried, and Retry switches to the preset again.
"""

from __future__ import annotations

from .conftest import ARTIFACTS

PHONE = {"width": 390, "height": 844}


def _no_sideways_scroll(page):
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"page is {width} px wide in a {PHONE['width']} px window"
    box = page.locator("#presets-dialog").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, box
    over = page.eval_on_selector("#presets-dialog", "d => d.scrollWidth - d.clientWidth")
    assert over <= 0, f"the dialog scrolls sideways by {over} px"


def _row(page, name):
    return page.locator("#presets-list li", has_text=name)


def _restore(peers):
    peers.presets = {k: v for k, v in peers.presets.items() if k == "env"}
    peers.active_preset = "env"
    peers.engine_failure = None
    peers.switches.clear()


def test_preset_editor_creates_fixes_switches_and_deletes(browser, gateway, peers):
    page = browser.new_page(viewport=PHONE)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    dialogs: list[str] = []  # a browser pop-up (never: Loki asks in its own dialog)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(gateway.url + "/")
        page.click("#menu-btn")
        page.click("#presets-btn")
        page.wait_for_selector("#presets-list li[data-id=env]")
        assert "active" in _row(page, "env").inner_text()

        # a local preset with a CTX the supervisor refuses: its message, the dialog open
        page.click("#preset-new-local")
        page.fill("#preset-form [name=id]", "small")
        page.fill("#preset-form [name=name]", "Small box")
        page.fill("#preset-form [name=ctx]", "100")
        page.fill("#preset-form [name='f.CACHE_RAM']", "auto")
        page.fill("#preset-form [name=sampling]", '{"temperature": 0.5}')
        page.click("#preset-save")
        page.wait_for_selector("#preset-error:not([hidden])")
        assert page.inner_text("#preset-error") == "CTX must be at least 256 tokens"
        assert page.is_visible("#preset-form")
        assert "small" not in peers.presets
        _no_sideways_scroll(page)
        page.screenshot(path=str(ARTIFACTS / "ui-presets-error-390.png"))

        # fixed: saved with the other fields as typed, listed, the form closed
        page.fill("#preset-form [name=ctx]", "2048")
        page.click("#preset-save")
        page.wait_for_selector("#presets-list li[data-id=small]")
        assert page.is_hidden("#preset-form")
        saved = peers.presets["small"]
        assert (saved.name, saved.ctx, saved.features.get("CACHE_RAM")) == (
            "Small box",
            2048,
            "auto",
        )
        assert saved.sampling == {"temperature": 0.5}
        assert "Saved Small box" in page.inner_text("#presets-status")

        # edited: the stored values come back in the form; a change is saved
        _row(page, "Small box").get_by_role("button", name="Edit").click()
        assert page.input_value("#preset-form [name=ctx]") == "2048"
        assert page.get_attribute("#preset-form [name=id]", "readonly") is not None
        page.fill("#preset-form [name=ngl]", "lots")
        page.click("#preset-save")
        page.wait_for_selector("#preset-error:not([hidden])")
        assert "NGL" in page.inner_text("#preset-error")
        page.fill("#preset-form [name=ngl]", "12")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden")
        assert peers.presets["small"].ngl == "12"

        # switched to by id: the list and the sidebar's picker say so
        _row(page, "Small box").get_by_role("button", name="Switch").click()
        page.wait_for_function(
            "document.querySelector('#presets-list li[data-id=small]').textContent"
            ".includes('active')"
        )
        assert peers.switches == ["small"]
        page.wait_for_function("document.getElementById('preset-picker').value === 'small'")

        # an external API: the key is sent once, never shown back; the test shows the API's word
        page.click("#preset-new-external")
        assert page.is_hidden("#preset-local") and page.is_visible("#preset-external")
        page.fill("#preset-form [name=name]", "Remote")
        page.fill("#preset-form [name=base_url]", "ftp://nowhere")
        page.fill("#preset-form [name=api_model]", "m1")
        page.fill("#preset-form [name=api_key]", "sk-secret")
        peers.test_reply = {"ok": False, "status": 401, "message": "Invalid API key", "models": []}
        page.click("#preset-test")
        page.wait_for_function(
            "document.getElementById('preset-test-result').textContent.includes('Invalid API key')"
        )
        page.click("#preset-save")
        page.wait_for_selector("#preset-error:not([hidden])")
        assert "base_url" in page.inner_text("#preset-error")
        page.fill("#preset-form [name=base_url]", "http://127.0.0.1:9/v1")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden")
        remote = next(p for p in peers.presets.values() if p.name == "Remote")
        assert remote.external and remote.api_key == "sk-secret"
        _row(page, "Remote").get_by_role("button", name="Edit").click()
        assert page.input_value("#preset-form [name=api_key]") == ""
        assert "stored" in page.get_attribute("#preset-form [name=api_key]", "placeholder")
        assert "sk-secret" not in page.content()
        page.click("#preset-cancel")

        # deleted (the active one offers no Delete)
        assert _row(page, "Small box").get_by_role("button", name="Delete").count() == 0
        _row(page, "Remote").get_by_role("button", name="Delete").click()
        page.click("#ask-ok")  # "Delete the preset Remote?" in Loki's own dialog
        page.wait_for_function(
            "!document.getElementById('presets-list').textContent.includes('Remote')"
        )
        assert remote.id not in peers.presets
        _no_sideways_scroll(page)
        page.screenshot(path=str(ARTIFACTS / "ui-presets-390.png"))
        assert errors == [] and dialogs == []
    finally:
        _restore(peers)
        peers.test_reply = {"ok": True, "status": 200, "message": "", "models": []}
        page.close()


def test_a_failed_engine_shows_why_and_retries(browser, gateway, peers):
    peers.engine_failure = {
        "detail": "model file not found: /models/gone.gguf",
        "stderr_tail": ["llama_model_load: error loading model", "main: exiting"],
        "retry_in_s": 12.4,
    }
    page = browser.new_page(viewport=PHONE)
    try:
        page.goto(gateway.url + "/")
        page.click("#menu-btn")
        page.wait_for_selector("#engine-failure:not([hidden])")
        assert "gone.gguf" in page.inner_text("#engine-failure-detail")
        assert "main: exiting" in page.inner_text("#engine-failure-tail")
        assert "12 s" in page.inner_text("#engine-failure-retry")
        _no_sideways_scroll_page(page)
        page.screenshot(path=str(ARTIFACTS / "ui-engine-failed-390.png"))
        page.click("#engine-retry")
        page.wait_for_selector("#engine-failure", state="hidden")
        assert peers.switches == ["env"]
    finally:
        _restore(peers)
        page.close()


def _no_sideways_scroll_page(page):
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"page is {width} px wide"
