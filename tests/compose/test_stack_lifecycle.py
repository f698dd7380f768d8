"""Issue 36, the stack's life on a real Docker engine (after test_stack.py: these restart and
recreate containers): a restart of chat during a reply, ``down`` then ``up``, a backup
restored into a fresh stack, and the Unraid override. Each leaves the stack up and healthy."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace

import pytest

from tests.e2e.conftest import StackClient

from .stack import UNRAID_OVERRIDE, Compose
from .test_stack import client, wait_engine

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1800)]

PASSPHRASE = "compose-check backup passphrase"


def chat_turn(c: StackClient, text: str, conversation: str | None = None) -> str:
    conv = c.send(text, conversation)
    c.events(conv)
    c.wait_idle(conv, timeout=600)
    return conv


def roles(c: StackClient, conv: str) -> list[str]:
    state = c.http.get("/api/chat/state", params={"conversation": conv}).json()
    return [m["role"] for m in state["messages"] if m["role"] != "system"]


def snapshot(compose: Compose, c: StackClient) -> dict:
    """What must survive: the conversations (each one's messages), the presets, and every
    persistent Redis key (the archive's among them), listed as the backup user."""
    ids: list[str] = []
    deadline = time.monotonic() + 120  # after an `up`, until chat lists them again
    while time.monotonic() < deadline:
        r = c.http.get("/api/conversations", params={"kind": "all"})
        ids = sorted(x["id"] for x in r.json()["conversations"]) if r.status_code == 200 else []
        if ids:
            break
        time.sleep(2)
    password = (compose.workdir / "secrets" / "backup" / "loki_redis_password").read_text()
    keys = compose(
        "exec", "-T", "-e", f"REDISCLI_AUTH={password}", "redis",
        "redis-cli", "--user", "backup", "--scan", "--pattern", "loki:*", timeout=60,
    ).split()  # fmt: skip
    return {
        "conversations": {i: roles(c, i) for i in ids},
        "presets": sorted(p["id"] for p in c.http.get("/api/presets").json()["presets"]),
        "redis_keys": sorted(k for k in keys if ":lock" not in k and ":owner" not in k),
    }


def test_restart_chat_during_a_reply_loses_no_persisted_message(compose: Compose) -> None:
    c = client(compose)
    wait_engine(c)
    conv = chat_turn(c, "Reply with one word: first")
    assert roles(c, conv) == ["user", "assistant"]
    c.send("Count slowly from one to twenty, in words.", conversation=conv)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = c.http.get("/api/chat/state", params={"conversation": conv}).json()
        if state.get("generating"):
            break
        time.sleep(0.05)
    compose("restart", "chat", timeout=120)
    compose("up", "--detach", "--wait", "--wait-timeout", "300", "chat", timeout=420)
    deadline = time.monotonic() + 120
    got: list[str] = []
    while time.monotonic() < deadline:
        r = c.http.get("/api/chat/state", params={"conversation": conv})
        if r.status_code == 200:
            got = roles(c, conv)
            if got[:3] == ["user", "assistant", "user"]:
                break
        time.sleep(1)
    assert got[:3] == ["user", "assistant", "user"], got
    # and the conversation goes on
    c.wait_idle(conv, timeout=240)
    chat_turn(c, "One word: again", conv)
    assert roles(c, conv)[-2:] == ["user", "assistant"]


def test_down_then_up_keeps_conversations_archive_and_presets(compose: Compose) -> None:
    c = client(compose)
    wait_engine(c)
    chat_turn(c, "Reply with one word: kept")
    saved = c.http.post(
        "/api/presets",
        json={
            "id": "kept-remote",
            "name": "Kept",
            "external": True,
            "base_url": "http://127.0.0.1:9/v1",
            "api_model": "m",
            "api_key": "sk-kept",
        },
    )
    assert saved.status_code == 200, saved.text
    before = snapshot(compose, c)
    assert before["conversations"] and "kept-remote" in before["presets"], before
    compose("down", timeout=300)
    compose("up", "--detach", "--wait", "--wait-timeout", "600", timeout=720)
    wait_engine(c)
    assert snapshot(compose, c) == before


def test_a_backup_restores_into_a_fresh_stack(compose: Compose) -> None:
    c = client(compose)
    wait_engine(c)
    conv = chat_turn(c, "Reply with one word: backed")
    before = snapshot(compose, c)
    tools = replace(compose, profiles=(*compose.profiles, "tools"))
    env = {**tools.env(), "LOKI_BACKUP_PASSPHRASE": PASSPHRASE}
    backup = compose.workdir / "stack.lokibak"
    with backup.open("wb") as out:
        subprocess.run(
            tools.argv("run", "--rm", "--no-deps", "-T", "-e", "LOKI_BACKUP_PASSPHRASE")
            + ["loki-backup", "create", "-"],
            env=env, stdout=out, check=True, timeout=300, cwd=os.fspath(compose.workdir),
        )  # fmt: skip
    assert backup.stat().st_size > 1000
    compose("down", "--volumes", timeout=300)  # a fresh stack: empty stores and data volume
    compose("up", "--detach", "--wait", "nats", "redis", timeout=300)
    with backup.open("rb") as src:
        subprocess.run(
            tools.argv("run", "--rm", "--no-deps", "-T", "-e", "LOKI_BACKUP_PASSPHRASE")
            + ["loki-backup", "restore", "-"],
            env=env, stdin=src, check=True, timeout=300, cwd=os.fspath(compose.workdir),
        )  # fmt: skip
    compose("up", "--detach", "--wait", "--wait-timeout", "600", timeout=720)
    wait_engine(c)
    after = snapshot(compose, c)
    assert after["conversations"] == before["conversations"]
    assert after["presets"] == before["presets"]
    assert conv in after["conversations"]


def test_the_unraid_override_renders_and_starts(compose: Compose) -> None:
    """``-f docker-compose.yml -f docker-compose.unraid.yml``: appdata bind mounts owned by
    PUID:PGID (99:100), every service healthy, a chat turn through the LAN-published port."""
    compose("down", "--volumes", timeout=300)
    unraid = replace(compose, unraid=True, extra_files=(UNRAID_OVERRIDE,))
    try:
        unraid("up", "--detach", "--wait", "--wait-timeout", "600", timeout=720)
        for row in unraid.ps():
            if row["Service"] in ("loki-init", "loki-secrets"):
                assert row["State"] == "exited" and row.get("ExitCode") == 0, row
            else:
                assert row.get("Health") == "healthy", row
        for name in ("nats", "redis", "chat", "workspace", "engine-supervisor-cpu", "prometheus"):
            assert unraid("exec", "-T", name, "id", "-u", timeout=60).strip() == "99", name
        appdata = compose.workdir / "appdata"
        assert {p.name for p in appdata.iterdir()} >= {
            "nats", "redis", "data", "workspaces", "prometheus",
        }  # fmt: skip
        assert (appdata / "data").stat().st_uid == 99
        assert (appdata / "workspaces").stat().st_uid == 99
        c = client(compose)
        wait_engine(c)
        conv = chat_turn(c, "Reply with one word: unraid")
        assert roles(c, conv) == ["user", "assistant"]
    finally:
        unraid("down", "--volumes", timeout=300)
