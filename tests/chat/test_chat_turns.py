"""Turn-loop rules against the scripted fake engine (exact bytes, exact failures)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from loki_chat.context import NoCompaction
from loki_chat.refusal import NO_TOOL_INSTRUCTION
from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.recall import ToolReply, ToolRequest
from tests.fakes.fake_engine import (
    Drop,
    HTTPError,
    Stream,
    chunk,
    error_frame,
    split_writes,
    text_reply,
    tool_reply,
)


def _prefix(body: bytes) -> bytes:
    """The bytes of a request body up to the end of its ``messages`` array's last item."""
    text = body.decode()
    end = json.dumps(
        json.loads(text)["messages"], ensure_ascii=False, sort_keys=True, separators=(",", ":")
    )
    assert text.startswith('{"messages":' + end)
    return ('{"messages":' + end[:-1]).encode()


async def test_prefix_byte_identical_across_turns_and_restarts(
    chat_runner, supervisor, client, fake_engine
):
    svc = await chat_runner.start()
    fake_engine.push(text_reply("Hello"), tool_reply([("c1", "ping", "")]), text_reply("pong!"))
    cid, _ = await client.turn("Hi")
    await client.turn("Ping please", cid)
    r1, r2, r3 = (r.body for r in fake_engine.requests)
    assert r2.startswith(_prefix(r1)) and r3.startswith(_prefix(r2))
    await chat_runner.stop(svc)
    # restart: the next request extends the previous one byte for byte
    await chat_runner.start()
    fake_engine.push(text_reply("again"))
    await client.turn("Third", cid)
    r4 = fake_engine.requests[3].body
    assert r4.startswith(_prefix(r3))
    # same state in a fresh conversation after the restart: identical bytes
    fake_engine.push(text_reply("Hello"))
    cid2, _ = await client.turn("Hi")
    assert fake_engine.requests[4].body == r1
    assert b"\n" not in r1 and b'", "' not in r1  # canonical: no insignificant white space


async def test_main_release_carries_the_prompt_fingerprint(chat, supervisor, client, fake_engine):
    """The release of a turn's lease reports the last fingerprint of the messages it sent
    (SLOT_PERSIST keys slot 0's file by it)."""
    fake_engine.push(text_reply("Hello"))
    await client.turn("Hi")
    sent = fake_engine.requests[0].json["messages"]
    assert [r.prompt_fingerprint for r in supervisor.release_requests] == [fingerprints(sent)[-1]]


async def test_parallel_tool_calls_split_fragments_in_index_order(chat, client, fake_engine):
    fake_engine.push(
        tool_reply(
            [("c0", "echo", '{"text": "first"}'), ("c1", "ping", "")],
            content="Let me check.",
            split=4,
            resend_name=True,
            interleave=True,
        ),
        text_reply("Both done"),
    )
    cid, end = await client.turn("do both")
    assert end.finish_reason == "stop"
    second = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assistant = second[2]
    assert assistant["content"] == "Let me check."
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in assistant["tool_calls"]
    ] == [("c0", "echo", '{"text": "first"}'), ("c1", "ping", "")]
    assert second[3] == {"role": "tool", "tool_call_id": "c0", "content": '{"text": "first"}'}
    assert second[4] == {"role": "tool", "tool_call_id": "c1", "content": "pong"}
    state = await client.state(cid)
    texts = [m.content for m in state.messages if m.role == "assistant"]
    assert texts == ["Let me check.", "Both done"]  # text before the calls stored once
    results = [e for e in client.tap.events[cid] if e.delta.get("role") == "tool"]
    assert [e.delta["tool_call_id"] for e in results] == ["c0", "c1"]
    tools = {t["function"]["name"]: t for t in fake_engine.requests[0].json["tools"]}
    assert tools["ping"]["function"]["parameters"] == {"type": "object", "properties": {}}


async def test_text_form_tool_call_is_executed(chat, client, fake_engine):
    fake_engine.push(
        text_reply('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'),
        text_reply("Echoed"),
    )
    cid, end = await client.turn("echo hi")
    msgs = fake_engine.requests[1].json["messages"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "echo", "arguments": '{"text": "hi"}'}
    assert msgs[3]["role"] == "tool" and msgs[3]["content"] == '{"text": "hi"}'
    assert end.finish_reason == "stop"


