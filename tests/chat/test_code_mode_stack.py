"""Issue 43's "done when", through the whole stack (``loki up``'s processes: gateway, chat,
workspace, recall, memory, perf, the supervisor following a scripted engine).

A conversation in code mode writes a small Python package, runs its tests in the sandbox,
fails a criterion, is corrected by the verification round, commits; the gateway's routes
show the result, and the page (headless Debian chromium) shows the mode, the tree, the criteria
met and each tool call with its command and output.
The engine is scripted because the model must decide: what it writes, when it answers;
everything else is real (NATS, Redis, the bubblewrap sandbox, git).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from loki_cli.stack import Stack
from loki_shared.messages.recall import DEFAULT_PROJECT
from tests.e2e.conftest import StackClient
from tests.fakes.fake_engine import FakeEngine, text_reply, tool_reply
from tests.gateway.conftest import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS

#: The package as first written: add() is wrong for a negative first operand (abs), which
#: its own test does not catch; the person's second criterion does.
BUGGY = "def add(a: int, b: int) -> int:\n    return abs(a) + b\n"
FIXED = "def add(a: int, b: int) -> int:\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_small(self) -> None:\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)
UNITTEST = "python3 -m unittest discover -s tests -t ."
NEGATIVE = "python3 -c 'import calc; assert calc.add(-2, 1) == -1, calc.add(-2, 1)'"


def _args(**fields: Any) -> str:
    return json.dumps(fields)


def _script(engine: FakeEngine) -> None:
    """The model's side of the turn, step by step (each a streamed completion)."""
    engine.push(
        tool_reply(
            [
                ("w1", "write", _args(path="calc/__init__.py", content=BUGGY)),
                ("w2", "write", _args(path="tests/__init__.py", content="")),
                ("w3", "write", _args(path="tests/test_calc.py", content=TESTS)),
            ],
            content="Writing the package and its test.",
        ),
        tool_reply([("r1", "run", _args(command=UNITTEST, timeout_s=60))]),
        text_reply("Done: the package `calc` with add() and its test; the test passes."),
        # the verification round: the person's criterion on negative numbers failed
        tool_reply(
            [("e1", "edit", _args(path="calc/__init__.py", old_string="abs(a)", new_string="a"))]
        ),
        tool_reply([("r2", "run", _args(command=f"{UNITTEST} && {NEGATIVE}", timeout_s=60))]),
        tool_reply([("g1", "git", _args(op="commit", message="calc: add() and its test"))]),
        text_reply("Fixed add() for a negative first operand, tests pass, committed."),
    )


def _show(base: str, cid: str) -> None:
    """The finished turn as the person sees it at 1280×800: code mode on, the Code panel
    beside the thread (the tree with the package, both criteria met), the run and git calls
    with their commands and outputs."""
    from playwright.sync_api import sync_playwright  # a missing package fails, never skips

    wait = 15_000
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/#c={cid}")
            page.wait_for_selector("#mode-btn[aria-pressed='true']", timeout=wait)
            page.wait_for_selector(".marker.mode", timeout=wait)
            page.wait_for_selector("#code-panel:not([hidden])", timeout=wait)
            page.wait_for_selector("#file-tree button.tree-dir[data-path='calc']", timeout=wait)
            page.wait_for_selector("#criteria-list li[data-id='c2'][data-state='met']")
            assert page.get_attribute("#criteria-list li[data-id='c1']", "data-state") == "met"
            page.wait_for_selector(".run-result", timeout=wait)
            commands = page.locator(".run-result pre.cmd").all_inner_texts()
            assert f"$ {UNITTEST}" in commands
            assert f"$ {UNITTEST} && {NEGATIVE}" in commands
            assert "OK" in page.locator(".run-result pre.run-output").first.inner_text()
            summaries = page.locator("details.code-call summary").all_inner_texts()
            assert any("git" in s and "commit" in s for s in summaries), summaries
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "code-mode-stack-1280x800.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()


def _loki(event: dict[str, Any]) -> dict[str, Any]:
    return event.get("loki") or {}


