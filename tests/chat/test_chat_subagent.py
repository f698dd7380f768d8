"""The ``subagent`` tool against the scripted fake engine (tool path, leases, stop)."""

from __future__ import annotations

import asyncio
import json

from loki_chat.subagent import STOPPED
from tests.fakes.fake_engine import Stream, chunk, text_reply, tool_reply


async def start_with_subagent(chat_runner):
    svc = await chat_runner.start()
    svc.toolbox.add(svc.subagent_tool())
    return svc


async def test_subagent_runs_a_fresh_conversation_and_its_answer_is_the_result(
    chat_runner, supervisor, client, fake_engine
):
    await start_with_subagent(chat_runner)
    args = json.dumps({"task": "Find the colour", "context": "The sky."})
    fake_engine.push(
        tool_reply([("c1", "subagent", args)]),  # main: calls the sub-agent
        text_reply("Blue."),  # the sub-agent's answer
        text_reply("The sub-agent says blue."),  # main: the final answer
    )
    cid, end = await client.turn("What colour is the sky?")
    assert end.finish_reason == "stop"
    main1, sub, main2 = (r.json for r in fake_engine.requests)
    assert [lease.kind for lease in supervisor.leases] == ["main", "subagent", "main"]
    assert supervisor.leases[1].conversation == cid
    # a fresh conversation: its own system prompt, the task and context, no main history
    assert [m["role"] for m in sub["messages"]] == ["system", "user"]
    assert sub["messages"][0]["content"] != main1["messages"][0]["content"]
    assert sub["messages"][1]["content"] == "Find the colour\n\nContext:\nThe sky."
    # its tools: the recall tools, never subagent
    assert "subagent" in [t["function"]["name"] for t in main1["tools"]]
    assert [t["function"]["name"] for t in sub["tools"]] == ["recall", "recall_search"]
    # the result, paired with the call
    assert main2["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "Blue."}
    # its events nest under the call in the main log; none is a main-model delta
    nested = [e for e in client.tap.events[cid] if (e.loki or {}).get("event") == "subagent"]
    assert nested and all(e.loki["tool_call_id"] == "c1" and e.delta == {} for e in nested)
    inner = [e.loki["inner"] for e in nested]
    said = [i["delta"].get("content", "") for i in inner if i["delta"].get("role") != "user"]
    assert "".join(said) == "Blue."
    assert inner[0]["delta"] == {"role": "user", "content": sub["messages"][1]["content"]}
    assert inner[-1]["loki"]["event"] == "turn_end"
    assert supervisor.release_requests[1].job_done and not supervisor.release_requests[0].job_done


async def test_stop_during_a_subagent_ends_it_and_the_call_gets_a_result(
    chat_runner, supervisor, client, fake_engine
):
    await start_with_subagent(chat_runner)
    slow = Stream(frames=[chunk({"content": f"w{i} "}) for i in range(200)], delay_s=0.05)
    fake_engine.push(tool_reply([("c1", "subagent", '{"task": "long work"}')]), slow)
    reply = await client.send("delegate")
    cid = reply.conversation
    await client.tap.wait(
        lambda: any((e.loki or {}).get("event") == "subagent" for e in client.tap.events[cid])
    )
    await asyncio.sleep(0.2)
    assert (await client.control(cid, "stop")).ok
    (end,) = await client.tap.wait_turn_ends(cid)
    assert end.finish_reason == "stopped"
    stored = (await client.state(cid)).messages
    assert [m.role for m in stored][-2:] == ["assistant", "tool"]
    assert stored[-1].tool_call_id == "c1" and stored[-1].content == STOPPED
    assert supervisor.held() == 0


async def test_a_subagent_lease_is_job_done_only_on_its_last_request(
    chat_runner, supervisor, client, fake_engine
):
    await start_with_subagent(chat_runner)
    fake_engine.push(
        tool_reply([("c1", "subagent", '{"task": "look it up"}')]),  # main: delegates
        tool_reply([("r1", "recall_search", '{"query": "sky"}')]),  # the sub-agent's tool step
        text_reply("Blue."),  # the sub-agent's answer: its last request
        text_reply("The sub-agent says blue."),
    )
    _, end = await client.turn("What colour is the sky?")
    assert end.finish_reason == "stop"
    kinds = {f"{supervisor.lease_prefix}{i + 1}": r.kind for i, r in enumerate(supervisor.leases)}
    done = [r.job_done for r in supervisor.release_requests if kinds[r.lease_id] == "subagent"]
    assert done == [False, True]  # a step that called a tool leaves the job open
