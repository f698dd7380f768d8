"""``/api/tasks`` through the gateway (a ``python -m loki_gateway`` subprocess) to the real
chat service (in process) on the real NATS and Redis: the CRUD routes, a run listed with its
conversation, and OpenAI-shaped 4xx for a bad cron expression, interval, time zone or id."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.chat.helpers import ChatRunner
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.fake_supervisor import FakeSupervisor
from tests.gateway.conftest import Gateway, launch_gateway


@pytest.fixture(scope="module")
def gw(nats_url: str, redis_url: str, tmp_path_factory: Any) -> Any:
    """One gateway for the module (it keeps no task state: every route asks the chat)."""
    gateway = launch_gateway(nats_url, tmp_path_factory.mktemp("gw"), None, None, redis_url)
    yield gateway
    gateway.proc.stop()


async def call(gw: Gateway, method: str, path: str, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, timeout=15) as http:
        return await http.request(method, path, **kw)


async def until_a_run_is_ok(gw: Gateway, task_id: str) -> list[dict[str, Any]]:
    """The task's runs once one of them ended ``ok`` (15 s at most)."""
    deadline = time.monotonic() + 15
    runs: list[dict[str, Any]] = []
    while not any(r["status"] == "ok" for r in runs):
        assert time.monotonic() < deadline, runs
        await asyncio.sleep(0.2)
        runs = (await call(gw, "GET", f"/api/tasks/{task_id}/runs")).json()["runs"]
    return runs


def assert_openai_error(resp: httpx.Response, status: int, says: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert {"message", "type", "code"} <= set(error)
    assert error["type"] == "invalid_request_error"  # as OpenAI's own 404 of a missing object
    assert says in error["message"], error


async def test_task_routes_create_list_run_replace_delete(
    chat_runner: ChatRunner, supervisor: FakeSupervisor, fake_engine: FakeEngine, gw: Gateway
) -> None:
    await chat_runner.start(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0)
    body = {"name": "tick", "prompt": "Say tick.", "interval_s": 1, "tz": "Europe/Paris"}
    created = await call(gw, "POST", "/api/tasks", json=body)
    assert created.status_code == 201, created.text
    task = created.json()["task"]
    assert task["interval_s"] == 1 and task["tz"] == "Europe/Paris" and task["enabled"]
    listed = (await call(gw, "GET", "/api/tasks")).json()["tasks"]
    assert [t["id"] for t in listed] == [task["id"]]
    runs = await until_a_run_is_ok(gw, task["id"])
    ok = next(r for r in runs if r["status"] == "ok")
    # the run's conversation opens like any other, its user message led by the task note
    conv = await call(gw, "GET", "/api/chat/state", params={"conversation": ok["conversation"]})
    assert conv.status_code == 200, conv.text
    users = [m for m in conv.json()["messages"] if m["role"] == "user"]
    assert users[0]["content"].startswith('[Scheduled task "tick", due ')
    assert users[0]["content"].endswith("\n\nSay tick.")
    off = {**body, "enabled": False, "prompt": "Say tock."}
    replaced = await call(gw, "PUT", f"/api/tasks/{task['id']}", json=off)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["task"]["enabled"] is False
    got = (await call(gw, "GET", f"/api/tasks/{task['id']}")).json()["task"]
    assert got["prompt"] == "Say tock." and got["created"] == task["created"]
    deleted = await call(gw, "DELETE", f"/api/tasks/{task['id']}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] == task["id"]
    assert_openai_error(await call(gw, "GET", f"/api/tasks/{task['id']}"), 404, "no task")
    assert (await call(gw, "GET", "/api/tasks")).json()["tasks"] == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "x", "cron": "61 * * * *"}, "'cron' is not a valid cron expression"),
        ({"prompt": "x", "interval_s": 0}, "'interval_s' must be at least 1"),
        ({"prompt": "x", "interval_s": 5, "tz": "Mars/Olympus"}, "'tz' is not a known time zone"),
        ({"prompt": "x"}, "exactly one of 'cron'"),
        ({"prompt": "", "interval_s": 5}, "prompt"),
        ({"prompt": "x", "interval_s": "often"}, "interval_s"),
        ({"prompt": "x", "cron": "0 0 30 2 *"}, "can never fire"),
        ({"prompt": "x", "cron": "0 0 9 * * 1"}, "has 6 fields, not 5"),
    ],
)
async def test_bad_task_bodies_are_openai_shaped_400s(
    chat_runner: ChatRunner, gw: Gateway, body: dict[str, Any], says: str
) -> None:
    await chat_runner.start()
    assert_openai_error(await call(gw, "POST", "/api/tasks", json=body), 400, says)
    assert (await call(gw, "GET", "/api/tasks")).json()["tasks"] == []


