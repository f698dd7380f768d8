"""Code mode in the web UI (issue 43), in real headless Chromium at 1280×800 and 390×844,
against the gateway, the fake chat peers and the scripted ``loki.chat.code`` /
``loki.workspace.*`` responders (:mod:`tests.gateway.code_peers`, real directories):

1. the header's switch puts the conversation in code mode (the thread says so); the Code panel
   is a side column on the desktop, a full-screen sheet on the phone; its tree opens
   directories one at a time and never shows ``.git``; a file opens read-only with its syntax
   colours and line numbers; "← Files" (or Escape on the phone) goes back to the file's button;
2. the criteria are set in the panel's editor, checked with "Check now", each with its badge
   (pending, met, failed) and its detail behind its toggle; a ``criteria`` display event
   redraws them;
3. a ``run`` tool call shows its command line, and its result the exit code, the command and
   the output (a long output: its last lines, the whole behind a toggle opened by keyboard);
   a ``git`` call its op and message; the turn's end names the criteria left failing;
4. switching a project without a workspace to code mode asks first: create it empty or clone
   it from a local path, then the switch; a binary file says its type;

every step reached by keyboard, axe-core clean (no serious or critical violation), controls of
44×44 px on the phone (24×24 on the desktop). Screenshots under ``tests/artifacts/``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.media import png

from .a11y import assert_accessible, assert_targets
from .code_peers import CodePeers
from .conftest import ARTIFACTS

SIZES = [(1280, 800), (390, 844)]
IDS = ["1280x800", "390x844"]
WAIT_MS = 15_000

OPS = '''"""Arithmetic."""


def add(a: int, b: int) -> int:
    # the sum
    return a + b
'''
FAILED = (
    "exit code: 1 | duration: 0.4 s | output: 120 bytes\n"
    "F.\nFAILED tests/test_ops.py::test_add - assert 3 == 4\n1 failed, 1 passed in 0.02s"
)


@pytest.fixture(scope="module")
def code(peers, tmp_path_factory) -> Iterator[CodePeers]:
    fake = CodePeers(peers, tmp_path_factory.mktemp("ui-workspaces")).start()
    yield fake
    fake.stop()


@pytest.fixture
def page_at(browser, gateway, peers, code) -> Iterator:
    """A page factory at a size; a JavaScript error or a browser pop-up fails the test."""
    pages: list[Any] = []
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
    assert problems == []


def _project(peers, code, title: str, project: str) -> str:
    """A conversation of ``project`` (its list entry says so, as the chat service's does)."""
    conv = peers.new_conv(title)
    conv.info = conv.info.model_copy(update={"project": project})
    code.projects[conv.info.id] = project
    return conv.info.id


def _package(code, project: str) -> None:
    ws = code.workspace(project)
    (ws / "src" / "calc").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / "src" / "calc" / "__init__.py").write_text("")
    (ws / "src" / "calc" / "ops.py").write_text(OPS)
    (ws / "tests" / "test_ops.py").write_text("from calc.ops import add\n")
    (ws / "README.md").write_text("# calc\n")
    (ws / "pyproject.toml").write_text('[project]\nname = "calc"\n')
    (ws / "logo.png").write_bytes(png(16, 16, (20, 90, 200)))


def _check(page, where: str, phone: bool) -> None:
    assert_accessible(page, where)
    assert_targets(page, 44 if phone else 24, where)


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 3_000


def _press(page, selector: str, key: str = "Enter") -> None:
    """The keyboard's way: focus the control, press ``key``."""
    page.focus(selector)
    page.keyboard.press(key)


def _emit(peers, cid: str, delta: dict[str, Any], **extra: Any) -> None:
    peers.call(peers.emit(cid, delta, **extra))


def _tool_turn(
    peers,
    cid: str,
    call_id: str,
    name: str,
    args: dict[str, Any],
    result: str,
    run: Any = None,
    **end: Any,
) -> None:
    """A turn whose model calls the tool ``name`` (as the chat service logs it: the call,
    its ``tool_result`` event with ``loki.run`` when given), then answers."""
    _emit(peers, cid, {"role": "user", "content": f"use {name}"}, loki={"event": "user"})
    _emit(peers, cid, {"role": "assistant"}, loki={"event": "turn_start"})
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    _emit(peers, cid, {"tool_calls": [call]})
    tool = {"role": "tool", "tool_call_id": call_id, "name": name, "content": result}
    meta = {"event": "tool_result", "label": name}
    if run is not None:  # the chat service's own figures (its loki.run)
        meta["run"] = run
    _emit(peers, cid, tool, loki=meta)
    _emit(peers, cid, {"content": "Done."})
    _emit(peers, cid, {}, finish_reason="stop", loki={"event": "turn_end", **end})