async def test_invalid_json_arguments_not_executed_history_keeps_empty_object(
    chat, client, fake_engine
):
    calls = []
    chat.toolbox.specs["echo"].run = lambda a: calls.append(a) or asyncio.sleep(0, "x")
    fake_engine.push(tool_reply([("c0", "echo", '{"text": "unterminated')]), text_reply("ok"))
    cid, _ = await client.turn("go")
    assert calls == []
    msgs = fake_engine.requests[1].json["messages"]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "NOT executed" in msgs[3]["content"] and '{"text": "<string>"}' in msgs[3]["content"]


async def test_long_tool_result_cut_for_model_whole_in_log(chat, client, fake_engine):
    big = "y" * 31_000

    async def big_tool(_):
        return big

    chat.toolbox.specs["ping"].run = big_tool
    fake_engine.push(tool_reply([("c0", "ping", "{}")]), text_reply("ok"))
    cid, _ = await client.turn("big")
    sent = fake_engine.requests[1].json["messages"][3]["content"]
    assert len(sent) < 31_000 and sent.startswith("y" * 30_000) and "cut at 30000" in sent
    shown = [e for e in client.tap.events[cid] if e.delta.get("role") == "tool"][0]
    assert shown.delta["content"] == big
    replayed = [e for e in (await client.replay(cid)).events if e.delta.get("role") == "tool"]
    assert replayed[0].delta["content"] == big
    # replay pages stay under NATS's message size: many big results come back in pages
    for n in range(25):
        fake_engine.push(tool_reply([(f"d{n}", "ping", "{}")]), text_reply("ok"))
    for n in range(25):
        await client.turn(f"big {n}", cid)
    page = await client.replay(cid)
    assert page.more and page.events[-1].seq < page.last_seq
    got, after = [], 0
    while True:
        page = await client.replay(cid, after_seq=after)
        got += page.events
        if not page.more:
            break
        after = page.events[-1].seq
    # every event once, in order, to the last seq (the turns before the last one are
    # compacted, so their merged runs leave gaps in the seqs: docs/behaviour.md)
    seqs = [e.seq for e in got]
    assert seqs == sorted(set(seqs)) and seqs[-1] == page.last_seq
    assert sum(1 for e in got if e.delta.get("role") == "tool") == 26
    assert all(e.delta["content"] == big for e in got if e.delta.get("role") == "tool")


async def test_recall_unreachable_then_reachable(chat, client, fake_engine, nc):
    fake_engine.push(tool_reply([("c0", "recall", '{"id": "r1"}')]), text_reply("sorry"))
    cid, end = await client.turn("recall r1")
    assert "unreachable" in fake_engine.requests[1].json["messages"][3]["content"]
    assert end.finish_reason == "stop"

    async def recall(msg):
        req = ToolRequest.model_validate_json(msg.data)
        await msg.respond(ToolReply(text=f"block {req.arguments['id']}").model_dump_json().encode())

    sub = await nc.subscribe(subjects.RECALL_TOOL, cb=recall)
    await nc.flush()
    fake_engine.push(tool_reply([("c1", "recall", '{"id": "r1"}')]), text_reply("found"))
    await client.turn("again", cid)
    assert fake_engine.requests[3].json["messages"][-1]["content"] == "block r1"
    await sub.unsubscribe()


async def test_mid_stream_error_keeps_partial_marked(chat, client, fake_engine):
    fake_engine.push(
        Stream(
            frames=[
                chunk({"role": "assistant", "content": "Half an "}),
                chunk({"content": "answer"}),
                error_frame("kv cache full"),
            ],
            done=False,
        )
    )
    cid, end = await client.turn("q")
    assert end.finish_reason == "error" and "kv cache full" in end.loki["error"]
    state = await client.state(cid)
    last = state.messages[-1]
    assert last.role == "assistant" and last.content == "Half an answer"
    assert "kv cache full" in last.loki.error
    assert len(fake_engine.requests) == 1  # never retried after the first byte


