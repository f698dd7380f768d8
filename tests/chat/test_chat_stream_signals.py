"""Issue 14, inputs 1 and 2, in the chat service (the scripted fake engine sends the exact
frames of the issue).

1. An error mid-stream in any of its three forms — an ``error:`` SSE field (llama.cpp PR
   #16109), ``event: error``, ``data: {"error": ...}`` — ends the step the same way: step
   error, partial reply kept and marked, ``finish_reason: "error"``, never retried.
2. Two tool calls that share ``index`` 0 with different ids (ollama #15457) are two calls,
   executed in order, two results.
"""

from __future__ import annotations

import json

import pytest

from loki_shared import subjects
from loki_shared.messages.recall import ToolReply, ToolRequest
from tests.fakes.fake_engine import Stream, text_reply

# the frame, verbatim
HEL = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}\n\n'
ERROR = b'{"code":500,"message":"Context size has been exceeded.","type":"server_error"}'
DONE = b"data: [DONE]\n\n"

FORMS = {
    "error field": b"error: " + ERROR + b"\n\n",
    "event: error": b"event: error\ndata: " + ERROR + b"\n\n",
    "data error": b'data: {"error":' + ERROR + b"}\n\n",
}


@pytest.mark.parametrize("form", list(FORMS))
async def test_error_mid_stream_in_every_form_is_a_step_error_with_partial_kept(
    chat, client, fake_engine, form
):
    fake_engine.push(Stream(frames=[HEL, FORMS[form], DONE], done=False))
    cid, end = await client.turn("q")
    assert end.finish_reason == "error", form
    assert "Context size has been exceeded." in end.loki["error"]
    last = (await client.state(cid)).messages[-1]
    assert last.role == "assistant" and last.content == "Hel"  # kept...
    assert "Context size has been exceeded." in last.loki.error  # ...and marked
    assert len(fake_engine.requests) == 1  # never retried


def _call_frame(call_id: str, query: str) -> bytes:
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": "recall_search", "arguments": json.dumps({"query": query})},
    }
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def test_two_tool_calls_sharing_index_0_are_two_calls_two_results(
    chat, client, fake_engine, nc
):
    queries: list[str] = []

    async def recall(msg):
        req = ToolRequest.model_validate_json(msg.data)
        queries.append(req.arguments["query"])
        reply = ToolReply(text=f"hits for {req.arguments['query']}")
        await msg.respond(reply.model_dump_json().encode())

    sub = await nc.subscribe(subjects.RECALL_TOOL, cb=recall)
    await nc.flush()
    try:
        finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
        fake_engine.push(
            Stream(frames=[_call_frame("call_a", "alpha"), _call_frame("call_b", "beta"), finish]),
            text_reply("found both"),
        )
        cid, end = await client.turn("search twice")
    finally:
        await sub.unsubscribe()
    assert end.finish_reason == "stop"
    assert queries == ["alpha", "beta"]  # executed in order
    sent = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in sent[2]["tool_calls"]
    ] == [
        ("call_a", "recall_search", {"query": "alpha"}),
        ("call_b", "recall_search", {"query": "beta"}),
    ]
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("call_a", "hits for alpha"),
        ("call_b", "hits for beta"),
    ]
