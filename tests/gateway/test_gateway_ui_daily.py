"""The web UI as a daily tool (issue 41), in real headless Chromium at 1280×800 and 390×844,
against the gateway and the fake chat and supervisor peers:

1. a long conversation opens (and is switched back to) at its latest message; its earlier
   items are drawn as the view scrolls up, the view kept on what it showed;
2. every conversation is reached by Tab and opened by Enter; axe-core finds no serious or
   critical violation in any view or dialog (the main view, the phone's drawer and menu, the
   presets dialog and form, the tasks dialog, the tool servers dialog and form, the ask
   dialog, the memory and key dialogs);
3. every visible control is at least 44×44 px on the phone (24×24, WCAG's minimum, on the
   desktop);
4. no browser pop-up: rename, delete (with Undo), reset and a preset's delete ask in Loki's
   own dialog;
5. the engine pill says its state in a word and, when the model cannot use tools, one plain
   sentence, its details behind it; its colours are 4.5:1 or more; it follows the engine as
   the gateway pushes it (/api/engine/events), never polled; the preset editor's fields are
   labelled in words, the setting's name beside, one line of help each;
7. "+ New chat" opens the empty Untitled conversation there is; an image attached while the
   model has no vision is refused at once (the tracker chart and the import's name: in
   ``test_gateway_projects.py``).

Screenshots of the views under ``tests/artifacts/``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from loki_shared import subjects
from loki_shared.messages.engine import EngineState, Preset, TemplateProbe
from tests.fakes.media import png

from .a11y import assert_accessible, assert_targets, contrast
from .conftest import ARTIFACTS

SIZES = [(1280, 800), (390, 844)]
IDS = ["1280x800", "390x844"]
NO_TOOLS = "This model can't use tools: memory, recall and sub-agents are off"
DRAWER_OPEN = "document.getElementById('sidebar').getBoundingClientRect().left >= 0"


@pytest.fixture
def page_at(browser, gateway, peers) -> Iterator:
    """A page factory at a size, each page failing the test on a JavaScript error or a
    browser pop-up (alert, confirm, prompt)."""
    pages = []
    problems: list[str] = []

    def make(width: int, height: int):
        page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "dialog", lambda d: (problems.append(f"browser {d.type}: {d.message}"), d.dismiss())
        )
        pages.append(page)
        return page

    peers.supervisor.info_stopped_without_url = False  # "ready"
    yield make
    for page in pages:
        page.close()
    peers.supervisor.template = None
    peers.supervisor.vision = False
    peers.supervisor.extra_in_flight = 0
    peers.engine_failure = None
    assert problems == []


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 3_000


def _open_drawer(page) -> None:
    if page.viewport_size["width"] < 760 and not page.evaluate(
        "document.body.classList.contains('drawer-open')"
    ):
        page.click("#menu-btn")
        page.wait_for_function(DRAWER_OPEN)


def _long_conversation(peers, title: str, turns: int) -> str:
    conv = peers.new_conv(title)
    cid = conv.info.id
    for i in range(turns):
        user = {"role": "user", "content": f"question {i}"}
        peers.call(peers.emit(cid, user, loki={"event": "user"}))  # as the chat service logs it
        peers.call(peers.emit(cid, {"role": "assistant"}, loki={"event": "turn_start"}))
        answer = f"answer {i}\n\n" + "\n".join(f"- point {k} of answer {i}" for k in range(3))
        peers.call(peers.emit(cid, {"content": answer}))
        peers.call(
            peers.emit(
                cid,
                {},
                finish_reason="stop",
                timings={"prompt_n": 3, "cache_n": 9},
                loki={"event": "turn_end"},
            )
        )
    return cid


AT_BOTTOM = (
    "(() => { const m = document.getElementById('messages');"
    " return m.scrollHeight - m.scrollTop - m.clientHeight < 2; })()"
)


def _visible_in_messages(page, selector: str) -> bool:
    return page.evaluate(
        """(sel) => { const m = document.getElementById('messages').getBoundingClientRect();
        const els = Array.from(document.querySelectorAll(sel));
        const r = els[els.length - 1].getBoundingClientRect();
        return r.top >= m.top - 1 && r.bottom <= m.bottom + 1; }""",
        selector,
    )


# ---- 1. a long conversation opens at its latest message --------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_a_long_conversation_opens_at_its_latest_message_and_pages_older_ones(
    page_at, gateway, peers, width, height
):
    turns = 120
    cid = _long_conversation(peers, f"long {width}", turns)
    other = _long_conversation(peers, f"short {width}", 2)
    page = page_at(width, height)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.goto(gateway.url + f"/#c={cid}")
    page.wait_for_selector("#messages[data-settled='1']")
    page.wait_for_function(AT_BOTTOM)
    assert page.inner_text(".msg.user >> nth=-1") == f"question {turns - 1}"
    # the server sends only the last turns (issue 37's paged replay); older pages on demand
    assert any("/api/chat?" in u and "tail_turns=" in u for u in asked), asked
    assert _visible_in_messages(page, ".badge")  # the last reply's end is in view
    drawn = page.locator(".msg.user").count()
    assert drawn < turns  # only the latest page is drawn
    assert page.is_visible("#older-btn")
    _shot(page, f"long-chat-{width}.png")

    # scrolling up draws the earlier ones, the view kept on what it showed
    for _ in range(turns):
        if not page.locator("#older-btn").count():
            break
        before = page.evaluate(
            """() => { const m = document.getElementById('messages');
            const first = Array.from(m.children).find((e) => e.id !== 'older-btn');
            first.dataset.anchor = '1';
            m.scrollTop = 0;
            return [m.children.length, first.getBoundingClientRect().top]; }"""
        )
        page.wait_for_function(f"document.getElementById('messages').children.length > {before[0]}")
        after = page.evaluate(
            "document.querySelector(\"[data-anchor='1']\").getBoundingClientRect().top"
        )
        assert abs(after - before[1]) <= 2, (before, after)
        page.evaluate(
            "document.querySelector(\"[data-anchor='1']\").removeAttribute('data-anchor')"
        )
    assert page.locator(".msg.user").count() == turns
    assert page.inner_text(".msg.user >> nth=0") == "question 0"
    assert any("/api/chat/history?" in u for u in asked), asked
    # every turn drawn once, in order, with its reply
    users = page.locator(".msg.user").all_inner_texts()
    assert users == [f"question {i}" for i in range(turns)]
    assert page.locator(".msg.assistant").count() == turns

    # switching away and back lands at the latest message again
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{other}'] button.title")
    page.wait_for_function(f"window.lokiDebug.conversation === '{other}'")
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{cid}'] button.title")
    page.wait_for_selector("#messages[data-settled='1']")
    page.wait_for_function(AT_BOTTOM)
    assert page.inner_text(".msg.user >> nth=-1") == f"question {turns - 1}"
    # a reply arriving while at the bottom keeps the view there
    peers.reply_pieces = ["more ", "text"]
    page.fill("#input", "one more")
    page.press("#input", "Enter")
    page.wait_for_function(
        "Array.from(document.querySelectorAll('.msg.assistant')).pop().textContent"
        ".trim() === 'more text' && !window.lokiDebug.generating"
    )
    page.wait_for_function(AT_BOTTOM)


# ---- 2. keyboard and screen readers ----------------------------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_conversations_by_keyboard_named_buttons_and_no_axe_violation(
    page_at, gateway, peers, width, height
):
    phone = width < 760
    first = peers.new_conv(f"first {width}").info.id
    second = peers.new_conv(f"second {width}").info.id
    peers.call(peers.emit(second, {"role": "user", "content": "hello"}))
    peers.call(peers.emit(second, {"role": "assistant"}, loki={"event": "turn_start"}))
    peers.call(peers.emit(second, {"reasoning_content": "thinking"}))
    peers.call(peers.emit(second, {"content": "Some **bold** answer."}))
    peers.call(peers.emit(second, {}, finish_reason="length", loki={"event": "turn_end"}))
    page = page_at(width, height)
    page.goto(gateway.url + f"/#c={first}")
    page.wait_for_selector(f"#conversations li[data-id='{second}']", state="attached")
    assert_accessible(page, "the main view")
    _shot(page, f"a11y-main-{width}.png")

    # Tab reaches a conversation; Enter opens it
    if phone:
        page.focus("#menu-btn")
        page.keyboard.press("Enter")
        page.wait_for_function(DRAWER_OPEN)
        assert_accessible(page, "the drawer")
    else:
        page.focus("#new-chat")
    target = f"second {width}"
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == target:
            break
    assert page.evaluate("document.activeElement.className") == "title"
    page.keyboard.press("Enter")
    page.wait_for_function(f"window.lokiDebug.conversation === '{second}'")
    page.wait_for_selector(".badge")
    # the row's icon buttons say what they do, and to what
    names = page.eval_on_selector_all(
        f"#conversations li[data-id='{second}'] button.row-icon",
        "bs => bs.map(b => b.getAttribute('aria-label'))",
    )
    assert names == [f"Rename {target}", f"Delete {target}"]
    assert_accessible(page, "a conversation with a cut reply")
    if phone:
        page.click("#actions-btn")
        page.wait_for_selector("#actions", state="visible")
        assert_accessible(page, "the actions menu")
        page.keyboard.press("Escape")

    dialogs = [
        ("#presets-btn", "#presets-dialog", "#presets-close"),
        ("#tasks-btn", "#tasks-dialog", "#tasks-close"),
        ("#mcp-btn", "#mcp-dialog", "#mcp-close"),
    ]
    for opener, dialog, closer in dialogs:
        _open_drawer(page)
        page.click(opener)
        page.wait_for_selector(f"{dialog}[open]")
        assert_accessible(page, dialog)
        if dialog == "#presets-dialog":
            page.click("#preset-new-local")
            page.wait_for_selector("#preset-form:not([hidden])")
            assert_accessible(page, "the preset form")
            page.click("#preset-new-external")
            assert_accessible(page, "the external preset form")
        else:
            prefix = "task" if dialog == "#tasks-dialog" else "mcp"
            page.click(f"#{prefix}-new")
            page.wait_for_selector(f"#{prefix}-form:not([hidden])")
            assert_accessible(page, f"the {prefix} form")
        page.click(closer)
    # the ask dialog (a rename)
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{first}'] button.row-icon >> nth=0")
    page.wait_for_selector("#ask-dialog[open]")
    assert_accessible(page, "the ask dialog")
    page.keyboard.press("Escape")
    page.wait_for_function("!document.getElementById('ask-dialog').open")
    # the memory lock's dialog and the key dialog, opened as the page opens them
    page.evaluate(
        "document.getElementById('memory-prompt').textContent = 'Passphrase:';"
        "document.getElementById('memory-dialog').showModal()"
    )
    assert_accessible(page, "the memory dialog")
    page.evaluate(
        "document.getElementById('memory-dialog').close();"
        "document.getElementById('key-dialog').showModal()"
    )
    assert_accessible(page, "the key dialog")
    page.evaluate("document.getElementById('key-dialog').close()")


# ---- 3. thumb-sized targets ------------------------------------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_every_control_is_thumb_sized_on_a_phone(page_at, gateway, peers, width, height):
    size = 44 if width < 760 else 24
    cid = peers.new_conv(f"targets {width}").info.id
    peers.call(peers.emit(cid, {"role": "user", "content": "use a tool"}))
    peers.call(peers.emit(cid, {"role": "assistant"}, loki={"event": "turn_start"}))
    peers.call(peers.emit(cid, {"reasoning_content": "thinking"}))
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "recall", "arguments": "{}"},
    }
    peers.call(peers.emit(cid, {"tool_calls": [call]}))
    peers.call(
        peers.emit(
            cid, {"role": "tool", "tool_call_id": "c1", "name": "recall", "content": "L" * 1000}
        )
    )
    peers.call(peers.emit(cid, {"content": "cut here"}))
    peers.call(peers.emit(cid, {}, finish_reason="length", loki={"event": "turn_end"}))
    page = page_at(width, height)
    page.goto(gateway.url + f"/#c={cid}")
    page.wait_for_selector("button.continue")
    # a queued message with its Cancel, an image in the tray
    peers.supervisor.vision = True
    page.wait_for_function("window.LokiApi.engine() && window.LokiApi.engine().vision")
    page.set_input_files(
        "#attach-input", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png()}]
    )
    page.wait_for_selector(".attach-chip.image")
    page.evaluate("LokiQueue.markQueued(LokiQueue.add('later'), () => true)")
    page.wait_for_selector(".cancel-queued")
    assert_targets(page, size, "the chat")
    _shot(page, f"targets-chat-{width}.png")
    if width < 760:
        page.click("#menu-btn")
        page.wait_for_function(DRAWER_OPEN)
        assert_targets(page, size, "the drawer")
        _shot(page, f"targets-drawer-{width}.png")
        page.click("#scrim", position={"x": width - 10, "y": 400})
        page.click("#actions-btn")
        page.wait_for_selector("#actions", state="visible")
        assert_targets(page, size, "the actions menu")
        page.keyboard.press("Escape")
    for opener, dialog, inner in [
        ("#presets-btn", "#presets-dialog", "#preset-new-local"),
        ("#tasks-btn", "#tasks-dialog", "#task-new"),
        ("#mcp-btn", "#mcp-dialog", "#mcp-new"),
    ]:
        _open_drawer(page)
        page.click(opener)
        page.wait_for_selector(f"{dialog}[open]")
        assert_targets(page, size, dialog)
        page.click(inner)
        assert_targets(page, size, dialog + " form")
        if dialog == "#presets-dialog":
            _shot(page, f"targets-presets-{width}.png")
        page.keyboard.press("Escape")
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{cid}'] button.row-icon >> nth=1")
    page.wait_for_selector(".notice-action")
    assert_targets(page, size, "the Undo notice")
    page.click(".notice-action")
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{cid}'] button.row-icon >> nth=0")
    page.wait_for_selector("#ask-dialog[open]")
    assert_targets(page, size, "the ask dialog")
    page.keyboard.press("Escape")


# ---- 4. no browser pop-ups -------------------------------------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_rename_delete_with_undo_and_reset_ask_in_loki_s_own_dialog(
    page_at, gateway, peers, width, height
):
    keep = peers.new_conv(f"keep {width}").info.id
    gone = peers.new_conv(f"gone {width}").info.id
    peers.call(peers.emit(keep, {"role": "user", "content": "to be emptied"}))
    page = page_at(width, height)  # fails the test on any alert/confirm/prompt
    page.goto(gateway.url + f"/#c={keep}")
    page.wait_for_selector(".msg.user")

    # rename: the title asked in the ask dialog, Enter saves it
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{keep}'] button.row-icon >> nth=0")
    page.wait_for_selector("#ask-dialog[open]")
    assert page.input_value("#ask-input") == f"keep {width}"
    page.fill("#ask-input", f"kept {width}")
    _shot(page, f"ask-rename-{width}.png")
    page.press("#ask-input", "Enter")
    page.wait_for_selector(f"#conversations li[data-id='{keep}'] button.title >> text=kept {width}")
    assert peers.convs[keep].info.title == f"kept {width}"

    # delete, then Undo: nothing deleted
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{gone}'] button.row-icon >> nth=1")
    page.wait_for_selector(f"#conversations li[data-id='{gone}']", state="detached")
    assert page.inner_text("#notice").startswith(f"Deleted “gone {width}”")
    page.click(".notice-action")
    page.wait_for_selector(f"#conversations li[data-id='{gone}']", state="attached")
    time.sleep(0.5)
    assert gone in peers.convs
    # delete for good: the server deletes it when the Undo is gone
    _open_drawer(page)
    page.click(f"#conversations li[data-id='{gone}'] button.row-icon >> nth=1")
    page.wait_for_selector(".notice-action")
    deadline = time.monotonic() + 15
    while gone in peers.convs:
        assert time.monotonic() < deadline, "not deleted after the Undo's time"
        time.sleep(0.2)

    # reset: asked, Cancel keeps the messages; confirmed, empties the conversation
    if width < 760:
        page.keyboard.press("Escape")
        page.click("#actions-btn")
    page.click("#reset-btn")
    page.wait_for_selector("#ask-dialog[open]")
    _shot(page, f"ask-reset-{width}.png")
    page.click("#ask-cancel")
    page.wait_for_function("!document.getElementById('ask-dialog').open")
    assert page.locator(".msg.user").count() == 1
    if width < 760:
        page.click("#actions-btn")
    page.click("#reset-btn")
    page.click("#ask-ok")
    page.wait_for_selector(".msg.user", state="detached")

    # a preset's delete
    peers.presets["spare"] = Preset(id="spare", name="spare")
    _open_drawer(page)
    page.click("#presets-btn")
    page.wait_for_selector("#presets-list li >> text=spare")
    page.click("#presets-list li:has-text('spare') button:has-text('Delete')")
    page.wait_for_selector("#ask-dialog[open]")
    page.click("#ask-ok")
    deadline = time.monotonic() + 10
    while "spare" in peers.presets:
        assert time.monotonic() < deadline
        time.sleep(0.1)


# ---- 5. the engine pill ----------------------------------------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_the_engine_pill_says_it_plainly_and_follows_the_engine_without_polling(
    page_at, gateway, peers, width, height
):
    peers.supervisor.template = TemplateProbe(
        supports_tools=False, notes=["this model's template ignores tools: recall is off for it"]
    )
    page = page_at(width, height)
    engine_reads: list[str] = []
    page.on(
        "request", lambda r: engine_reads.append(r.url) if r.url.endswith("/api/engine") else None
    )
    page.goto(gateway.url + "/")
    _open_drawer(page)
    page.wait_for_function("document.getElementById('engine-state').dataset.state === 'ready'")
    assert page.inner_text("#engine-state") == "Engine: Ready · fake"
    assert page.inner_text("#engine-note") == NO_TOOLS
    assert page.is_hidden("#engine-details")
    page.click("#engine-state")  # the details behind the pill
    assert page.get_attribute("#engine-state", "aria-expanded") == "true"
    details = page.inner_text("#engine-details")
    assert "this model's template ignores tools: recall is off for it" in details
    assert "Model: fake" in details
    _shot(page, f"engine-pill-{width}.png")
    assert_accessible(page, "the engine details")

    # contrast of every state's pill, and of the sentence
    for st in ("ready", "generating", "starting", "failed", "stopped", "unknown"):
        page.evaluate(f"document.getElementById('engine-state').className = 'pill {st}'")
        ratio = contrast(page, "#engine-state")
        assert ratio >= 4.5, (st, ratio)
    assert contrast(page, "#engine-note") >= 4.5

    # pushed: a request in flight elsewhere shows "Generating", its end "Ready", each within
    # a couple of seconds and without the page asking
    peers.supervisor.extra_in_flight = 1
    page.wait_for_function(
        "document.getElementById('engine-state').dataset.state === 'generating'", timeout=5000
    )
    peers.supervisor.extra_in_flight = 0
    page.wait_for_function(
        "document.getElementById('engine-state').dataset.state === 'ready'", timeout=5000
    )
    # a state event (loki.engine.state) is pushed at once
    peers.engine_failure = {"detail": "llama-server exited (code 1)"}
    peers.call(
        peers.nc.publish(
            subjects.ENGINE_STATE,
            EngineState(state="failed", ts=time.time(), detail="exited").model_dump_json().encode(),
        )
    )
    page.wait_for_function(
        "document.getElementById('engine-state').dataset.state === 'failed'", timeout=3000
    )
    assert page.inner_text("#engine-state").startswith("Engine: Failed")
    peers.engine_failure = None
    page.wait_for_function(
        "document.getElementById('engine-state').dataset.state === 'ready'", timeout=5000
    )
    # a reply of this page: "generating" while it streams, not after it ends
    peers.reply_pieces = [f"w{i} " for i in range(20)]
    peers.delay_s = 0.05
    page.keyboard.press("Escape")
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    _open_drawer(page)
    page.wait_for_function("document.getElementById('engine-state').dataset.state === 'generating'")
    page.wait_for_selector(".badge")
    assert page.get_attribute("#engine-state", "data-state") == "ready"
    peers.delay_s = 0.01
    assert len(engine_reads) == 1, engine_reads  # read once at start, never polled

    # the preset editor: fields in words, the setting's name beside, one line of help each
    page.click("#presets-btn")
    page.click("#preset-new-local")
    labels = page.eval_on_selector_all(
        "#preset-local label:has(.setting)",
        """ls => ls.map(l => [l.firstChild.textContent.trim(), l.querySelector('.setting').textContent,
            (l.querySelector('.help') || {}).textContent || ''])""",
    )
    assert [(w, s) for w, s, _ in labels] == [
        ("Context window", "CTX"),
        ("Layers on the GPU", "NGL"),
        ("Parallel replies", "PARALLEL"),
        ("Prompt batch size", "UBATCH"),
        ("Side slot", "SIDE_SLOT"),
        ("Prompt cache in RAM", "CACHE_RAM"),
        ("Extra engine options", "EXTRA_ARGS"),
    ]
    assert all(h.strip() and "\n" not in h.strip() for _, _, h in labels)
    _shot(page, f"preset-labels-{width}.png")


# ---- 7. small things -------------------------------------------------------------------
@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_new_chat_reuses_the_empty_one_and_an_image_without_vision_is_refused_at_attach(
    page_at, gateway, peers, width, height
):
    peers.convs.clear()  # no empty conversation left by an earlier test
    page = page_at(width, height)
    page.goto(gateway.url + "/")
    page.wait_for_function("window.LokiApi.engine() !== null")
    before = len(peers.convs)
    _open_drawer(page)
    page.click("#new-chat")
    page.wait_for_selector("#new-chat:not([aria-busy])", state="attached")
    made = page.evaluate("window.lokiDebug.conversation")
    assert made
    for _ in range(3):
        _open_drawer(page)
        page.click("#new-chat")
        page.wait_for_selector("#new-chat:not([aria-busy])", state="attached")
        assert page.evaluate("window.lokiDebug.conversation") == made
    assert len(peers.convs) == before + 1
    # once it has a message, "+ New chat" makes another
    peers.reply_pieces = ["ok"]
    page.fill("#input", "first words")
    page.press("#input", "Enter")
    page.wait_for_selector(".badge")
    _open_drawer(page)
    page.click("#new-chat")
    page.wait_for_function(
        f"window.lokiDebug.conversation && window.lokiDebug.conversation !== '{made}'"
    )
    assert len(peers.convs) == before + 2

    # an image while the model has no vision: refused at attach time, said at once
    peers.supervisor.vision = False
    page.set_input_files(
        "#attach-input", files=[{"name": "blue.png", "mimeType": "image/png", "buffer": png()}]
    )
    page.wait_for_selector("#attach-error:not([hidden])")
    assert page.inner_text("#attach-error") == (
        "blue.png not attached: the model in use cannot see images. "
        "Switch to a preset with vision to send it."
    )
    assert page.locator(".attach-chip").count() == 0
    _shot(page, f"attach-no-vision-{width}.png")
    # with vision (pushed by the gateway) the same image is taken
    peers.supervisor.vision = True
    page.wait_for_function("window.LokiApi.engine().vision === true", timeout=5000)
    page.set_input_files(
        "#attach-input", files=[{"name": "blue.png", "mimeType": "image/png", "buffer": png()}]
    )
    page.wait_for_selector(".attach-chip.image")
    assert page.is_hidden("#attach-error")


def test_engine_events_need_the_key_and_start_with_the_info(gateway_factory, peers):
    gw = gateway_factory(key="engine-events-key")
    with gw.client() as c:
        assert c.get("/api/engine/events", headers={"Authorization": ""}).status_code == 401
        with c.stream("GET", "/api/engine/events") as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    break
        assert "event: engine" in lines
        info = json.loads(lines[-1][len("data:") :])
        assert info == c.get("/api/engine").json() and "api_key" not in info


def test_a_drawer_opened_while_the_list_loads_stays_open(page_at, gateway, peers):
    """On a phone the person may open the drawer before the conversation list has come
    (a slow link, a busy box): the page's own opening of the last conversation once the list
    arrives leaves the drawer as they set it (it used to snap shut under their finger); a
    conversation they pick themselves closes it."""
    cid = _long_conversation(peers, "Waiting list", 2)
    page = page_at(390, 844)
    page.add_init_script(f"localStorage.setItem('lokiConv', {cid!r})")
    gate = {"open": False}

    def slow_list(route) -> None:  # the list answers only once the drawer is open
        page.wait_for_timeout(1)
        if not gate["open"]:
            page.wait_for_function("document.body.classList.contains('drawer-open')")
            gate["open"] = True
        route.continue_()

    page.route("**/api/conversations", slow_list)
    page.goto(gateway.url + "/")
    page.wait_for_selector("#menu-btn")
    page.click("#menu-btn")
    page.wait_for_function(DRAWER_OPEN)
    # the page opens the last conversation by itself once the list is in
    page.wait_for_function(f"document.getElementById('messages').dataset.conversation === {cid!r}")
    page.wait_for_selector(f"#conversations li[data-id={cid!r}]")
    assert page.evaluate("document.body.classList.contains('drawer-open')")
    assert page.is_visible("#devices-btn")
    _shot(page, "drawer-after-list-390.png")
    page.click(f"#conversations li[data-id={cid!r}] button.title")  # picked: the drawer closes
    page.wait_for_function("!document.body.classList.contains('drawer-open')")