async def test_stream_without_done_is_an_error_with_partial_kept(chat, client, fake_engine):
    fake_engine.push(Stream(frames=[chunk({"content": "cut he"})], done=False, end="abort"))
    cid, end = await client.turn("q")
    assert (
        end.finish_reason == "error"
        and "DONE" in end.loki["error"]
        or "broken" in end.loki["error"]
    )
    assert (await client.state(cid)).messages[-1].content == "cut he"
    fake_engine.push(Stream(frames=[chunk({"content": "clean end"})], done=False, end="clean"))
    _, end2 = await client.turn("q2", cid)
    assert end2.finish_reason == "error" and "[DONE]" in end2.loki["error"]
    assert len(fake_engine.requests) == 2


async def test_multibyte_character_split_across_network_writes(chat, client, fake_engine):
    frame = chunk({"content": "Grüße 🙂 世界"})
    writes = split_writes(frame, "🙂")
    fake_engine.push(Stream(frames=[writes[0], writes[1], chunk({}, "stop")], delay_s=0.05))
    cid, _ = await client.turn("q")
    assert (await client.state(cid)).messages[-1].content == "Grüße 🙂 世界"


async def test_retry_before_first_byte_then_success(chat, client, fake_engine):
    fake_engine.push(HTTPError(503), Drop(), HTTPError(429), text_reply("finally"))
    cid, end = await client.turn("q")
    assert end.finish_reason == "stop" and len(fake_engine.requests) == 4
    retries = [e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "retry"]
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert len({r.body for r in fake_engine.requests}) == 1  # the same bytes each time


async def test_retry_count_restarts_once_a_response_arrived(chat, client, fake_engine):
    fake_engine.push(
        HTTPError(503),
        HTTPError(503),
        HTTPError(503),
        tool_reply([("c0", "ping", "")]),
        HTTPError(502),
        HTTPError(502),
        HTTPError(502),
        text_reply("done"),
    )
    cid, end = await client.turn("q")
    assert end.finish_reason == "stop" and len(fake_engine.requests) == 8


async def test_retries_exhausted_and_500_not_retried(chat, client, fake_engine):
    fake_engine.push(HTTPError(502), HTTPError(502), HTTPError(504), HTTPError(503))
    cid, end = await client.turn("q")
    assert end.finish_reason == "error" and "503" in end.loki["error"]
    assert len(fake_engine.requests) == 4
    fake_engine.clear()
    chat.toolbox.specs.clear()  # no tools: a 500 has no tool replay either
    fake_engine.push(HTTPError(500, {"error": {"code": 500, "message": "boom"}}))
    _, end = await client.turn("q2", cid)
    assert end.finish_reason == "error" and len(fake_engine.requests) == 1


async def test_retry_delays_default_schedule(chat_runner, supervisor, client, fake_engine):
    await chat_runner.start(retry_delays=[0.8, 1.6, 3.2])
    fake_engine.push(HTTPError(503), HTTPError(503), HTTPError(503), text_reply("ok"))
    await client.turn("q", timeout=30)
    ts = [r.ts for r in fake_engine.requests]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert gaps[0] >= 0.75 and gaps[1] >= 1.55 and gaps[2] >= 3.15


async def test_stop_interrupts_retry_pause(chat_runner, supervisor, client, fake_engine):
    await chat_runner.start(retry_delays=[30.0])
    fake_engine.push(HTTPError(503))
    reply = await client.send("q")
    await fake_engine.await_requests(1)
    t0 = time.monotonic()
    await client.control(reply.conversation, "stop")
    ends = await client.tap.wait_turn_ends(reply.conversation, 1, timeout=5)
    assert ends[0].finish_reason == "stopped" and time.monotonic() - t0 < 5
    assert len(fake_engine.requests) == 1


async def test_500_replay_tool_choice_none_then_no_tools(chat, client, fake_engine):
    fake_engine.push(
        HTTPError(500, {"error": {"code": 500, "message": "Failed to parse tool call"}}),
        text_reply("Plain answer"),
    )
    cid, end = await client.turn("Bonjour")
    first, replay = (r.json for r in fake_engine.requests)
    assert replay["tool_choice"] == "none" and replay["tools"] == first["tools"]
    assert replay["messages"][0] == first["messages"][0]
    assert replay["messages"][-1]["content"].startswith("Bonjour\n\n")
    assert "user's language" in replay["messages"][-1]["content"]
    assert end.finish_reason == "stop"
    state = await client.state(cid)
    assert [m.content for m in state.messages[1:]] == ["Bonjour", "Plain answer"]
    # refused again -> once more without tools; a tool call under "none" -> also no tools
    fake_engine.clear()
    fake_engine.push(HTTPError(500), HTTPError(500), text_reply("no tools answer"))
    _, end = await client.turn("again", cid)
    third = fake_engine.requests[2].json
    assert "tools" not in third and "tool_choice" not in third and end.finish_reason == "stop"
    fake_engine.clear()
    fake_engine.push(HTTPError(500), tool_reply([("x", "ping", "")]), text_reply("fine"))
    _, end = await client.turn("third", cid)
    assert "tools" not in fake_engine.requests[2].json and end.finish_reason == "stop"
    msgs = (await client.state(cid)).messages
    assert all(NO_TOOL_INSTRUCTION not in (m.content or "") for m in msgs)
    assert not any(m.tool_calls for m in msgs)


