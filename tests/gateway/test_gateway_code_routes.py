"""The gateway's code-mode routes (issue 43) end to end over real NATS: the gateway
(``python -m loki_gateway``, its own NATS user) against the fake chat peers and the scripted
``loki.chat.code`` / ``loki.workspace.*`` responders of :mod:`tests.gateway.code_peers`
(workspaces are real directories).

- ``/api/chat/mode`` and ``/api/chat/criteria(/check)`` answer the conversation's
  ``CodeState``; the switch is told in the thread (``mode_changed``), refused while a turn
  runs (409);
- ``/api/workspace`` creates a workspace empty or cloned from a local path, never from a URL;
- ``/api/chat/files`` lists the conversation's project's workspace, directories first, ``.git``
  never shown; ``/api/chat/files/content`` gives the text and its colours (spans of Pygments
  classes, the text escaped), a binary file as its type, a long file cut with a note;
- every bad input is an OpenAI-shaped 4xx naming the field to resend."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from typing import Any

import httpx
import pytest

from loki_gateway.routes.workspace import VIEW_CHARS, VIEW_LINES
from tests.fakes.media import png

from .code_peers import CodePeers

KEY = "code-routes-key"


@pytest.fixture(scope="module")
def code(peers, tmp_path_factory) -> Iterator[CodePeers]:
    fake = CodePeers(peers, tmp_path_factory.mktemp("workspaces")).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def api(gateway, code) -> Iterator[httpx.Client]:
    with gateway.client() as client:
        yield client


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"], err
    return err


def last_event(peers, cid: str) -> dict[str, Any]:
    return peers.convs[cid].events[-1].loki or {}


# ---- mode and criteria ----------------------------------------------------------------------
def test_the_mode_is_read_and_switched_and_the_switch_is_told_in_the_thread(api, peers, code):
    cid = peers.new_conv("mode").info.id
    r = api.get("/api/chat/mode", params={"conversation": cid})
    assert r.status_code == 200, r.text
    assert r.json() == {"mode": "chat", "project": None, "criteria": [], "rounds": 0}
    r = api.post("/api/chat/mode", json={"conversation": cid, "mode": "code"})
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "code" and r.json()["project"] == "demo"
    assert last_event(peers, cid) == {"event": "mode_changed", "mode": "code", "project": "demo"}
    assert api.get("/api/chat/mode", params={"conversation": cid}).json()["mode"] == "code"
    code.busy.add(cid)
    err = error_of(api.post("/api/chat/mode", json={"conversation": cid, "mode": "chat"}), 409)
    assert "turn" in err["message"]
    code.busy.discard(cid)
    assert (
        api.post("/api/chat/mode", json={"conversation": cid, "mode": "chat"}).json()["mode"]
        == "chat"
    )


def test_criteria_are_set_checked_and_read_with_their_states(api, peers, code):
    cid = peers.new_conv("criteria").info.id
    body = {
        "conversation": cid,
        "criteria": [
            {"text": "the tests pass", "command": "pytest -q"},
            {"text": "the linter is clean", "command": "ruff check ."},
            {"text": "a README explains it"},
        ],
    }
    r = api.put("/api/chat/criteria", json=body)
    assert r.status_code == 200, r.text
    got = r.json()["criteria"]
    assert [(c["id"], c["state"]) for c in got] == [
        ("c1", "pending"),
        ("c2", "pending"),
        ("c3", "pending"),
    ]
    assert got[0]["command"] == "pytest -q" and got[2]["command"] is None
    assert last_event(peers, cid)["event"] == "criteria"
    code.passing.add("pytest -q")
    r = api.post("/api/chat/criteria/check", json={"conversation": cid})
    assert r.status_code == 200, r.text
    states = {c["id"]: c for c in r.json()["criteria"]}
    assert states["c1"]["state"] == "met" and states["c2"]["state"] == "failed"
    assert "exit code 1" in states["c2"]["detail"] and states["c2"]["checked"] > 0
    again = api.get("/api/chat/criteria", params={"conversation": cid}).json()
    assert [c["state"] for c in again["criteria"]] == ["met", "failed", "failed"]
    assert (
        api.put("/api/chat/criteria", json={"conversation": cid, "criteria": []}).json()["criteria"]
        == []
    )


def test_bad_mode_and_criteria_requests_are_openai_shaped_4xx(api, peers):
    cid = peers.new_conv("bad").info.id
    for bad, param in (
        ({"conversation": cid, "mode": "turbo"}, "mode"),
        ({"conversation": "no such/id", "mode": "code"}, "conversation"),
        ({"mode": "code"}, "conversation"),
        ({"conversation": cid, "mode": "code", "extra": 1}, "extra"),
    ):
        err = error_of(api.post("/api/chat/mode", json=bad), 400)
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
    error_of(api.post("/api/chat/mode", content=b"{nope"), 400)
    assert error_of(api.get("/api/chat/mode"), 400)["param"] == "conversation"
    error_of(api.get("/api/chat/mode", params={"conversation": "nope"}), 404)
    for bad, param in (
        ({"conversation": cid, "criteria": [{"text": ""}]}, "criteria.0.text"),
        ({"conversation": cid, "criteria": [{"text": "x", "cmd": "y"}]}, "criteria.0.cmd"),
        ({"conversation": cid, "criteria": "tests pass"}, "criteria"),
        ({"conversation": cid, "criteria": [{"text": "x"}] * 51}, "criteria"),
    ):
        err = error_of(api.put("/api/chat/criteria", json=bad), 400)
        assert err["param"] == param, err
    error_of(api.post("/api/chat/criteria/check", json={"conversation": "nope"}), 404)


# ---- workspaces ---------------------------------------------------------------------------
def test_a_workspace_is_created_empty_or_cloned_from_a_local_path_never_a_url(api, code, tmp_path):
    r = api.get("/api/workspace", params={"project": "empty1"})
    assert r.status_code == 200 and r.json()["exists"] is False, r.text
    r = api.post("/api/workspace", json={"project": "empty1"})
    assert r.status_code == 201 and r.json()["exists"] is True, r.text
    assert api.get("/api/workspace", params={"project": "empty1"}).json()["exists"] is True
    error_of(api.post("/api/workspace", json={"project": "empty1"}), 409)
    source = tmp_path / "src-repo"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("VALUE = 1\n")
    r = api.post("/api/workspace", json={"project": "cloned1", "clone_from": str(source)})
    assert r.status_code == 201 and r.json()["origin"] == str(source), r.text
    assert (code.workspace("cloned1") / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    for bad, param in (
        ({"project": "x1", "clone_from": "https://example.com/repo.git"}, "clone_from"),
        ({"project": "x1", "clone_from": "relative/path"}, "clone_from"),
        ({"project": "bad id!"}, "project"),
        ({"project": "x1", "command": "rm -rf /"}, "command"),
        ({}, "project"),
    ):
        err = error_of(api.post("/api/workspace", json=bad), 400)
        assert err["param"] == param, err
    assert not code.workspace("x1").exists()
    assert error_of(api.get("/api/workspace", params={"project": "../etc"}), 400)["param"] == (
        "project"
    )


# ---- the file tree and the viewer -----------------------------------------------------------
@pytest.fixture(scope="module")
def tree(peers, code, tmp_path_factory) -> str:
    """A conversation of project ``tree`` whose workspace holds a small package, a .git, a
    binary image, a long file, a hostile HTML file and a symlink out of the workspace."""
    cid = peers.new_conv("tree").info.id
    code.code_mode(cid, "tree")
    ws = code.workspace("tree")
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "src" / "pkg" / "app.py").write_text('def main():\n    return "<b>hi</b>"  # ok\n')
    (ws / "README.md").write_text("# Demo\n")
    (ws / "logo.png").write_bytes(png(8, 8, (200, 10, 10)))
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, VIEW_LINES + 1001)))
    (ws / "wide.txt").write_text(("x" * (VIEW_CHARS // 2) + "\n") * 3)
    (ws / "evil.html").write_text(
        '<script>alert(1)</script>\n<img src=x onerror="alert(2)">\n"quoted" & \'single\'\n'
    )
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text("outside the workspace\n")
    (ws / "escape.txt").symlink_to(secret)
    return cid


def test_the_tree_lists_directories_first_and_never_shows_git(api, tree):
    r = api.get("/api/chat/files", params={"conversation": tree})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["project"] == "tree" and body["path"] == "." and body["truncated"] is False
    paths = [e["path"] for e in body["entries"]]
    assert paths[0] == "src" and "README.md" in paths and "logo.png" in paths
    assert not any(p == ".git" or p.startswith(".git/") for p in paths)
    assert "src/pkg" not in paths  # depth 1: the panel opens a directory when expanded
    kinds = {e["path"]: e["kind"] for e in body["entries"]}
    assert kinds["src"] == "dir" and kinds["README.md"] == "file"
    deep = api.get("/api/chat/files", params={"conversation": tree, "depth": 5}).json()
    deep_paths = [e["path"] for e in deep["entries"]]
    assert "src/pkg/app.py" in deep_paths and not [p for p in deep_paths if ".git" in p]
    sub = api.get("/api/chat/files", params={"conversation": tree, "path": "src/"}).json()
    assert [e["path"] for e in sub["entries"]] == ["src/pkg"] and sub["path"] == "src"


def test_a_file_is_shown_with_its_colours_escaped(api, tree):
    r = api.get("/api/chat/files/content", params={"conversation": tree, "path": "src/pkg/app.py"})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["text"] == 'def main():\n    return "<b>hi</b>"  # ok\n'
    assert view["language"] == "Python" and view["binary"] is False
    assert (view["first_line"], view["last_line"], view["total_lines"]) == (1, 2, 2)
    assert view["truncated"] is False and view["note"] == ""
    assert '<span class="k">def</span>' in view["html"]
    assert "&lt;b&gt;hi&lt;/b&gt;" in view["html"] and "<b>" not in view["html"]
    assert view["html"].count('<span class="line">') == 2
    evil = api.get(
        "/api/chat/files/content", params={"conversation": tree, "path": "evil.html"}
    ).json()
    tags = set(re.findall(r"<[^>]*>", evil["html"]))
    assert tags and all(re.fullmatch(r'<span class="[\w ]+">|</span>', t) for t in tags), tags
    # the text is all there, as text: the HTML without its spans, unescaped, is the file
    assert unescape(re.sub(r"<[^>]*>", "", evil["html"])) + "\n" == evil["text"]
    assert "<script" not in evil["html"] and "<img" not in evil["html"]
    css = api.get("/code-colours.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert ".code-view .k {" in css.text and "prefers-color-scheme: dark" in css.text


def test_binary_long_and_wide_files(api, tree):
    img = api.get("/api/chat/files/content", params={"conversation": tree, "path": "logo.png"})
    assert img.status_code == 200, img.text
    assert img.json()["binary"] is True and img.json()["mime"] == "image/png"
    assert img.json()["text"] == "" and img.json()["html"] == "" and "binary" in img.json()["note"]
    long = api.get("/api/chat/files/content", params={"conversation": tree, "path": "long.txt"})
    view = long.json()
    assert view["truncated"] is True and view["last_line"] == VIEW_LINES
    assert view["total_lines"] == VIEW_LINES + 1000
    assert view["text"].endswith(f"line {VIEW_LINES}\n") and str(VIEW_LINES) in view["note"]
    wide = api.get("/api/chat/files/content", params={"conversation": tree, "path": "wide.txt"})
    view = wide.json()
    assert view["truncated"] is True and len(view["text"]) <= VIEW_CHARS
    assert view["last_line"] == 1 and view["text"].endswith("x\n") and view["note"]


def test_paths_outside_the_workspace_and_conversations_not_in_code_mode(api, peers, code, tree):
    for bad in ("../secret.txt", "/etc/passwd", "src/../../x", ".git/config", ".git"):
        err = error_of(
            api.get("/api/chat/files/content", params={"conversation": tree, "path": bad}), 400
        )
        assert err["param"] == "path", err
        error_of(api.get("/api/chat/files", params={"conversation": tree, "path": bad}), 400)
    error_of(api.get("/api/chat/files/content", params={"conversation": tree, "path": "."}), 400)
    # a symlink out of the workspace: the workspace service refuses it
    error_of(
        api.get("/api/chat/files/content", params={"conversation": tree, "path": "escape.txt"}),
        403,
    )
    error_of(
        api.get("/api/chat/files/content", params={"conversation": tree, "path": "nope.py"}), 404
    )
    error_of(api.get("/api/chat/files", params={"conversation": "nope"}), 404)
    error_of(api.get("/api/chat/files", params={"conversation": tree, "depth": 0}), 400)
    lone = peers.new_conv("chat mode").info.id  # not in code mode: no workspace
    err = error_of(api.get("/api/chat/files", params={"conversation": lone}), 409)
    assert "code mode" in err["message"]
    # nothing was asked of the workspace service for the refused paths
    asked = [r.path for s, r in code.seen if s == "loki.workspace.read"]
    assert not any(".." in p or p.startswith("/") or ".git" in p for p in asked), asked


def test_the_code_routes_are_behind_the_key_and_the_colours_are_not(gateway_factory, code):
    gw = gateway_factory(key=KEY)
    r = httpx.get(gw.url + "/api/chat/mode", params={"conversation": "x"})
    assert r.status_code == 401
    r = httpx.get(gw.url + "/api/chat/files/content", params={"conversation": "x", "path": "a"})
    assert r.status_code == 401
    assert httpx.get(gw.url + "/api/workspace", params={"project": "p"}).status_code == 401
    assert httpx.get(gw.url + "/code-colours.css").status_code == 200
