"""Plain turns against the scripted fake engine: request shape, events, persistence."""

from __future__ import annotations

from tests.fakes.fake_engine import text_reply


async def test_plain_turn_streams_events_and_persists(chat, client, fake_engine, supervisor):
    fake_engine.push(text_reply("Hello there", pieces=3))
    cid, end = await client.turn("Hi")
    events = client.tap.events[cid]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].delta == {"role": "user", "content": "Hi"}
    assert events[1].delta["role"] == "assistant"
    assert client.tap.text(cid) == "Hello there"
    assert end.finish_reason == "stop"
    assert end.usage["prompt_tokens"] == 20 and end.timings["prompt_n"] == 20
    body = fake_engine.requests[0].json
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    state = await client.state(cid)
    assert [m.role for m in state.messages] == ["system", "user", "assistant"]
    assert state.messages[-1].content == "Hello there"
    assert state.n_ctx == 4096 and state.ctx_used == 25 and state.last_seq == events[-1].seq
    replay = await client.replay(cid)
    assert [e.model_dump() for e in replay.events] == [e.model_dump() for e in events]
    assert supervisor.released == ["l1"]