class RecordingPolicy(NoCompaction):
    def __init__(self, compact_on: set[str] = frozenset()):
        self.calls: list[tuple[str, int]] = []
        self.compact_on = compact_on

    async def maybe_compact(self, view) -> bool:
        self.calls.append((view.trigger, view.ctx_used))
        if view.trigger in self.compact_on and len(view.conversation.messages) > 1:
            del view.conversation.messages[:-1]
            view.conversation.meter.invalidate()
            await view.emit({}, {"event": "compaction", "trigger": view.trigger})
            return True
        return False


async def test_overflow_compacts_then_replays_other_refusals_never(
    chat_runner, supervisor, client, fake_engine
):
    policy = RecordingPolicy({"reactive"})
    await chat_runner.start(policy=policy)
    fake_engine.push(text_reply("one"))
    cid, _ = await client.turn("first")
    overflow = {
        "error": {
            "code": 400,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 4096,
            "message": "the request exceeds the available context size",
        }
    }
    fake_engine.push(HTTPError(400, overflow), text_reply("after compaction"))
    _, end = await client.turn("second", cid)
    assert end.finish_reason == "stop"
    assert [t for t, _ in policy.calls] == ["start", "end", "start", "reactive", "end"]
    assert [m["role"] for m in fake_engine.requests[2].json["messages"]] == ["system", "user"]
    # a refusal that is not an overflow never compacts
    policy.calls.clear()
    fake_engine.push(HTTPError(400, {"error": {"message": "invalid grammar"}}))
    _, end = await client.turn("third", cid)
    assert end.finish_reason == "error" and "reactive" not in [t for t, _ in policy.calls]


async def test_pool_exhaustion_with_two_slots_replayed_as_is(
    chat_runner, supervisor, client, fake_engine
):
    policy = RecordingPolicy({"reactive"})
    supervisor.total_slots = 2
    await chat_runner.start(policy=policy)
    fake_engine.push(
        HTTPError(500, {"error": {"code": 500, "message": "Context size has been exceeded."}}),
        text_reply("ok"),
    )
    cid, end = await client.turn("q")
    assert end.finish_reason == "stop"
    a, b = fake_engine.requests
    assert a.body == b.body and "reactive" not in [t for t, _ in policy.calls]


async def test_reasoning_only_gets_two_act_reminders(chat, client, fake_engine):
    fake_engine.push(
        text_reply("", reasoning="thinking"),
        text_reply("", reasoning="more"),
        text_reply("", reasoning="still"),
    )
    cid, end = await client.turn("Do it")
    assert len(fake_engine.requests) == 3
    # behind the user's message: sent once at its end, never stored, never two user messages
    second = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in second] == ["system", "user"] and "[Loki]" in second[1]["content"]
    msgs = (await client.state(cid)).messages
    assert [m.role for m in msgs] == ["system", "user"] and msgs[1].content == "Do it"


