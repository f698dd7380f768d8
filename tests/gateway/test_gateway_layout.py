"""The web UI's layout at phone and desktop sizes, in headless Debian chromium (issue 17, item 1).

Asserted on element boxes, always: nothing scrolls sideways, the sidebar is a drawer on a
phone (off-screen until the menu button opens it) and a column on a desktop, the header's
actions sit in a menu on a phone and in the header on a desktop, and Send stays inside the
window, beside Stop, while a reply streams. Screenshots of each size are saved under
``tests/artifacts/`` for a person to compare once.
"""

from __future__ import annotations

import pytest

from .conftest import ARTIFACTS

PHONE = {"width": 390, "height": 844}
SMALL_PHONE = {"width": 360, "height": 740}
DESKTOP = {"width": 1280, "height": 800}


def _box(page, selector):
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} has no box"
    return box


def _inside(page, selector, viewport):
    """The element is visible and its whole box lies inside the window."""
    assert page.is_visible(selector), f"{selector} not visible"
    b = _box(page, selector)
    assert b["x"] >= 0 and b["y"] >= 0, (selector, b)
    assert b["x"] + b["width"] <= viewport["width"] + 0.5, (selector, b)
    assert b["y"] + b["height"] <= viewport["height"] + 0.5, (selector, b)
    return b


def _no_sideways_scroll(page, viewport):
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"page is {width} px wide in a {viewport['width']} px window"


def _start_slow_reply(page, peers):
    """Sends a message whose reply streams for a few seconds; returns when Stop shows."""
    peers.reply_pieces = [f"piece{i} " for i in range(80)]
    peers.delay_s = 0.1
    page.fill("#input", "a long answer please")
    page.press("#input", "Enter")
    page.wait_for_selector("#stop-btn", state="visible")
    page.wait_for_selector(".msg.assistant")


def _finish(page, peers):
    page.wait_for_selector(".badge", timeout=30000)
    peers.reply_pieces = ["Hello", ", ", "wörld", " 🌍", "!"]
    peers.delay_s = 0.01


@pytest.mark.parametrize("viewport", [PHONE, SMALL_PHONE], ids=["390x844", "360x740"])
def test_phone_layout(browser, gateway, peers, viewport):
    errors: list[str] = []
    page = browser.new_page(viewport=viewport, device_scale_factor=2, is_mobile=True)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.wait_for_function("document.getElementById('engine-state').className !== 'pill'")
        _no_sideways_scroll(page, viewport)
        # the sidebar is a closed drawer: off-screen, not visible; the message column is wide
        assert not page.is_visible("#sidebar")
        assert _box(page, "#sidebar")["x"] + _box(page, "#sidebar")["width"] <= 0
        assert _box(page, "#messages")["width"] >= viewport["width"] - 1
        assert _inside(page, "#input", viewport)["width"] >= viewport["width"] * 0.5
        _inside(page, "#send-btn", viewport)
        # header: menu button, title, gauge and the actions button, all inside; actions hidden
        for sel in ("#menu-btn", "#conv-title", "#gauge-text", "#actions-btn"):
            _inside(page, sel, viewport)
        assert _box(page, "#conv-title")["width"] >= 60
        assert not page.is_visible("#compact-btn")

        # the actions menu opens inside the window, and closes on a click elsewhere
        page.click("#actions-btn")
        for sel in ("#compact-btn", "#reset-btn", "#export-btn"):
            b = _inside(page, sel, viewport)
            assert b["height"] >= 36, (sel, b)  # a finger-sized target
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"ui-phone-{viewport['width']}-menu.png"))
        page.click("#messages")
        page.wait_for_selector("#compact-btn", state="hidden")

        # the drawer opens over the page, inside the window, and closes on the scrim
        page.click("#menu-btn")
        page.wait_for_function(
            "getComputedStyle(document.getElementById('sidebar')).transform === 'none'"
        )
        sidebar = _inside(page, "#sidebar", viewport)
        assert sidebar["x"] == 0 and sidebar["width"] <= viewport["width"] * 0.9
        _inside(page, "#new-chat", viewport)
        _inside(page, "#preset-picker", viewport)
        page.screenshot(path=str(ARTIFACTS / f"ui-phone-{viewport['width']}-drawer.png"))
        page.mouse.click(viewport["width"] - 10, viewport["height"] // 2)  # the scrim
        page.wait_for_selector("#sidebar", state="hidden")
        _no_sideways_scroll(page, viewport)

        # while a reply streams, Stop and Send both sit inside the window, the box keeps room
        _start_slow_reply(page, peers)
        stop = _inside(page, "#stop-btn", viewport)
        send = _inside(page, "#send-btn", viewport)
        box = _inside(page, "#input", viewport)
        assert stop["x"] + stop["width"] <= send["x"]
        assert box["x"] + box["width"] <= stop["x"]
        assert box["width"] >= 150 and box["height"] >= 40
        _no_sideways_scroll(page, viewport)
        user = _inside(page, ".msg.user", viewport)
        assert user["width"] >= viewport["width"] * 0.6
        page.screenshot(path=str(ARTIFACTS / f"ui-phone-{viewport['width']}-streaming.png"))
        # a conversation picked in the drawer closes it
        page.click("#menu-btn")
        page.wait_for_selector("#conversations li.active")
        page.click("#conversations li.active .title")
        page.wait_for_selector("#sidebar", state="hidden")
        _finish(page, peers)
        _no_sideways_scroll(page, viewport)
        assert errors == []
    finally:
        peers.reply_pieces = ["Hello", ", ", "wörld", " 🌍", "!"]
        peers.delay_s = 0.01
        page.close()


def test_desktop_layout(browser, gateway, peers):
    viewport = DESKTOP
    errors: list[str] = []
    page = browser.new_page(viewport=viewport)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.wait_for_function("document.getElementById('engine-state').className !== 'pill'")
        _no_sideways_scroll(page, viewport)
        # the sidebar is a column on the left, always shown; no menu buttons
        sidebar = _inside(page, "#sidebar", viewport)
        assert sidebar["x"] == 0 and sidebar["width"] == 260
        assert sidebar["height"] == viewport["height"]
        assert not page.is_visible("#menu-btn")
        assert not page.is_visible("#actions-btn")
        # the actions sit in the header, right of the title
        header = _box(page, "header")
        title = _box(page, "#conv-title")
        for sel in ("#compact-btn", "#reset-btn", "#export-btn"):
            b = _inside(page, sel, viewport)
            assert b["y"] >= header["y"] and b["y"] + b["height"] <= header["y"] + header["height"]
            assert b["x"] > title["x"] + title["width"]
        messages = _box(page, "#messages")
        assert messages["x"] == 260 and messages["width"] == viewport["width"] - 260

        _start_slow_reply(page, peers)
        stop = _inside(page, "#stop-btn", viewport)
        send = _inside(page, "#send-btn", viewport)
        box = _inside(page, "#input", viewport)
        assert box["x"] + box["width"] <= stop["x"] < send["x"]
        assert box["width"] >= 500
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-desktop-1280-streaming.png"))
        _finish(page, peers)
        _no_sideways_scroll(page, viewport)
        assert errors == []
    finally:
        peers.reply_pieces = ["Hello", ", ", "wörld", " 🌍", "!"]
        peers.delay_s = 0.01
        page.close()
