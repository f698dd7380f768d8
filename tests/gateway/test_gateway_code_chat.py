"""The code-mode routes end to end with the REAL chat and workspace services (issue 43): the
gateway (``python -m loki_gateway``, its own NATS user), the chat service and the workspace
service in process, on the session NATS and Redis; the default project's workspace made on
the host (``git init``), as the chat tests do, so reading works where no sandbox starts.

A conversation is switched to code mode through the API (the chat service's ``CodeState``
comes back, the switch is in the conversation's log as ``mode_changed``), its workspace's tree
and a file are read through the gateway, its criteria set and checked (met / failed where the
sandbox starts; else left pending, the detail saying why), and a check without criteria is the
chat service's 400."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chat.helpers import ChatRunner

from .conftest import launch_gateway

KEY = "code-chat-key"


@pytest.fixture
async def stack(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    from loki_workspace.service import WorkspaceService
    from loki_workspace.settings import Settings

    root = tmp_path / "workspaces"
    default = root / "default"
    default.mkdir(parents=True)
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", "-b", "main", str(default)], check=True)
    (default / "hello.py").write_text('print("hello")  # <greet>\n')
    workspace = WorkspaceService(
        Settings(
            home=tmp_path / "ws-home",
            nats_url=nats_url,
            redis_url=redis_db,
            workspace_root=root,
        )
    )
    await workspace.start()
    runner = ChatRunner(nats_url, redis_db, tmp_path / "home")
    await runner.start()
    gw = launch_gateway(nats_url, tmp_path / "gw-home", KEY)
    try:
        async with httpx.AsyncClient(
            base_url=gw.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
        ) as api:
            yield {"api": api, "gw": gw}
    finally:
        gw.proc.stop()
        await runner.stop_all()
        await workspace.stop()


async def test_a_conversation_in_code_mode_through_the_gateway(stack):
    api: httpx.AsyncClient = stack["api"]
    r = await api.post("/api/conversations", json={})
    assert r.status_code in (200, 201), r.text
    cid = r.json()["conversation"]["id"]
    r = await api.get("/api/chat/mode", params={"conversation": cid})
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "chat" and r.json()["criteria"] == []
    r = await api.get("/api/chat/files", params={"conversation": cid})
    assert r.status_code == 409 and "code mode" in r.json()["error"]["message"], r.text

    r = await api.post("/api/chat/mode", json={"conversation": cid, "mode": "code"})
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "code" and r.json()["project"] == "default"
    log = (await api.get(f"/api/conversations/{cid}/export")).json()["log"]
    switched = [e["loki"] for e in log if (e.get("loki") or {}).get("event") == "mode_changed"]
    assert switched and switched[-1]["mode"] == "code", log

    r = await api.get("/api/chat/files", params={"conversation": cid})
    assert r.status_code == 200, r.text
    assert [e["path"] for e in r.json()["entries"]] == ["hello.py"]
    r = await api.get("/api/chat/files/content", params={"conversation": cid, "path": "hello.py"})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == 'print("hello")  # <greet>\n'
    assert "&lt;greet&gt;" in r.json()["html"] and r.json()["language"] == "Python"

    err = (await api.post("/api/chat/criteria/check", json={"conversation": cid})).json()
    assert err["error"]["type"] == "invalid_request_error" and "criteria" in err["error"]["message"]
    body = {
        "conversation": cid,
        "criteria": [
            {"text": "true holds", "command": "true"},
            {"text": "never", "command": "false"},
        ],
    }
    r = await api.put("/api/chat/criteria", json=body)
    assert r.status_code == 200, r.text
    assert [(c["id"], c["state"]) for c in r.json()["criteria"]] == [
        ("c1", "pending"),
        ("c2", "pending"),
    ]
    sandbox = (await api.get("/api/workspace", params={"project": "default"})).json()["sandbox"]
    r = await api.post("/api/chat/criteria/check", json={"conversation": cid})
    assert r.status_code == 200, r.text
    checked = {c["id"]: c for c in r.json()["criteria"]}
    if sandbox:
        assert checked["c1"]["state"] == "met" and checked["c2"]["state"] == "failed"
    else:  # the check could not be made: left pending, the detail says why
        assert [c["state"] for c in checked.values()] == ["pending", "pending"]
        assert all(c["detail"] for c in checked.values())
    again = (await api.get("/api/chat/criteria", params={"conversation": cid})).json()
    assert again["criteria"] == r.json()["criteria"]

    r = await api.post("/api/chat/mode", json={"conversation": cid, "mode": "chat"})
    assert r.status_code == 200 and r.json()["mode"] == "chat", r.text