@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_code_mode_the_tree_a_coloured_file_criteria_and_a_run_call(
    page_at, gateway, peers, code, width, height
):
    phone = width < 1000
    project = f"calc{width}"
    _package(code, project)
    cid = _project(peers, code, f"calc {width}", project)
    page = page_at(width, height)
    page.goto(gateway.url + f"/#c={cid}")
    page.wait_for_selector("#mode-btn:not([hidden])", timeout=WAIT_MS)
    assert page.get_attribute("#mode-btn", "aria-pressed") == "false"
    assert page.is_hidden("#code-panel-btn") and page.is_hidden("#code-panel")

    # 1. the switch, by keyboard: the thread says it, the panel opens (desktop) or is at hand
    _press(page, "#mode-btn")
    page.wait_for_selector("#mode-btn[aria-pressed='true']", timeout=WAIT_MS)
    page.wait_for_selector(".marker.mode", timeout=WAIT_MS)
    assert "code mode on" in page.inner_text(".marker.mode") and project in page.inner_text(
        ".marker.mode"
    )
    assert code.state(cid).mode == "code"
    if phone:
        assert page.is_hidden("#code-panel")
        _press(page, "#code-panel-btn")
    page.wait_for_selector("#code-panel:not([hidden])", timeout=WAIT_MS)
    box = page.locator("#code-panel").bounding_box()
    if phone:  # a sheet over the whole screen
        assert box["x"] == 0 and box["width"] == width and box["height"] >= height - 1
    else:  # a column beside the thread, which stays in view
        assert box["x"] + box["width"] == width and box["width"] < width / 2
        assert page.locator("#messages").bounding_box()["width"] > 400
    assert "branch main" in page.inner_text("#code-ws-info")

    # the tree: directories first, .git never; a directory opened by keyboard, lazily
    page.wait_for_selector("#file-tree button.tree-dir[data-path='src']", timeout=WAIT_MS)
    top = page.eval_on_selector_all("#file-tree > li", "els => els.map(e => e.dataset.path)")
    assert top[:2] == ["src", "tests"] and "README.md" in top and ".git" not in top
    assert page.locator("#file-tree button[data-path='src/calc']").count() == 0
    _press(page, "#file-tree button[data-path='src']")
    page.wait_for_selector("button[data-path='src/calc'][aria-expanded='false']")
    assert page.get_attribute("button[data-path='src']", "aria-expanded") == "true"
    _press(page, "button[data-path='src/calc']")
    page.wait_for_selector("button.tree-file[data-path='src/calc/ops.py']", timeout=WAIT_MS)
    _check(page, "the code panel with its tree", phone)
    _shot(page, f"code-tree-{width}x{height}.png")

    # a file read-only with its colours and line numbers
    _press(page, "button.tree-file[data-path='src/calc/ops.py']")
    page.wait_for_selector("#file-view-code .line", timeout=WAIT_MS)
    assert page.inner_text("#file-view-title") == "src/calc/ops.py"
    assert page.locator("#file-view-code .line").count() == OPS.count("\n")
    assert "return a + b" in page.inner_text("#file-view-code")
    keyword = page.eval_on_selector("#file-view-code .k", "e => getComputedStyle(e).color")
    plain = page.eval_on_selector("#file-view-code", "e => getComputedStyle(e).color")
    assert keyword != plain  # coloured by /code-colours.css
    assert "Python" in page.inner_text("#file-view-meta")
    assert page.is_hidden("#code-files")  # the viewer in place of the tree
    assert page.evaluate("document.activeElement.id") == "file-back"
    _check(page, "the file viewer", phone)
    _shot(page, f"code-viewer-{width}x{height}.png")
    page.keyboard.press("Escape" if phone else "Enter")  # Escape on the phone's sheet
    page.wait_for_selector("#file-view", state="hidden")
    assert page.evaluate("document.activeElement.dataset.path") == "src/calc/ops.py"

    # 2. criteria: set in the editor, checked, each with its badge and detail
    assert "No criteria yet" in page.inner_text("#criteria-list")
    _press(page, "#criteria-edit")
    page.wait_for_selector("#criteria-form:not([hidden])")
    page.fill("#criteria-rows li:nth-child(1) input[name=text]", "the tests pass")
    page.fill("#criteria-rows li:nth-child(1) input[name=command]", "pytest -q")
    _press(page, "#criteria-add")
    page.fill("#criteria-rows li:nth-child(2) input[name=text]", "the linter is clean")
    page.fill("#criteria-rows li:nth-child(2) input[name=command]", "ruff check .")
    _check(page, "the criteria editor", phone)
    _press(page, "#criteria-save")
    page.wait_for_selector("#criteria-form", state="hidden")
    page.wait_for_selector("#criteria-list li.criterion[data-id='c2']")
    states = page.eval_on_selector_all(
        "#criteria-list li.criterion", "els => els.map(e => e.dataset.state)"
    )
    assert states == ["pending", "pending"]
    assert [c.text for c in code.state(cid).criteria] == ["the tests pass", "the linter is clean"]
    code.passing.add("pytest -q")
    _press(page, "#criteria-check")
    page.wait_for_selector("#criteria-list li[data-id='c2'][data-state='failed']")
    assert page.get_attribute("#criteria-list li[data-id='c1']", "data-state") == "met"
    assert "1 met, 1 failed" in page.inner_text("#criteria-status")
    _press(page, "#criteria-list li[data-id='c2'] summary")
    assert "exit code 1" in page.inner_text("#criteria-list li[data-id='c2'] .crit-detail")
    assert page.inner_text("#criteria-list li[data-id='c2'] .pill") == "failed"
    _check(page, "the criteria with their states", phone)
    _shot(page, f"code-criteria-{width}x{height}.png")
    # the model sets them too: the display event redraws them (the detail kept open)
    code.state(cid).criteria[0].state = "pending"
    peers.call(code.emit_criteria(cid))
    page.wait_for_selector("#criteria-list li[data-id='c1'][data-state='pending']")

    # 3. a run call: the command, then the exit code, the command and the output
    if phone:
        _press(page, "#code-close")
        page.wait_for_selector("#code-panel", state="hidden")
        assert page.evaluate("document.activeElement.id") == "code-panel-btn"
    run_q = {"command": "pytest -q"}
    _tool_turn(peers, cid, f"call_{width}", "run", run_q, FAILED, criteria_failed=["c2"])
    page.wait_for_selector(".run-result", timeout=WAIT_MS)
    assert "⚙ run: pytest -q" in page.inner_text("details.code-call summary")
    result = page.locator(".run-result").last
    assert result.locator(".pill.exit-fail").inner_text() == "exit 1"
    assert result.locator("pre.cmd").inner_text() == "$ pytest -q"
    assert "FAILED tests/test_ops.py::test_add" in result.locator("pre.run-output").inner_text()
    assert "0.4 s" in result.locator(".run-head").inner_text()
    # the turn's end says which criteria the verification left failing
    page.wait_for_function(
        "Array.from(document.querySelectorAll('.badge')).some("
        "b => b.textContent.includes('criteria not met: c2'))"
    )
    output = "\n".join(f"collected line {i}" for i in range(1, 41))
    long = "exit code: 0 | duration: 9.9 s | output: 900 bytes\n" + output
    run = {
        "command": "pytest -v",
        "exit_code": 0,
        "killed": "",
        "output": output,
        "truncated": False,
        "output_bytes": 900,
        "duration_s": 2.0,
    }
    _tool_turn(peers, cid, f"call_long_{width}", "run", {"command": "pytest -v"}, long, run)
    page.wait_for_function("document.querySelectorAll('.run-result').length === 2")
    last = page.locator(".run-result").last
    assert last.locator(".pill.exit-ok").inner_text() == "exit 0"
    assert "2.0 s" in last.locator(".run-head").inner_text()  # loki.run's, not the text's
    assert "collected line 40" in last.locator("pre.run-output").first.inner_text()
    assert "collected line 1\n" not in last.locator("pre.run-output").first.inner_text()
    summary = last.locator(".run-whole summary")
    assert summary.inner_text() == "Whole output (40 lines)"
    summary.focus()
    page.keyboard.press("Enter")
    whole = last.locator("pre.run-output.whole")
    whole.wait_for(state="visible")
    assert "collected line 1\n" in whole.inner_text()
    # a git call: its op and message, then the result with the command it ran
    commit = {"op": "commit", "message": "add calc"}
    done = "[main 1a2b3c4] add calc\n 1 file changed, 6 insertions(+)"
    git_run = {"command": "git commit", "op": "commit", "exit_code": 0, "killed": "",
               "output": done, "truncated": False, "output_bytes": 50, "duration_s": 0.1}  # fmt: skip
    text = "exit code: 0 | duration: 0.1 s | output: 50 bytes\n" + done
    _tool_turn(peers, cid, f"call_git_{width}", "git", commit, text, git_run)
    page.wait_for_function("document.querySelectorAll('.run-result').length === 3")
    assert 'git commit -m "add calc"' in page.locator("details.code-call summary").last.inner_text()
    git_result = page.locator(".run-result").last
    assert git_result.locator("pre.cmd").inner_text() == "git commit"
    assert "[main 1a2b3c4] add calc" in git_result.locator("pre.run-output").inner_text()
    # a command the sandbox killed: why, in place of an exit code
    slept = {"command": "sleep 99", "exit_code": None, "killed": "timeout", "output": "",
             "truncated": False, "output_bytes": 0, "duration_s": 5.0}  # fmt: skip
    text = "killed: timeout (past its time limit) | duration: 5.0 s | output: 0 bytes\n(no output)"
    _tool_turn(peers, cid, f"call_kill_{width}", "run", {"command": "sleep 99"}, text, slept)
    page.wait_for_function("document.querySelectorAll('.run-result').length === 4")
    killed = page.locator(".run-result").last
    assert killed.locator(".pill.exit-killed").inner_text() == "killed: timeout"
    assert killed.locator(".pill.exit-ok, .pill.exit-fail").count() == 0
    assert "(no output)" in killed.inner_text()
    _check(page, "the thread with run and git calls", phone)
    _shot(page, f"code-run-{width}x{height}.png")


