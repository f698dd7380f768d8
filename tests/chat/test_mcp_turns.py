"""MCP tools in turns (issue 42): real MCP servers written with the SDK
(``tests/fakes/mcp_server.py``: stdio, started by chat from ``LOKI_HOME/mcp.json``, and
Streamable HTTP on a loopback port, added through ``loki.chat.mcp``), the scripted fake engine
calling their tools through an in-process chat service on the real NATS and Redis.

Covered: the tools follow the built-ins (servers by name, tools by name), arguments passed
through, names sanitised, a tool's error, a slow tool past ``LOKI_MCP_TIMEOUT_S``, a server
that dies mid-call, a 1 MB result (cut in the model's view, whole in the display log), a
server that goes down keeping its tools (the same tools, byte for byte, in every request, after
a restart of chat too), a tool list that changes mid-conversation (told once, its fingerprint
in the perf records), a server off for the conversation's project."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from loki_chat.mcp import connection
from loki_shared import subjects
from loki_shared.messages.mcp import McpReply, McpRequest, McpServerSpec
from loki_shared.messages.perf import PerfRecord
from loki_shared.messages.recall import DEFAULT_PROJECT
from tests.fakes.fake_engine import text_reply, tool_reply
from tests.fakes.mcp_server import SERVER, SLOW

OWN = ["big", "die", "echo", "fail", "get_weather_now", "grow", "picture", "slow"]


def write_stdio(home: Path, name: str = "local", **extra: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    entry = {"command": sys.executable, "args": [str(SERVER), "stdio"], **extra}
    (home / "mcp.json").write_text(json.dumps({"servers": {name: entry}}))


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools") or []]


def last_content(request: Any) -> str:
    return request.json["messages"][-1]["content"]


def tools_bytes(request: Any) -> bytes:
    """The ``tools`` array of a request as sent (the body is canonical JSON: the array's
    bytes run from ``"tools":`` to the key that follows it)."""
    body: bytes = request.body
    start = body.index(b'"tools":')
    end = body.index(b"]", body.rindex(b'"type":"function"'))
    return body[start : end + 1]


async def mcp(nc: Any, **fields: Any) -> McpReply:
    raw = await nc.request(
        subjects.CHAT_MCP, McpRequest(**fields).model_dump_json().encode(), timeout=SLOW
    )
    return McpReply.model_validate_json(raw.data)


@pytest.fixture
async def mcp_chat(chat_runner, supervisor):
    """A chat service whose MCP calls may take the loaded machine's time."""
    return await chat_runner.start(mcp_timeout_s=90.0)


async def test_stdio_tools_follow_the_builtins_and_get_their_arguments(
    chat_runner, mcp_chat, client, fake_engine
):
    write_stdio(chat_runner.home)
    builtins = list(mcp_chat.toolbox.specs)
    fake_engine.push(
        tool_reply([("c1", "local__echo", '{"text": "hé \\"x\\"", "count": 3}')]),
        text_reply("done"),
        tool_reply([("c2", "local__fail", '{"reason": "no such city"}')]),
        tool_reply([("c3", "local__get_weather_now", '{"city": "Oslo"}')]),
        text_reply("ok"),
    )
    cid, end = await client.turn("go", timeout=SLOW)
    assert end.finish_reason == "stop"
    reqs = fake_engine.requests
    assert tool_names(reqs[0]) == [*builtins, *(f"local__{n}" for n in OWN)]
    echo = next(t for t in reqs[0].json["tools"] if t["function"]["name"] == "local__echo")
    params = echo["function"]["parameters"]
    assert params["type"] == "object" and set(params["properties"]) == {"text", "count"}
    assert params["required"] == ["text"] and echo["function"]["description"].startswith("Echo")
    assert json.loads(last_content(reqs[1])) == {"text": 'hé "x"', "count": 3}
    await client.turn("again", cid, timeout=SLOW)
    failed = last_content(reqs[3])
    assert (
        failed.startswith("Error: `local__fail` reported an error: ") and "no such city" in failed
    )
    assert last_content(reqs[4]) == "sunny in Oslo"
    assert end.finish_reason == "stop" and len(reqs) == 5
    assert len({tools_bytes(r) for r in reqs}) == 1  # the same tools, byte for byte


async def test_slow_tool_times_out_and_a_dying_server_is_a_result(
    chat_runner, mcp_chat, client, fake_engine, monkeypatch
):
    write_stdio(chat_runner.home)
    monkeypatch.setattr(connection, "RETRY_S", 1e9)  # a server down stays down here
    fake_engine.push(tool_reply([("c1", "local__echo", '{"text": "warm"}')]), text_reply("ok"))
    cid, _ = await client.turn("warm up", timeout=SLOW)
    # connected: the calls from now on are bounded by one second
    mcp_chat.mcp.timeout_s = 1.0
    for conn in mcp_chat.mcp.connections.values():
        conn.timeout_s = 1.0
    fake_engine.push(tool_reply([("c2", "local__slow", '{"seconds": 60}')]), text_reply("ok"))
    _, end = await client.turn("slow", cid, timeout=SLOW)
    reqs = fake_engine.requests
    assert end.finish_reason == "stop"
    assert last_content(reqs[3]).startswith("Error: `local__slow` did not answer within 1 s")
    fake_engine.push(tool_reply([("c3", "local__die", "{}")]), text_reply("ok"))
    _, end = await client.turn("die", cid, timeout=SLOW)
    assert end.finish_reason == "stop"
    assert last_content(reqs[5]).startswith("Error: the MCP server `local` stopped during")
    fake_engine.push(tool_reply([("c4", "local__echo", '{"text": "x"}')]), text_reply("ok"))
    _, end = await client.turn("after", cid, timeout=SLOW)
    assert "`local` is unavailable" in last_content(reqs[7]) and "NOT run" in last_content(reqs[7])
    assert len({tools_bytes(r) for r in reqs}) == 1  # still listed, unchanged


