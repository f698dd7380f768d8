"""The web UI in real headless Chromium (Debian's ``chromium``, driven by Playwright through
its executable path; no browser is downloaded), against the gateway and fake chat peers.

Sends a message and watches it stream, reloads the page in the middle of the reply and sees
it continue, switches conversations, checks reasoning folding, tool results folding, the
compaction marker and the prefill badge, and saves a screenshot under ``tests/artifacts/``.
"""

from __future__ import annotations

from .conftest import ARTIFACTS


def _text(page, selector):
    return page.eval_on_selector_all(selector, "els => els.map(e => e.textContent).join('')")


def test_chat_page_streams_survives_reload_and_switches(browser, gateway, peers):
    pieces = [f"word{i} " for i in range(60)]
    full = "".join(pieces)
    peers.reply_pieces = pieces
    peers.reasoning_pieces = ["thinking ", "hard"]
    peers.delay_s = 0.08
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.fill("#input", "Hello **Loki**")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.user")
        assert page.inner_text(".msg.user") == "Hello **Loki**"  # user text is not markdown
        # the reply streams: it grows while we watch
        page.wait_for_function(
            "document.querySelector('.msg.assistant') && "
            "document.querySelector('.msg.assistant').textContent.length > 10"
        )
        first = _text(page, ".msg.assistant")
        page.wait_for_function(
            f"document.querySelector('.msg.assistant').textContent.length > {len(first) + 10}"
        )
        assert page.is_visible("#stop-btn")
        # reasoning sits folded in its own bubble
        assert page.eval_on_selector("details.reasoning", "d => d.open") is False
        assert "thinking hard" in _text(page, "details.reasoning .body")
        cid = page.evaluate("window.lokiDebug.conversation")
        assert cid and peers.convs[cid].generating
        # reload in the middle of the reply: it continues, nothing lost or doubled
        page.reload()
        page.wait_for_selector(".badge", timeout=30000)
        assert _text(page, ".msg.assistant").strip() == full.strip()
        assert _text(page, ".msg.user") == "Hello **Loki**"
        assert page.inner_text(".badge").startswith("prefill 12 new / 28 cached")
        assert not page.is_visible("#stop-btn")
        # the gauge is corrected by the state read after the turn end
        page.wait_for_function(
            "document.querySelector('#gauge-text').textContent.includes('45 / 4096')",
            timeout=5000,
        )

        # a second conversation with a tool call, a long tool result and a compaction
        other = peers.new_conv("tools demo")
        oid = other.info.id
        for delta, extra in [
            ({"role": "user", "content": "use a tool"}, {}),
            ({"role": "assistant"}, {"loki": {"event": "turn_start"}}),
            (
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "recall", "arguments": '{"id":'},
                        }
                    ]
                },
                {},
            ),
            ({"tool_calls": [{"index": 0, "function": {"arguments": ' "r1"}'}}]}, {}),
            ({"role": "tool", "tool_call_id": "c1", "name": "recall", "content": "L" * 2000}, {}),
            ({"content": "Here is **bold** and `code`."}, {}),
            (
                {},
                {
                    "finish_reason": "stop",
                    "timings": {"prompt_n": 3, "cache_n": 7},
                    # the lease's template probe said stable_prefix false (issue 16)
                    "loki": {"event": "turn_end", "prefix_unstable": True},
                },
            ),
            ({}, {"loki": {"event": "compaction", "tokens_before": 900, "tokens_after": 300}}),
        ]:
            peers.call(peers.emit(oid, delta, **extra))
        page.click("#new-chat")  # refreshes the list, opens an empty conversation
        page.wait_for_selector(f"#conversations li[data-id='{oid}']")
        page.click(f"#conversations li[data-id='{oid}'] .title")
        page.wait_for_selector(".marker.compaction")
        assert "900 → 300" in page.inner_text(".marker.compaction")
        assert "recall" in page.inner_text("details.tool summary")
        assert '{"id": "r1"}' in _text(page, "details.tool pre")
        result = page.locator(".msg.tool pre").last
        assert len(result.inner_text()) < 700  # folded
        page.click(".msg.tool .more")
        assert len(result.inner_text()) == 2000
        assert page.inner_html(".msg.assistant").count("<strong>bold</strong>") == 1
        assert "<code>code</code>" in page.inner_html(".msg.assistant")
        badge = "prefill 3 new / 7 cached · template re-renders the prefix"
        assert page.inner_text(".badge") == badge
        # and back to the first one, replayed whole
        page.click(f"#conversations li[data-id='{cid}'] .title")
        page.wait_for_selector(".badge")
        page.wait_for_function(
            f"document.querySelector('.msg.assistant') && "
            f"document.querySelector('.msg.assistant').textContent.trim().length == "
            f"{len(full.strip())}"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "gateway-chat.png"), full_page=False)
        assert (ARTIFACTS / "gateway-chat.png").stat().st_size > 10_000
        assert errors == []
    finally:
        page.close()
        peers.reply_pieces = ["Hello", ", ", "wörld", " 🌍", "!"]
        peers.reasoning_pieces = []
        peers.delay_s = 0.01


def test_key_prompt_when_the_gateway_needs_one(browser, gateway_factory, peers):
    gw = gateway_factory(key="ui-key-123")
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    page.on("pageerror", lambda e: console.append(str(e)))
    try:
        page.goto(gw.url + "/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "ui-key-123")
        page.click("#key-dialog button")
        page.wait_for_function("!document.getElementById('key-dialog').open")
        assert page.evaluate("localStorage.getItem('lokiKey')") == "ui-key-123"
        page.fill("#input", "with a key")
        page.press("#input", "Enter")
        try:
            page.wait_for_selector(".badge", timeout=60000)
        except Exception as exc:
            raise AssertionError(
                f"no reply: {console} {page.inner_html('#messages')[:500]}"
                f" conv={page.evaluate('window.lokiDebug.conversation')}"
                f"\n{gw.logs()[-2000:]}"
            ) from exc
    finally:
        page.close()