async def test_budget_reminder_persisted_as_sent_and_marked(
    chat_runner, supervisor, client, fake_engine
):
    await chat_runner.start(step_budget=2)
    fake_engine.push(tool_reply([("c0", "ping", "")]), text_reply("final"))
    cid, end = await client.turn("go")
    sent = fake_engine.requests[1].json["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[-1] == {"role": "user", "content": sent[-1]["content"]}  # no mark on the wire
    msgs = (await client.state(cid)).messages
    reminder = msgs[4]
    assert reminder.loki.injected == "budget" and reminder.content == sent[-1]["content"]
    fake_engine.push(text_reply("next"))
    await client.turn("next q", cid)
    assert fake_engine.requests[2].json["messages"][:6] == sent + [
        {"role": "assistant", "content": "final"}
    ]


async def test_unanswered_reminder_removed_on_error(chat_runner, supervisor, client, fake_engine):
    await chat_runner.start(step_budget=2)
    fake_engine.push(
        tool_reply([("c0", "ping", "")]), HTTPError(400, {"error": {"message": "bad"}})
    )
    cid, end = await client.turn("go")
    assert end.finish_reason == "error"
    msgs = (await client.state(cid)).messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool"]


async def test_reasoning_echo_off_and_on(chat_runner, supervisor, client, fake_engine):
    svc = await chat_runner.start()
    fake_engine.push(text_reply("A", reasoning="why"), text_reply("B"))
    cid, _ = await client.turn("q1")
    await client.turn("q2", cid)
    assert "reasoning_content" not in fake_engine.requests[1].body.decode()
    assert (await client.state(cid)).messages[2].reasoning_content is None
    await chat_runner.stop(svc)
    await chat_runner.start(reasoning_echo=True)
    fake_engine.clear()
    overflow = {
        "error": {
            "type": "exceed_context_size_error",
            "message": "exceeds the available context size",
        }
    }
    fake_engine.push(
        text_reply("C", reasoning="because"),
        text_reply("D"),
        HTTPError(400, overflow),
        text_reply("E"),
    )
    cid2, _ = await client.turn("q1")
    await client.turn("q2", cid2)
    sent = fake_engine.requests[1].json["messages"][2]
    assert sent == {"role": "assistant", "content": "C", "reasoning_content": "because"}
    await client.turn("q3", cid2)
    retried = fake_engine.requests[3].json["messages"]
    assert "reasoning_content" not in json.dumps(retried)  # overflow: first retry without it
    supervisor.model = "other-model"
    fake_engine.push(text_reply("F"))
    await client.turn("q4", cid2)
    assert "reasoning_content" not in fake_engine.requests[4].body.decode()


async def test_stop_closes_upstream_and_keeps_partial(chat, client, fake_engine):
    frames = [chunk({"content": f"w{i} "}) for i in range(200)]
    fake_engine.push(Stream(frames=frames, delay_s=0.05))
    reply = await client.send("long")
    cid = reply.conversation
    await client.tap.wait(lambda: len(client.tap.text(cid)) > 6)
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{fake_engine.url}/slots")).json()[0]["is_processing"]
    await client.control(cid, "stop")
    ends = await client.tap.wait_turn_ends(cid, 1, timeout=5)
    assert ends[0].finish_reason == "stopped"
    await fake_engine.await_idle(5)
    assert fake_engine.disconnects == 1
    async with httpx.AsyncClient() as http:
        assert not (await http.get(f"{fake_engine.url}/slots")).json()[0]["is_processing"]
    last = (await client.state(cid)).messages[-1]
    assert last.loki.stopped and last.content.startswith("w0 ")


async def test_queue_fifo_and_concurrent_sends(chat, client, fake_engine):
    fake_engine.push(text_reply("r1", delay_s=0.2), text_reply("r2"), text_reply("r3"))
    first = await client.send("m1")
    cid = first.conversation
    a, b = await asyncio.gather(client.send("m2", cid), client.send("m3", cid))
    assert not first.queued and a.queued and b.queued
    state = await client.state(cid)
    assert state.generating and state.queued == 2
    await client.tap.wait_turn_ends(cid, 3)
    users = [m.content for m in (await client.state(cid)).messages if m.role == "user"]
    assert users[0] == "m1" and sorted(users[1:]) == ["m2", "m3"]
    # FIFO: each request ends with the user message of its turn, in arrival order
    asked = [r.json["messages"][-1]["content"] for r in fake_engine.requests]
    assert asked == users
    msgs = (await client.state(cid)).messages
    assert [m.role for m in msgs[1:]] == ["user", "assistant"] * 3


async def test_lease_slot_and_release_and_perf_record(chat, client, fake_engine, supervisor, nc):
    js = nc.jetstream()
    from loki_shared.perf_publish import ensure_perf_stream

    await ensure_perf_stream(js)
    supervisor.id_slot = 0
    fake_engine.push(text_reply("x"))
    cid, _ = await client.turn("q")
    assert fake_engine.requests[0].json["id_slot"] == 0
    assert supervisor.leases[0].kind == "main" and supervisor.released == ["l1"]
    sub = await js.subscribe(subjects.PERF_RECORD, ordered_consumer=True)
    from loki_shared.fingerprint import fingerprints
    from loki_shared.messages.perf import PerfRecord

    deadline = time.monotonic() + 5
    found = None
    while time.monotonic() < deadline and found is None:
        try:
            msg = await sub.next_msg(timeout=1)
        except Exception:  # noqa: BLE001
            continue
        rec = PerfRecord.model_validate_json(msg.data)
        if rec.conversation == cid:
            found = rec
    assert found is not None
    assert found.kind == "main" and found.timings["prompt_n"] == 20
    assert found.usage["prompt_tokens"] == 20 and found.finish_reason == "stop"
    assert found.fingerprints == fingerprints(fake_engine.requests[0].json["messages"])
    assert found.ttft_ms is not None and found.total_ms >= found.ttft_ms and not found.cut


async def test_conversations_list_rename_export_delete(chat, client, fake_engine, redis_db):
    cid, _ = await client.turn("Title from the first message")
    listed = await client.conversations("list")
    assert [c.id for c in listed.conversations] == [cid]
    assert listed.conversations[0].title == "Title from the first message"
    await client.conversations("rename", conversation=cid, title="Renamed")
    assert (await client.conversations("list")).conversations[0].title == "Renamed"
    export = (await client.conversations("export", conversation=cid)).export
    assert [m["role"] for m in export["messages"]] == ["user", "assistant"] and export["log"]
    created = await client.conversations("create", title="Empty")
    assert created.conversation.title == "Empty"
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_db)
    assert await r.exists(f"loki:chat:conv:{cid}")
    await client.conversations("delete", conversation=cid)
    assert not await r.exists(f"loki:chat:conv:{cid}")
    assert (await client.state(cid)).error.type == "not_found"
    await r.aclose()