@pytest.mark.parametrize("width,height", SIZES, ids=IDS)
def test_a_project_without_workspace_is_cloned_then_switched_and_a_binary_says_its_type(
    page_at, gateway, peers, code, tmp_path, width, height
):
    phone = width < 1000
    project = f"fresh{width}"
    cid = _project(peers, code, f"fresh {width}", project)
    source = tmp_path / "repo"
    (source / "app").mkdir(parents=True)
    (source / "app" / "main.py").write_text("print('hi')\n")
    (source / "icon.png").write_bytes(png(8, 8))
    page = page_at(width, height)
    page.goto(gateway.url + f"/#c={cid}")
    page.wait_for_selector("#mode-btn:not([hidden])", timeout=WAIT_MS)
    _press(page, "#mode-btn")
    # no workspace: the panel asks first, the mode is not switched yet
    page.wait_for_selector("#code-ws-form:not([hidden])", timeout=WAIT_MS)
    assert page.evaluate("document.activeElement.name") == "clone_from"
    assert code.state(cid).mode == "chat"
    assert page.inner_text("#code-ws-create") == "Create and switch to code mode"
    _check(page, "the workspace form", phone)
    _shot(page, f"code-workspace-form-{width}x{height}.png")
    # a URL is refused with the gateway's word, the form kept
    page.fill("#code-ws-form [name=clone_from]", "https://example.com/repo.git")
    page.keyboard.press("Enter")
    page.wait_for_selector("#code-ws-error:not([hidden])")
    assert "not a URL" in page.inner_text("#code-ws-error")
    page.fill("#code-ws-form [name=clone_from]", str(source))
    page.keyboard.press("Enter")
    page.wait_for_selector("#mode-btn[aria-pressed='true']", timeout=WAIT_MS)
    assert (code.workspace(project) / "app" / "main.py").read_text() == "print('hi')\n"
    assert code.state(cid).mode == "code"
    page.wait_for_selector("#code-ws-form", state="hidden")
    assert "cloned from " + str(source) in page.inner_text("#code-ws-info")
    page.wait_for_selector("button.tree-file[data-path='icon.png']", timeout=WAIT_MS)
    _press(page, "button.tree-file[data-path='icon.png']")
    page.wait_for_function(
        "document.getElementById('file-view-meta').textContent.includes('image/png')"
    )
    assert page.is_hidden("#file-view-code") and "binary" in page.inner_text("#file-view-note")
    _check(page, "a binary file in the viewer", phone)
    # back in chat mode: the panel goes, the thread says so
    _press(page, "#file-back")
    if phone:
        _press(page, "#code-close")
    _press(page, "#mode-btn")
    page.wait_for_selector("#mode-btn[aria-pressed='false']", timeout=WAIT_MS)
    page.wait_for_function(
        "Array.from(document.querySelectorAll('.marker.mode')).some("
        "m => m.textContent.includes('chat mode'))"
    )
    deadline = time.monotonic() + 10
    while page.is_visible("#code-panel"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert page.is_hidden("#code-panel-btn")
