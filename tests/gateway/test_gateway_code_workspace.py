"""The Code panel's workspace routes against the REAL workspace service (issue 43):
``python -m loki_workspace`` logged in as its own NATS and Redis user, the gateway as its own,
on the gateway tests' NATS; only ``loki.chat.code`` is scripted (a conversation in code mode
in a project, :mod:`tests.gateway.code_peers`).

A workspace is created empty and another cloned from a local git repository where the
service's sandbox starts (elsewhere the refusal says why); the tree of a conversation's
workspace lists its files (never ``.git``); a Python file comes back with its text and colours;
a binary file says its type; a symlink out of the workspace is refused by the service (its
text never sent) and ``..``, an absolute path and ``.git`` by the gateway (400)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loki_shared import servers
from tests.conftest import login_env, plain_url
from tests.fakes.media import png

from .code_peers import CodePeers


@pytest.fixture(scope="module")
def workspace_service(gw_nats, redis_url, tmp_path_factory) -> Iterator[Path]:
    """``python -m loki_workspace`` on the gateway tests' NATS; yields its workspaces'
    folder."""
    home = tmp_path_factory.mktemp("gw-ws-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        login_env("workspace"),
        LOKI_NATS_URL=plain_url(gw_nats),
        LOKI_REDIS_URL=plain_url(redis_url),
        LOKI_HOME=str(home),
        LOKI_STOP_TIMEOUT_S="5",
        PYTHONUNBUFFERED="1",
    )
    proc = servers.ManagedProcess("workspace", [sys.executable, "-m", "loki_workspace"], env=env)
    proc.start()
    try:
        yield home / "workspaces"
    finally:
        proc.stop(grace=5)


@pytest.fixture(scope="module")
def code(peers, workspace_service, tmp_path_factory) -> Iterator[CodePeers]:
    fake = CodePeers(peers, workspace_service, serve_workspace=False).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def api(gateway, code) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        # the service answers once it is up (its health may say "no sandbox here": the file
        # routes do not need one)
        deadline = time.monotonic() + 60
        while client.get("/api/workspace", params={"project": "probe"}).status_code != 200:
            assert time.monotonic() < deadline, "the workspace service never answered"
            time.sleep(0.3)
        yield client


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["message"] and err["type"], err
    return err


def _git_repo(path: Path) -> Path:
    """A small git repository at ``path`` with one commit."""
    (path / "calc").mkdir(parents=True)
    (path / "calc" / "__init__.py").write_text("")
    (path / "calc" / "ops.py").write_text("def add(a, b):\n    return a + b  # <sum>\n")
    (path / "logo.png").write_bytes(png(8, 8))
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", "-C", str(path), *argv], check=True, env=env)
    return path


def test_a_workspace_is_created_and_cloned_where_the_sandbox_starts_else_refused_why(api, tmp_path):
    """The service makes a workspace with git in its sandbox: where none starts here (its
    info's ``sandbox`` is empty) the gateway relays its refusal (503 ``unavailable``, saying
    why) and nothing is made."""
    assert api.get("/api/workspace", params={"project": "gwempty"}).json()["exists"] is False
    sandbox = api.get("/api/workspace", params={"project": "probe"}).json()["sandbox"]
    source = _git_repo(tmp_path / "source")
    if not sandbox:
        err = error_of(api.post("/api/workspace", json={"project": "gwempty"}), 503)
        assert err["code"] == "unavailable" and "sandbox" in err["message"], err
        assert api.get("/api/workspace", params={"project": "gwempty"}).json()["exists"] is False
        return
    r = api.post("/api/workspace", json={"project": "gwempty"})
    assert r.status_code == 201, r.text
    assert r.json()["exists"] is True and r.json()["origin"] == ""
    error_of(api.post("/api/workspace", json={"project": "gwempty"}), 409)
    r = api.post("/api/workspace", json={"project": "gwclone1", "clone_from": str(source)})
    assert r.status_code == 201, r.text
    assert r.json()["exists"] is True and r.json()["head"] and r.json()["origin"]


def test_a_conversations_workspace_is_browsed_and_read(api, peers, code, tmp_path):
    # the workspace made on the host (a clone), as the chat tests do: reading needs no sandbox
    source = _git_repo(tmp_path / "source")
    ws = code.workspace("gwclone")
    ws.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(source), str(ws)], check=True)
    cid = peers.new_conv("real workspace").info.id
    code.code_mode(cid, "gwclone")
    info = api.get("/api/workspace", params={"project": "gwclone"}).json()
    assert info["exists"] is True and info["branch"] == "main" and info["head"]
    r = api.get("/api/chat/files", params={"conversation": cid, "depth": 3})
    assert r.status_code == 200, r.text
    paths = [e["path"] for e in r.json()["entries"]]
    assert "calc/ops.py" in paths and "logo.png" in paths and paths[0] == "calc"
    assert not [p for p in paths if p == ".git" or p.startswith(".git/")]

    r = api.get("/api/chat/files/content", params={"conversation": cid, "path": "calc/ops.py"})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["text"] == "def add(a, b):\n    return a + b  # <sum>\n"
    assert view["language"] == "Python" and '<span class="k">def</span>' in view["html"]
    assert "&lt;sum&gt;" in view["html"] and "<sum>" not in view["html"]

    r = api.get("/api/chat/files/content", params={"conversation": cid, "path": "logo.png"})
    assert r.status_code == 200 and r.json()["binary"] is True, r.text
    assert r.json()["mime"] == "image/png"

    outside = tmp_path / "secret.txt"
    outside.write_text("not yours\n")
    (ws / "escape.txt").symlink_to(outside)
    r = api.get("/api/chat/files/content", params={"conversation": cid, "path": "escape.txt"})
    assert r.status_code == 403 and "not yours" not in r.text, r.text
    for bad in ("../secret.txt", "/etc/passwd", ".git/config"):
        r = api.get("/api/chat/files/content", params={"conversation": cid, "path": bad})
        assert error_of(r, 400)["param"] == "path"
    error_of(
        api.get("/api/chat/files/content", params={"conversation": cid, "path": "nope.py"}), 404
    )