async def test_a_malformed_or_unknown_task_id(chat_runner: ChatRunner, gw: Gateway) -> None:
    await chat_runner.start()
    assert_openai_error(await call(gw, "GET", "/api/tasks/" + "0" * 32), 404, "no task")
    bad = await call(gw, "GET", "/api/tasks/not-an-id")
    assert bad.status_code in (400, 404, 422) and "error" in bad.json()
    spec = {"prompt": "x", "interval_s": 5}
    assert_openai_error(await call(gw, "PUT", "/api/tasks/" + "1" * 32, json=spec), 404, "no task")


async def test_task_run_conversations_are_listed_apart(
    chat_runner: ChatRunner, supervisor: FakeSupervisor, fake_engine: FakeEngine, gw: Gateway
) -> None:
    """The sidebar's list (``GET /api/conversations``) holds the person's conversations
    only; a task's runs are listed with ``kind=task`` (or ``all``) and still open."""
    await chat_runner.start(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0)
    mine = (await call(gw, "POST", "/api/conversations", json={"title": "mine"})).json()
    mine_id = mine["conversation"]["id"]
    assert mine["conversation"]["kind"] == "main"
    body = {"name": "tock", "prompt": "Say tock.", "interval_s": 1, "enabled": True}
    task = (await call(gw, "POST", "/api/tasks", json=body)).json()["task"]
    runs = await until_a_run_is_ok(gw, task["id"])
    await call(gw, "DELETE", f"/api/tasks/{task['id']}")
    run_ids = {r["conversation"] for r in runs if r["conversation"]}

    def listed(resp: httpx.Response) -> dict[str, str]:
        assert resp.status_code == 200, resp.text
        return {c["id"]: c["kind"] for c in resp.json()["conversations"]}

    sidebar = listed(await call(gw, "GET", "/api/conversations"))
    assert sidebar == {mine_id: "main"}
    tasks = listed(await call(gw, "GET", "/api/conversations", params={"kind": "task"}))
    assert run_ids and run_ids <= set(tasks) and set(tasks.values()) == {"task"}
    every = listed(await call(gw, "GET", "/api/conversations", params={"kind": "all"}))
    assert set(every) == {mine_id, *tasks}
    ok = next(r for r in runs if r["status"] == "ok")
    state = await call(gw, "GET", "/api/chat/state", params={"conversation": ok["conversation"]})
    assert state.status_code == 200, state.text


async def test_preview_checks_a_schedule_and_gives_its_next_three_runs(
    chat_runner: ChatRunner, gw: Gateway
) -> None:
    await chat_runner.start()
    body = {"cron": "30 8 * * 1-5", "tz": "America/New_York"}
    resp = await call(gw, "POST", "/api/tasks/preview", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert got["tz"] == "America/New_York" and len(got["next_runs"]) == 3
    for run in got["next_runs"]:
        assert run["local"][11:16] == "08:30" and run["local"][-6:] in ("-05:00", "-04:00")
        assert datetime.fromisoformat(run["local"]).timestamp() == run["at"]
    for bad, says in (
        ({"cron": "0 0 30 2 *"}, "can never fire"),
        ({"cron": "0 0 9 * * 1"}, "has 6 fields, not 5"),
        ({"interval_s": 5, "tz": "Mars/Olympus"}, "'tz' is not a known time zone"),
        ({"interval_s": 10**15}, "'interval_s' must be at most"),
        ({"cron": "0 9 * * 1", "tz": "../../etc/passwd"}, "'tz' is not a known time zone"),
        ({"cron": "0 9 * * 1\u0000"}, "'cron'"),
    ):
        assert_openai_error(await call(gw, "POST", "/api/tasks/preview", json=bad), 400, says)
    assert (await call(gw, "GET", "/api/tasks")).json()["tasks"] == []
