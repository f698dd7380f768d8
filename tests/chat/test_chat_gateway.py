"""A multi-turn conversation with tool calls through the whole stack (gateway, supervisor,
chat, recall, perf) on the scripted engine: the supervisor uses it as an engine already
running (``LOKI_ENGINE_URL``). The same path on the real engine is in tests/e2e."""

from __future__ import annotations

import json

from tests.e2e.conftest import StackClient
from tests.fakes.fake_engine import FakeEngine, text_reply, tool_reply


def test_tool_call_turns_through_the_gateway(fake_stack, fake_engine: FakeEngine) -> None:
    port = fake_stack.config.web_port
    client = StackClient(f"http://127.0.0.1:{port}")
    fake_engine.push(
        tool_reply([("call_a", "recall", '{"id": "r999"}')], content="Looking.", split=3),
        text_reply("Nothing archived under r999."),
        text_reply("Second answer"),
    )
    cid = client.send("What is in r999?")
    events = client.events(cid, until_turn_ends=1, timeout=60)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert any("tool_calls" in d for d in deltas)
    tool = [d for d in deltas if d.get("role") == "tool"]
    assert tool and tool[0]["tool_call_id"] == "call_a" and tool[0]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    last = events[-1]["seq"]
    client.send("And then?", cid)
    more = client.events(cid, last_event_id=last, until_turn_ends=1, timeout=60)
    assert more[0]["seq"] == last + 1  # resumed exactly after the last seq seen
    state = client.wait_idle(cid, timeout=30)
    roles = [m["role"] for m in state["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    r1, r2, r3 = (r.body for r in fake_engine.requests[:3])
    sent = json.loads(r2)["messages"]
    assert sent[3]["role"] == "tool" and sent[3]["tool_call_id"] == "call_a"
    assert sent[3]["content"] == tool[0]["content"]  # the recall service answered
    m2 = json.dumps(sent, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    # the real supervisor caps each step at a quarter of the window (issue 23): the
    # cap comes first in the canonical body, the same in every request
    cap = json.loads(r3)["max_tokens"]
    assert cap == json.loads(r2)["max_tokens"] == 4096 // 4  # the fake engine's window
    head = '{"max_tokens":' + str(cap) + ',"messages":'
    assert r3.decode().startswith(head + m2[:-1])  # prefix kept byte for byte
