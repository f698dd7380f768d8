"""Attachments in the web UI, in real headless Chromium against the real gateway (real Redis)
and the fake chat peers: the attach button, a file dropped on the chat, an image pasted in the
composer; thumbnails in the sent message, an inlined text file as a chip with its name (its
text folded under it, never the raw fenced block); the marker of an image the store no longer
has; the inline errors for 413 (too large), 415 (type not accepted) and a model without vision.
At 1280×800 and at 390×844 (a phone), with screenshots under ``tests/artifacts/``."""

from __future__ import annotations

import base64
import time

import pytest

from tests.fakes.media import png

from .conftest import ARTIFACTS

PNG_B64 = base64.b64encode(png()).decode()

DROP_JS = """([name, text]) => {
  const dt = new DataTransfer();
  dt.items.add(new File([text], name, {type: "text/plain"}));
  const zone = document.querySelector("main");
  zone.dispatchEvent(new DragEvent("dragover", {dataTransfer: dt, bubbles: true, cancelable: true}));
  zone.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
}"""

PASTE_JS = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], "pasted.png", {type: "image/png"}));
  const ev = new ClipboardEvent("paste", {clipboardData: dt, bubbles: true, cancelable: true});
  document.getElementById("input").dispatchEvent(ev);
}"""


@pytest.fixture(scope="module")
def small_gateway(gateway_factory, peers):
    """A gateway whose upload limit is 0.05 MB (the 413 path with a small file)."""
    return gateway_factory(LOKI_UPLOAD_MAX_MB="0.05")


def _wait(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_attach_drop_paste_thumbnails_and_errors(browser, small_gateway, peers, width, height):
    peers.reply_pieces = ["Seen."]
    peers.reasoning_pieces = []
    peers.delay_s = 0.0
    peers.supervisor.vision = True
    errors: list[str] = []
    page = browser.new_page(viewport={"width": width, "height": height})
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(small_gateway.url + "/")
        assert page.is_visible("#attach-btn")
        box = page.locator("#attach-btn").bounding_box()
        assert box and box["x"] + box["width"] <= width  # reachable on a phone too
        # the attach button (its file input), a dropped text file, a pasted image
        page.set_input_files(
            "#attach-input", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png()}]
        )
        page.wait_for_selector(".attach-chip.image img")
        page.evaluate(DROP_JS, ["notes.txt", "line one\nline two\n"])
        page.wait_for_selector(".attach-chip.text")
        page.evaluate(PASTE_JS, PNG_B64)
        page.wait_for_function("document.querySelectorAll('.attach-chip').length === 3")
        names = page.eval_on_selector_all(
            ".attach-chip .name", "els => els.map(e => e.textContent)"
        )
        assert names == ["red.png", "notes.txt", "pasted.png"]
        for chip in page.locator(".attach-chip").all():
            b = chip.bounding_box()
            assert b and b["x"] + b["width"] <= width + 1
        # the 415 and 413 paths: said inline, nothing added to the tray
        page.set_input_files(
            "#attach-input",
            files=[{"name": "tool.bin", "mimeType": "image/png", "buffer": b"\x00\x01\x02" * 50}],
        )
        page.wait_for_selector("#attach-error:not([hidden])")
        assert "tool.bin cannot be attached (type not accepted)" in page.inner_text("#attach-error")
        page.set_input_files(
            "#attach-input",
            files=[{"name": "big.txt", "mimeType": "text/plain", "buffer": b"a" * 80_000}],
        )
        page.wait_for_function(
            "document.getElementById('attach-error').textContent.includes('big.txt is too large')"
        )
        assert "LOKI_UPLOAD_MAX_MB" in page.inner_text("#attach-error")
        assert page.locator(".attach-chip").count() == 3
        # send: the images go as ids, the text file inlined; thumbnails in the message
        before = len(peers.sends)
        page.fill("#input", "What is in these?")
        page.press("#input", "Enter")
        _wait(lambda: len(peers.sends) > before)
        sent = peers.sends[-1]
        assert [i.name for i in sent.images] == ["red.png", "pasted.png"]
        assert "notes.txt" in sent.content and "line two" in sent.content
        page.wait_for_function(
            "[...document.querySelectorAll('.msg.user .thumb img')]"
            ".filter(i => i.complete && i.naturalWidth > 0).length === 2"
        )
        for thumb in page.locator(".msg.user .thumb img").all():
            b = thumb.bounding_box()
            assert b and b["width"] >= 48 and b["height"] >= 48  # a thumbnail, not a dot
        # the inlined text file: a chip with its name, its text folded, no fence in the bubble
        bubble = page.locator(".msg.user", has_text="What is in these?").last
        chip = bubble.locator("details.attached-file > summary.file-chip")
        assert chip.count() == 1
        assert chip.inner_text().split() == ["notes.txt", "2", "lines"]
        said = bubble.evaluate("b => b.firstChild.textContent")
        assert said == "What is in these?" and "Attached file" not in bubble.inner_text()
        assert "```" not in bubble.inner_text() and not bubble.locator("pre").is_visible()
        b = chip.bounding_box()
        assert b and b["x"] + b["width"] <= width + 1
        chip.click()
        assert bubble.locator("details.attached-file pre").text_content() == "line one\nline two\n"
        assert page.locator(".attach-chip").count() == 0 and page.is_hidden("#attach-tray")
        assert page.is_hidden("#attach-error")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / f"gateway-attach-{width}.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 5_000

        # the model loses its vision after the image was attached (a preset switched): the
        # send is refused inline, the image stays attached (refused at attach time once the
        # page knows: test_gateway_ui_daily.py)
        page.set_input_files(
            "#attach-input", files=[{"name": "blue.png", "mimeType": "image/png", "buffer": png()}]
        )
        page.wait_for_selector(".attach-chip.image")
        peers.supervisor.vision = False
        page.wait_for_function("window.LokiApi.engine().vision === false", timeout=5000)
        before = len(peers.sends)
        page.fill("#input", "And this one?")
        page.press("#input", "Enter")
        page.wait_for_function(
            "document.getElementById('attach-error').textContent.includes('cannot see images')"
        )
        assert "Not sent" in page.inner_text("#attach-error")
        assert page.locator(".attach-chip.image").count() == 1
        assert page.input_value("#input") == "And this one?"
        assert len(peers.sends) == before

        # an image the store no longer has: a marker in place of its thumbnail
        conv = peers.new_conv("old images")
        cid = conv.info.id
        meta = {"event": "user", "images": [{"id": "0" * 32, "name": "old.png"}]}
        peers.call(peers.emit(cid, {"role": "user", "content": "an old one"}, loki=meta))
        page.goto(small_gateway.url + f"/?open=1#c={cid}")  # a new document: read the hash
        page.wait_for_selector(".thumb.gone")
        assert page.inner_text(".thumb.gone") == "[image old.png: not kept]"
        assert errors == []
    finally:
        peers.supervisor.vision = False
        page.close()