def test_a_code_mode_turn_is_corrected_by_its_criteria_and_commits(
    fake_stack: Stack, fake_engine: FakeEngine
) -> None:
    client = StackClient(f"http://127.0.0.1:{fake_stack.config.web_port}")
    http = client.http
    # a new conversation (no message yet), switched to code mode: its project's workspace
    created = http.post("/api/conversations", json={"title": "calc"})
    assert created.status_code == 201, created.text
    cid = created.json()["conversation"]["id"]
    switched = http.post("/api/chat/mode", json={"conversation": cid, "mode": "code"})
    assert switched.status_code == 200, switched.text
    assert switched.json()["mode"] == "code"
    project = switched.json()["project"] or DEFAULT_PROJECT
    workspace = http.get("/api/workspace", params={"project": project}).json()
    assert workspace["exists"] is True and "bubblewrap" in workspace["sandbox"]
    # the person's acceptance criteria
    criteria = [
        {"text": "the package's tests pass", "command": UNITTEST},
        {"text": "add() is right for a negative first operand", "command": NEGATIVE},
    ]
    put = http.put("/api/chat/criteria", json={"conversation": cid, "criteria": criteria})
    assert put.status_code == 200, put.text
    _script(fake_engine)

    client.send("Write a Python package `calc` with add(a, b) and a unittest for it.", cid)
    events = client.events(cid, until_turn_ends=1, timeout=120)
    state = client.wait_idle(cid, timeout=60)

    # the model's tools ran in the sandbox: the first run's tests passed (exit 0)
    runs = [_loki(e)["run"] for e in events if "run" in _loki(e)]
    assert runs and runs[0]["exit_code"] == 0 and runs[0]["command"] == UNITTEST
    # the final answer did not end the turn: the criteria were checked, c2 failed, ONE
    # corrective round was sent (persisted as sent, marked injected) ...
    checks = [_loki(e)["criteria"] for e in events if _loki(e).get("event") == "criteria"]
    states = [{c["id"]: c["state"] for c in check} for check in checks]
    assert {"c1": "met", "c2": "failed"} in states
    reminders = [
        m
        for m in state["messages"]
        if m["role"] == "user" and (m.get("loki") or {}).get("injected") == "criteria"
    ]
    assert len(reminders) == 1 and "c2" in reminders[0]["content"]
    sent_after_answer = json.loads(fake_engine.requests[3].body)["messages"]
    assert sent_after_answer[-1]["content"] == reminders[0]["content"]
    # ... and after the correction every criterion is met; the turn ended normally
    assert states[-1] == {"c1": "met", "c2": "met"}
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    got = http.get("/api/chat/criteria", params={"conversation": cid}).json()
    assert [c["state"] for c in got["criteria"]] == ["met", "met"]
    assert len(fake_engine.requests) == 7  # no generic verifier request in a criteria turn

    # the commit is in the workspace's repository, the fix in its file
    root = fake_stack.config.home / "workspaces" / project
    # (its files belong to the sandbox's uid: git asks to be told the folder is safe)
    git = ["git", "-c", f"safe.directory={root}", "-C", str(root)]
    log = subprocess.run(
        [*git, "log", "--format=%an|%s"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert log and log[0].endswith("|calc: add() and its test")
    assert (root / "calc" / "__init__.py").read_text() == FIXED
    status = subprocess.run(
        [*git, "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert status == ""

    # what the UI reads: the tree and a file's coloured view
    tree = http.get("/api/chat/files", params={"conversation": cid, "depth": 3}).json()
    paths = {e["path"] for e in tree["entries"]}
    assert {"calc", "calc/__init__.py", "tests/test_calc.py"} <= paths
    assert not any(p == ".git" or p.startswith(".git/") for p in paths)
    view = http.get(
        "/api/chat/files/content", params={"conversation": cid, "path": "calc/__init__.py"}
    ).json()
    assert "a + b" in view["text"] and "<span" in view["html"]
    _show(client.base, cid)