async def test_tolerant_final_chunk_and_ctx_used(chat, client, fake_engine):
    fake_engine.push(
        text_reply(
            "ok",
            reasoning="abc",
            pieces=3,
            usage={"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": "59"},
            timings={"cache_n": "bad", "prompt_n": 50, "predicted_n": 9},
        )
    )
    cid, end = await client.turn("q")
    assert end.usage == {"prompt_tokens": 50, "completion_tokens": 9}
    assert end.timings == {"prompt_n": 50, "predicted_n": 9}
    state = await client.state(cid)
    assert state.ctx_used == 50 + 9 - 3  # reasoning pieces not sent back are not counted
    assert end.loki["ctx_used"] == state.ctx_used


async def test_external_api_gets_its_key_and_no_llama_fields(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.external, supervisor.api_key, supervisor.id_slot = True, "ext-key", 0
    await chat_runner.start(
        chat_template_kwargs={"enable_thinking": False}, top_k=20, reasoning_echo=True
    )
    fake_engine.push(text_reply("A", reasoning="r"), HTTPError(500))
    cid, _ = await client.turn("q")
    req = fake_engine.requests[0]
    assert req.headers["authorization"] == "Bearer ext-key"
    for key in ("id_slot", "chat_template_kwargs", "top_k"):
        assert key not in req.json
    _, end = await client.turn("q2", cid)
    # a 500 from an external API is not replayed with tool_choice none
    assert end.finish_reason == "error" and len(fake_engine.requests) == 2
    assert "reasoning_content" not in fake_engine.requests[1].body.decode()


async def test_stop_during_a_tool_keeps_calls_paired_with_results(chat, client, fake_engine):
    started = asyncio.Event()

    async def slow(_):
        started.set()
        await asyncio.sleep(30)
        return "never"

    chat.toolbox.specs["ping"].run = slow
    fake_engine.push(tool_reply([("c0", "ping", ""), ("c1", "echo", '{"text": "x"}')]))
    reply = await client.send("go")
    await asyncio.wait_for(started.wait(), 10)
    await client.control(reply.conversation, "stop")
    ends = await client.tap.wait_turn_ends(reply.conversation, 1, timeout=5)
    assert ends[0].finish_reason == "stopped"
    msgs = (await client.state(reply.conversation)).messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
    assert all("stopped" in m.content for m in msgs[3:]) and len(fake_engine.requests) == 1
