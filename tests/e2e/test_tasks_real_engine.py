"""A scheduled task on the whole stack with the real engine (llama-server, the bundled
model): a person's turn, then a task due every second runs as its own conversation (kind
``task``) and its request reuses the chat's cached prompt prefix (same system message and
tools; the task note is at the head of the user message, not in the system prompt)."""

from __future__ import annotations

import time
from pathlib import Path

from loki_shared import servers

from .conftest import StackClient, make_stack


def test_a_task_runs_on_the_real_engine_and_reuses_the_chats_prefix(tmp_path: Path) -> None:
    port = servers.free_port()
    stack = make_stack(tmp_path / "home", port)
    stack.start()
    try:
        stack.wait_engine_ready(timeout=240)
        client = StackClient(f"http://127.0.0.1:{port}")
        cid = client.send("hi")
        client.wait_idle(cid)
        body = {"name": "tick", "prompt": "Say tick.", "interval_s": 1}
        created = client.http.post("/api/tasks", json=body)
        assert created.status_code == 201, created.text
        task = created.json()["task"]
        deadline = time.monotonic() + 180
        ended: list[dict] = []
        while not ended:
            assert time.monotonic() < deadline, "no run ended in 180 s"
            time.sleep(0.5)
            runs = client.http.get(f"/api/tasks/{task['id']}/runs").json()["runs"]
            ended = [r for r in runs if r["status"] != "running"]
        off = client.http.put(f"/api/tasks/{task['id']}", json={**body, "enabled": False})
        assert off.status_code == 200, off.text
        first = min(ended, key=lambda r: r["due"])
        assert first["status"] == "ok", first
        state = client.wait_idle(first["conversation"], timeout=120)
        roles = [m["role"] for m in state["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant", roles
        assert state["messages"][1]["content"].startswith('[Scheduled task "tick", due ')
        assert state["messages"][-1]["content"].strip()
        person = client.wait_idle(cid)
        assert state["messages"][0] == person["messages"][0]  # the same system message
        deadline = time.monotonic() + 30
        by_kind: dict = {}
        while "task" not in by_kind:  # the perf record comes a moment after the turn
            assert time.monotonic() < deadline, by_kind
            time.sleep(0.5)
            by_kind = client.http.get("/api/perf/summary").json()["detail"]["by_kind"]
        assert by_kind["task"]["completions"] >= 1, by_kind
        # the task's prompt began with the chat's cached prefix: llama-server reused it
        assert by_kind["task"]["cache_n"] > 0, by_kind["task"]
    finally:
        stack.stop()
