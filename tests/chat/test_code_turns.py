"""Code mode in real turns (issue 43): the chat service on the real NATS and Redis, the real
workspace service, the fake supervisor and the scripted fake engine (a model's decisions
scripted: tool calls, answers, verdicts).

The default project's workspace is made beforehand (the ``workspace`` fixture of
tests/chat/conftest.py: by the service, or a bare folder where the sandbox cannot start, so
the file tools work there too); the tests that run
commands (``run``, ``git``, a criterion's command) need the sandbox (bubblewrap able to make
its namespaces here) and are skipped without it — their twin checks the result that says the
sandbox is unavailable."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from loki_chat.code.check import CRITERION_PROMPT
from loki_chat.code.rules import CODE_TOOLS, CRITERIA_KIND
from loki_chat.tools import ToolBox
from loki_shared import subjects
from loki_shared.messages.code import CodeReply, CodeRequest
from loki_shared.messages.workspace import WriteReply, WriteRequest
from tests.chat.test_chat_verify import FROZEN_TURN_REQUEST, loki_events, verdict
from tests.fakes.fake_engine import text_reply, tool_reply


def needs_sandbox(workspace: Any) -> None:
    if not workspace.sandbox.version:
        pytest.skip(f"no sandbox here: {workspace.sandbox.problem}")


async def start(chat_runner, tools: ToolBox | None = None, **over):
    svc = await chat_runner.start(system_prompt="S.", **over)
    svc.toolbox = tools if tools is not None else ToolBox()
    return svc


async def code(client, cid: str, action: str, **kw: Any) -> CodeReply:
    return await client._req(
        subjects.CHAT_CODE, CodeRequest(conversation=cid, action=action, **kw), CodeReply, 30.0
    )


async def new_conversation(client) -> str:
    reply = await client.conversations("create")
    assert reply.error is None
    return reply.conversation.id


async def code_conversation(client) -> str:
    cid = await new_conversation(client)
    reply = await code(client, cid, "mode", mode="code")
    assert reply.error is None and reply.state.mode == "code", reply.error
    return cid


def call(i: int, name: str, **args: Any) -> tuple[str, str, str]:
    return (f"call_{name}_{i}", name, json.dumps(args))


def tool_results(body: dict) -> dict[str, str]:
    """The tool results a request carries, by call id."""
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (polled: what it reads is not an event)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def criteria_states(client, cid: str) -> list[list[str]]:
    return [[c["state"] for c in e["criteria"]] for e in loki_events(client, cid, "criteria")]


async def test_back_in_chat_mode_the_requests_are_byte_identical(
    chat_runner, supervisor, client, fake_engine, workspace
):
    svc = await start(chat_runner)
    cid = await code_conversation(client)
    assert (await code(client, cid, "mode", mode="chat")).state.mode == "chat"
    fake_engine.push(text_reply("4"))
    _, end = await client.turn("What is 2+2?", cid)
    assert end.finish_reason == "stop"
    assert [r.body for r in fake_engine.requests] == [FROZEN_TURN_REQUEST]
    assert [e["mode"] for e in loki_events(client, cid, "mode_changed")] == ["code", "chat"]
    # back to the default state: the stored head carries no code state
    assert "code" not in svc.actors[cid].conv.to_head()


async def test_a_switch_is_one_prompt_change_told_once_and_refused_mid_turn(
    chat_runner, supervisor, client, fake_engine, workspace
):
    from tests.chat.helpers import make_tools

    svc = await chat_runner.start(system_prompt="S.")
    base = [s["function"]["name"] for s in make_tools(svc.request).schemas()]
    cid = await code_conversation(client)
    await code(client, cid, "mode", mode="code")  # the same mode again: nothing
    await client.tap.wait(lambda: bool(loki_events(client, cid, "mode_changed")))
    [changed] = loki_events(client, cid, "mode_changed")
    assert changed["mode"] == "code" and changed["project"] == "default"
    assert "workspace_error" not in changed and "sandbox" in changed
    fake_engine.push(text_reply("Ready.", delay_s=1.0), text_reply("Still."))
    reply = await client.send("Hello", cid)
    await until(lambda: len(supervisor.leases) >= 1)
    refused = await code(client, cid, "mode", mode="chat")  # a turn runs
    assert refused.error is not None and refused.error.type == "conflict"
    await client.tap.wait_turn_ends(reply.conversation, 1)
    await client.turn("Again", cid)
    first, second = (r.json for r in fake_engine.requests)
    for body in (first, second):
        assert body["messages"][0]["content"].startswith("S.\n\nCode mode: you work in")
        names = [t["function"]["name"] for t in body["tools"]]
        assert names == [*base, *CODE_TOOLS]  # appended after the other tools, in order
    # the second request extends the first (the prompt changed once, at the switch)
    assert second["messages"][:2] == first["messages"][:2]
    assert second["tools"] == first["tools"]


async def test_the_file_tools_act_in_the_workspace_and_every_failure_is_a_result(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner)
    cid = await code_conversation(client)
    fake_engine.push(
        tool_reply(
            [
                call(1, "write", path="pkg/hello.py", content="print('hi')\nprint('hi')\n"),
                call(2, "read", path="pkg/hello.py"),
                call(3, "edit", path="pkg/hello.py", old_string="print('hi')", new_string="x"),
                call(4, "edit", path="pkg/hello.py", old_string="absent", new_string="x"),
                call(5, "edit", path="pkg/hello.py", old_string="'hi')\np", new_string="'yo')\np"),
                call(6, "read", path="../../etc/passwd"),
                call(7, "read", path="/etc/passwd"),
                call(8, "list", path="."),
                call(9, "grep", pattern="yo", path="."),
                call(10, "glob", pattern="**/*.py"),
                call(11, "read"),
            ]
        ),
        text_reply("Done."),
    )
    _, end = await client.turn("Write hello.py.", cid)
    assert end.finish_reason == "stop"
    got = tool_results(fake_engine.requests[1].json)
    assert got["call_write_1"] == "Wrote pkg/hello.py (created, 24 bytes)."
    assert got["call_read_2"] == (
        "pkg/hello.py: lines 1-2 of 2\n     1\tprint('hi')\n     2\tprint('hi')"
    )
    for ambiguous_or_absent in (got["call_edit_3"], got["call_edit_4"]):
        assert ambiguous_or_absent.startswith("Error: `edit` failed:")
        assert "Nothing was written" in ambiguous_or_absent
    assert got["call_edit_5"].startswith("Edited pkg/hello.py: 1 replacement(s)")
    for outside in (got["call_read_6"], got["call_read_7"]):
        assert outside.startswith("Error: `read` failed:") and "inside it" in outside
    assert "pkg/hello.py (" in got["call_list_8"]
    assert got["call_grep_9"] == "pkg/hello.py:1: print('yo')"
    assert got["call_glob_10"].startswith("pkg/hello.py")
    assert got["call_read_11"].startswith("Error: `read` needs `path`")
    labels = [
        e.loki["label"]
        for e in client.tap.events[cid]
        if (e.loki or {}).get("event") == "tool_result"
    ]
    assert labels[0] == "write pkg/hello.py" and labels[8] == "grep yo"


async def test_run_and_git_in_the_sandbox(chat_runner, supervisor, client, fake_engine, workspace):
    needs_sandbox(workspace)
    await start(chat_runner)
    cid = await code_conversation(client)
    fake_engine.push(
        tool_reply(
            [
                call(1, "write", path="hello.py", content="print('hi')\n"),
                call(2, "run", command="python3 hello.py; echo done >&2; exit 3"),
                call(3, "run", command="sleep 30", timeout_s=1),
                call(4, "git", op="commit", message="hello"),
                call(5, "git", op="log"),
            ]
        ),
        text_reply("Done."),
    )
    _, end = await client.turn("Write hello.py and run it.", cid)
    assert end.finish_reason == "stop"
    got = tool_results(fake_engine.requests[1].json)
    assert got["call_run_2"].startswith("exit code: 3 | duration:")
    assert "hi" in got["call_run_2"] and "done" in got["call_run_2"]
    assert got["call_run_3"].startswith("killed: timeout")
    assert got["call_git_4"].startswith("exit code: 0")
    assert "hello" in got["call_git_5"]
    [shown] = [
        e.loki["run"]
        for e in client.tap.events[cid]
        if (e.loki or {}).get("label", "").startswith("run python3")
    ]
    assert shown["exit_code"] == 3 and shown["command"].startswith("python3 hello.py")


async def test_without_a_sandbox_run_says_so_and_the_turn_goes_on(
    chat_runner, supervisor, client, fake_engine, workspace
):
    if workspace.sandbox.version:
        pytest.skip("the sandbox works here: test_run_and_git_in_the_sandbox covers run")
    await start(chat_runner)
    cid = await code_conversation(client)
    fake_engine.push(tool_reply([call(1, "run", command="true")]), text_reply("Sorry."))
    _, end = await client.turn("Run it", cid)
    assert end.finish_reason == "stop"
    text = tool_results(fake_engine.requests[1].json)["call_run_1"]
    assert text.startswith("Error: `run` failed:") and "The sandbox cannot run here" in text


async def test_tools_say_when_the_workspace_service_does_not_answer(
    chat_runner, supervisor, client, fake_engine
):
    await start(chat_runner, workspace_timeout_s=0.5)
    cid = await code_conversation(client)  # the switch itself never fails
    await client.tap.wait(lambda: bool(loki_events(client, cid, "mode_changed")))
    [changed] = loki_events(client, cid, "mode_changed")
    assert "did not answer" in changed["workspace_error"]
    fake_engine.push(tool_reply([call(1, "read", path="a.py")]), text_reply("Sorry."))
    _, end = await client.turn("Read a.py", cid)
    assert end.finish_reason == "stop"
    text = tool_results(fake_engine.requests[1].json)["call_read_1"]
    assert "did not answer" in text and "Try again in a moment" in text


async def test_a_failed_command_criterion_gets_one_corrective_round_then_passes(
    chat_runner, supervisor, client, fake_engine, workspace
):
    needs_sandbox(workspace)
    await start(chat_runner)
    cid = await code_conversation(client)
    criteria = [{"text": "done.txt exists", "command": "test -f done.txt"}]
    fake_engine.push(
        tool_reply([call(1, "criteria", action="set", criteria=criteria)]),
        text_reply("Done."),  # not true: the check fails
        tool_reply([call(2, "write", path="done.txt", content="yes\n")]),
        text_reply("Now it is done."),
    )
    _, end = await client.turn("Make done.txt", cid)
    assert end.finish_reason == "stop" and "criteria_failed" not in end.loki
    assert len(fake_engine.requests) == 4
    assert [lease.kind for lease in supervisor.leases] == ["main"] * 4  # no generic verifier
    sent = fake_engine.requests[2].json["messages"]
    assert sent[-1]["role"] == "user" and "c1 [failed] done.txt exists" in sent[-1]["content"]
    assert "exit status 1" in sent[-1]["content"]
    assert criteria_states(client, cid) == [["pending"], ["failed"], ["met"]]
    kept = (await code(client, cid, "get")).state
    assert kept.rounds == 1 and kept.criteria[0].state == "met"


async def test_a_failed_criterion_gets_one_corrective_round_persisted_as_sent(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner, verify=True)  # the generic verifier gives way to the criteria
    cid = await code_conversation(client)
    criteria = [{"text": "the README greets"}]
    fake_engine.push(
        tool_reply([call(1, "criteria", action="set", criteria=criteria)]),
        text_reply("Done."),
        verdict("fail", "there is no README"),
        tool_reply([call(2, "write", path="README.md", content="Hello!\n")]),
        text_reply("Wrote the README."),
        verdict("pass", "it greets"),
    )
    _, end = await client.turn("Write a README that greets", cid)
    assert end.finish_reason == "stop" and "criteria_failed" not in end.loki
    kinds = [lease.kind for lease in supervisor.leases]
    assert kinds == ["main", "main", "verify", "main", "main", "verify"]
    judge = fake_engine.requests[2].json["messages"]
    assert judge[0]["content"] == CRITERION_PROMPT
    assert "<criterion>\nthe README greets\n</criterion>" in judge[1]["content"]
    assert "<answer>\nDone.\n</answer>" in judge[1]["content"]
    assert "<workspace>" in judge[1]["content"]
    sent = fake_engine.requests[3].json["messages"]
    assert sent[-1]["role"] == "user" and sent[-1]["content"].startswith("[Loki] A check")
    assert "c1 [failed] the README greets" in sent[-1]["content"]
    assert "verifier: there is no README" in sent[-1]["content"]
    assert criteria_states(client, cid) == [["pending"], ["failed"], ["met"]]
    assert loki_events(client, cid, "verify") == []
    stored = (await client.state(cid)).messages
    [reminder] = [m for m in stored if m.loki and m.loki.injected == CRITERIA_KIND]
    assert reminder.content == sent[-1]["content"]  # persisted as sent
    kept = (await code(client, cid, "get")).state
    assert kept.rounds == 1 and kept.criteria[0].state == "met"
    assert kept.criteria[0].detail == "verifier: it greets" and kept.criteria[0].checked > 0


async def test_after_the_last_round_the_turn_ends_saying_what_still_fails(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner, code_verify_rounds=1)
    cid = await code_conversation(client)
    reply = await code(client, cid, "criteria", criteria=[{"text": "never holds"}])
    assert reply.state.criteria[0].id == "c1"
    fake_engine.push(
        text_reply("Done."), verdict("fail", "no"), text_reply("Again."), verdict("fail", "no")
    )
    _, end = await client.turn("Do it", cid)
    assert end.finish_reason == "stop" and end.loki["criteria_failed"] == ["c1"]
    assert len(fake_engine.requests) == 4  # one round, never a second
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant", "user", "assistant"]


async def test_a_stop_during_the_check_ends_the_turn_stopped(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner)
    cid = await code_conversation(client)
    await code(client, cid, "criteria", criteria=[{"text": "slow to judge"}])
    fake_engine.push(text_reply("Done."), verdict("pass", "ok", delay_s=5.0))
    reply = await client.send("Do it", cid)
    await until(lambda: [lease.kind for lease in supervisor.leases][-1:] == ["verify"])
    await client.control(cid, "stop")
    [end] = await client.tap.wait_turn_ends(reply.conversation, 1)
    assert end.finish_reason == "stopped"
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert stored[-1].content == "Done."


async def test_the_workspace_agents_md_enters_the_project_block(
    chat_runner, supervisor, client, fake_engine, workspace, nc
):
    from loki_chat.project import BlockView

    svc = await start(chat_runner, proj_snapshot=True)

    async def fetch(project: str) -> BlockView:
        return BlockView(project=project, name="Site", description="A web site.")

    svc.shared.project.fetch = fetch
    svc.shared.project.clock = lambda: "2026-12-01 10:00 UTC"
    cid = await code_conversation(client)

    async def agents(text: str) -> None:
        req = WriteRequest(project="default", op="write", path="AGENTS.md", content=text)
        raw = await nc.request(subjects.WORKSPACE_WRITE, req.model_dump_json().encode(), 10)
        assert WriteReply.model_validate_json(raw.data).error is None

    await agents("Use tabs.\n")
    fake_engine.push(text_reply("ok"), text_reply("ok"))
    await client.turn("Hi", cid)
    first = fake_engine.requests[0].json["messages"][1]["content"]
    assert "Workspace instructions (AGENTS.md at the repository's root):\nUse tabs." in first
    await agents("Use spaces.\n")
    await client.turn("Again", cid)
    sent = fake_engine.requests[1].json["messages"]
    assert sent[1]["content"] == first  # the snapshot is sent byte for byte
    update = sent[-1]["content"]
    assert '<context_update from="loki">' in update
    assert "(as of 2026-12-01 10:00 UTC, full text):\nUse spaces." in update


async def test_a_binary_file_is_refused_with_a_hint_and_preview_gives_the_page_text(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner)
    cid = await code_conversation(client)
    folder = workspace.workspaces.root / "default"
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (folder / "index.html").write_text(
        "<html><head><title>Shop</title></head><body><h1>Hello shop</h1></body></html>"
    )
    fake_engine.push(
        tool_reply([call(1, "read", path="logo.png"), call(2, "preview", path="index.html")]),
        text_reply("Seen."),
    )
    _, end = await client.turn("Look at the logo and the page", cid)
    assert end.finish_reason == "stop"
    got = tool_results(fake_engine.requests[1].json)
    assert got["call_read_1"].startswith("Error: logo.png is not a text file")
    assert "see_image" in got["call_read_1"] and "preview" in got["call_read_1"]
    # the fake lease says the endpoint does not see images: the page as text, no image
    assert got["call_preview_2"].startswith("Page index.html: Shop\n")
    assert "Hello shop" in got["call_preview_2"]
    assert all(
        m["role"] != "user" or isinstance(m["content"], str)
        for m in fake_engine.requests[1].json["messages"]
    )


async def test_check_now_through_the_api_and_refused_while_a_turn_runs(
    chat_runner, supervisor, client, fake_engine, workspace
):
    await start(chat_runner)
    cid = await code_conversation(client)
    none = await code(client, cid, "check")
    assert none.error is not None and none.error.type == "invalid_request"
    await code(client, cid, "criteria", criteria=[{"text": "a README exists"}])
    fake_engine.push(verdict("fail", "no README"))
    checked = await code(client, cid, "check")
    assert checked.error is None
    [c1] = checked.state.criteria
    assert (c1.id, c1.state, c1.detail) == ("c1", "failed", "verifier: no README")
    assert [lease.kind for lease in supervisor.leases] == ["verify"]
    fake_engine.push(text_reply("Working.", delay_s=1.0), verdict("pass", "ok"))
    await client.send("Go", cid)
    await until(lambda: len(supervisor.leases) >= 2)
    busy = await code(client, cid, "check")
    assert busy.error is not None and busy.error.type == "conflict"
    await client.tap.wait_turn_ends(cid, 1)
    assert criteria_states(client, cid) == [["pending"], ["failed"], ["met"]]


async def test_a_request_reaching_another_instance_is_served_by_the_owner(
    chat_runner, supervisor, client, fake_engine, workspace
):
    owner = await start(chat_runner)
    cid = await code_conversation(client)  # owned by the only instance
    other = await start(chat_runner)  # a second instance in the queue group
    assert cid in owner.actors
    await code(client, cid, "criteria", criteria=[{"text": "t", "command": "true"}])
    for _ in range(6):  # the queue group spreads them: each reaches the owner
        got = await code(client, cid, "get")
        assert got.error is None and got.state.mode == "code"
        assert [c.id for c in got.state.criteria] == ["c1"]
    assert owner.actors[cid].conv.code.criteria[0].text == "t" and cid not in other.actors


async def test_a_switch_makes_the_project_workspace_when_it_has_none(
    chat_runner, supervisor, client, fake_engine, workspace
):
    needs_sandbox(workspace)
    await start(chat_runner)
    made = await client.conversations("create", project="web")
    cid = made.conversation.id
    assert not (workspace.workspaces.root / "web").exists()
    reply = await code(client, cid, "mode", mode="code")
    assert reply.state.project == "web"
    await client.tap.wait(lambda: bool(loki_events(client, cid, "mode_changed")))
    [changed] = loki_events(client, cid, "mode_changed")
    assert changed["project"] == "web" and changed["sandbox"].startswith("bubblewrap")
    assert (workspace.workspaces.root / "web" / ".git").is_dir()
    fake_engine.push(tool_reply([call(1, "write", path="a.txt", content="x")]), text_reply("ok"))
    await client.turn("Write a.txt", cid)
    assert (workspace.workspaces.root / "web" / "a.txt").read_text() == "x"
