"""Issue 19: a sub-agent's transcript in the web UI (headless Debian chromium, fake peers).

The chat service puts a sub-agent's events in the main log as ``loki.event == "subagent"``
with the tool call's id and the inner event (``tests/chat/test_chat_subagent.py`` checks that
shape against the service). The page draws them as a collapsible block nested under the tool
call, never in the main answer, live and again after a reload; the verifier's verdict is a
marker.
"""

from __future__ import annotations

import json

from .conftest import ARTIFACTS

CALL = {
    "index": 0,
    "id": "c1",
    "type": "function",
    "function": {"name": "subagent", "arguments": json.dumps({"task": "Find the colour"})},
}


def nested(inner: dict) -> tuple[dict, dict]:
    return {}, {"loki": {"event": "subagent", "tool_call_id": "c1", "inner": inner}}


TURN = [
    ({"tool_calls": [CALL]}, {}),
    nested({"delta": {"role": "user", "content": "Find the colour"}, "loki": {"event": "user"}}),
    nested({"delta": {"role": "assistant", "content": "The sky "}}),
    nested({"delta": {"content": "is blue."}}),
    nested({"delta": {}, "finish_reason": "stop", "loki": {"event": "turn_end", "steps": 1}}),
    (
        {"role": "tool", "tool_call_id": "c1", "name": "subagent", "content": "The sky is blue."},
        {"loki": {"event": "tool_result"}},
    ),
    ({}, {"loki": {"event": "verify", "verdict": "fail", "reason": "too short"}}),
]


def _check_block(page) -> None:
    block = page.locator("details.subagent[data-subagent-of='c1']")
    assert block.count() == 1
    # right under its call's bubble
    assert page.locator("[data-call-id='c1'] + details.subagent").count() == 1
    assert block.evaluate("d => d.open") is False  # collapsed until asked
    assert "done (1 step)" in block.locator("summary").inner_text()
    block.locator("summary").click()
    assert block.evaluate("d => d.open") is True
    body = block.locator(".body").inner_text()
    assert "Task: Find the colour" in body and "The sky is blue." in body
    # nothing of the sub-agent in the main answer
    answers = page.eval_on_selector_all(".msg.assistant", "els => els.map(e => e.textContent)")
    assert "".join(answers).strip() == "Sure: it is blue."
    assert "fail, correcting (too short)" in page.inner_text(".marker.verify.fail")


def test_a_subagent_transcript_nests_under_its_call_live_and_after_reload(browser, gateway, peers):
    peers.turn_events = TURN
    peers.reply_pieces = ["Sure: ", "it is blue."]
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        page.fill("#input", "What colour is the sky? Ask a sub-agent.")
        page.press("#input", "Enter")
        page.wait_for_selector(".badge", timeout=30000)
        _check_block(page)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-subagent.png"))
        page.reload()  # replayed from the log: drawn the same way
        page.wait_for_selector(".badge", timeout=30000)
        _check_block(page)
        assert errors == []
    finally:
        peers.turn_events = []
        peers.reply_pieces = ["Hello", ", ", "wörld", " 🌍", "!"]
        page.close()