async def test_http_server_big_result_then_down_keeps_its_tools_across_a_restart(
    chat_runner, mcp_chat, client, fake_engine, nc, http_mcp
):
    url, proc = http_mcp(env={"MCP_TOKEN": "tok-1"})
    spec = McpServerSpec(name="remote", url=url, headers={"Authorization": "Bearer tok-1"})
    reply = await mcp(nc, action="add", spec=spec)
    assert reply.error is None and reply.servers[0].state == "up", reply
    assert reply.servers[0].header_names == ["Authorization"]
    assert "tok-1" not in reply.model_dump_json()
    fake_engine.push(tool_reply([("c1", "remote__big", '{"size": 1000000}')]), text_reply("ok"))
    cid, _ = await client.turn("big", timeout=SLOW)
    reqs = fake_engine.requests
    sent = last_content(reqs[1])
    assert len(sent) < 31_000 and "cut at 30000 of 1000000" in sent
    live = [e for e in client.tap.events[cid] if e.delta.get("role") == "tool"]
    assert len(live[0].delta["content"]) == 1_000_000  # the UI gets it whole
    got, after = [], 0
    while True:  # and the display log keeps it whole
        page = await client.replay(cid, after_seq=after)
        got += [e for e in page.events if e.delta.get("role") == "tool"]
        if not page.more:
            break
        after = page.events[-1].seq
    assert len(got[0].delta["content"]) == 1_000_000
    proc.kill()
    proc.wait()
    fake_engine.push(tool_reply([("c2", "remote__echo", '{"text": "x"}')]), text_reply("ok"))
    _, end = await client.turn("again", cid, timeout=SLOW)
    assert end.finish_reason == "stop"
    assert last_content(reqs[3]).startswith("Error: the MCP server `remote`")
    # a restart of chat while the server is down: its last known tools are still offered
    await chat_runner.stop(mcp_chat)
    await chat_runner.start(mcp_timeout_s=5.0)
    fake_engine.push(text_reply("fine"))
    await client.turn("after restart", cid, timeout=SLOW)
    assert len(reqs) == 5 and len({tools_bytes(r) for r in reqs}) == 1


async def test_a_tool_list_change_is_told_once_and_fingerprinted_for_perf(
    chat_runner, mcp_chat, client, fake_engine, nc
):
    records: list[PerfRecord] = []

    async def on_record(msg: Any) -> None:
        records.append(PerfRecord.model_validate_json(msg.data))

    await nc.subscribe(subjects.PERF_RECORD, cb=on_record)
    write_stdio(chat_runner.home)
    fake_engine.push(tool_reply([("c1", "local__grow", "{}")]), text_reply("grown"))
    cid, _ = await client.turn("grow", timeout=SLOW)
    reqs = fake_engine.requests
    assert "local__extra" not in tool_names(reqs[0])
    for _ in range(100):  # the server told the client; the new listing arrives
        if any(t.name == "extra" for t in mcp_chat.mcp.known.get("local", [])):
            break
        await asyncio_sleep(0.1)
    fake_engine.push(text_reply("a"), text_reply("b"))
    await client.turn("next", cid, timeout=SLOW)
    await client.turn("and next", cid, timeout=SLOW)
    assert "local__extra" in tool_names(reqs[-1])
    assert (
        tool_names(reqs[-1]).index("local__extra") == tool_names(reqs[-1]).index("local__echo") + 1
    )
    told = [
        e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "tools_changed"
    ]
    assert told == [
        {"event": "tools_changed", "added": ["local__extra"], "removed": [], "changed": []}
    ]
    for _ in range(100):
        if len([r for r in records if r.conversation == cid]) >= len(reqs):
            break
        await asyncio_sleep(0.1)
    prints = [r.tools_fingerprint for r in records if r.conversation == cid and r.kind == "main"]
    assert prints[0] and prints[-1] and prints[0] != prints[-1]
    assert prints[-1] == prints[-2]  # unchanged since: the same fingerprint


async def test_a_server_off_for_the_project_adds_nothing(
    chat_runner, mcp_chat, client, fake_engine
):
    write_stdio(chat_runner.home, projects_off=[DEFAULT_PROJECT])
    fake_engine.push(text_reply("hi"))
    await client.turn("hello", timeout=SLOW)
    assert tool_names(fake_engine.requests[0]) == list(mcp_chat.toolbox.specs)


async def asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def test_an_image_result_goes_through_the_image_path_only_with_vision(
    chat_runner, mcp_chat, client, fake_engine, supervisor
):
    write_stdio(chat_runner.home)
    supervisor.vision = True
    fake_engine.push(tool_reply([("c1", "local__picture", "{}")]), text_reply("a dot"))
    cid, _ = await client.turn("show me", timeout=SLOW)
    step2 = fake_engine.requests[1].json["messages"]
    assert step2[-2]["role"] == "tool" and "shown in the next message" in step2[-2]["content"]
    image = step2[-1]["content"][1]
    assert step2[-1]["role"] == "user" and image["type"] == "image_url"
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    supervisor.vision = False
    fake_engine.push(tool_reply([("c2", "local__picture", "{}")]), text_reply("no dot"))
    await client.turn("again", cid, timeout=SLOW)
    step4 = fake_engine.requests[3].json["messages"]
    assert step4[-1]["role"] == "tool" and "does not see images" in step4[-1]["content"]
