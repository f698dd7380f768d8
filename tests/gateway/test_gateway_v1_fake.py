"""``/v1`` edge cases against the scripted fake engine (exact bytes in and out)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.fakes.fake_engine import (
    FakeEngine,
    HTTPError,
    Stream,
    chunk,
    error_frame,
    split_writes,
    text_reply,
    tool_reply,
)
from tests.fakes.gateway_peers import FakePeers

ENGINE_KEY = "engine-only-key-42"
CLIENT_KEY = "client-side-key-99"


@pytest.fixture(scope="module")
def engine():
    with FakeEngine() as fake:
        yield fake


@pytest.fixture(scope="module")
def peers(gw_nats, engine):
    fake = FakePeers(gw_nats, engine.url, id_slot=1)
    fake.api_key = ENGINE_KEY
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def oai(gateway, engine):
    engine.clear()
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
    )


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


ASK = [{"role": "user", "content": "hi"}]


def test_id_slot_is_the_leases_and_only_the_engine_key_goes_upstream(oai, engine, peers):
    engine.push(text_reply("ok"))
    list(
        oai.chat.completions.create(model="m", messages=ASK, stream=True, extra_body={"id_slot": 0})
    )
    req = engine.requests[-1]
    assert req.json["id_slot"] == 1  # rewritten to the lease's slot
    assert req.headers.get("authorization") == f"Bearer {ENGINE_KEY}"
    assert CLIENT_KEY.encode() not in req.body
    assert req.json["stream_options"] == {"include_usage": True}  # always asked upstream


def test_id_slot_removed_when_the_lease_names_none(oai, engine, peers):
    peers.id_slot = None
    try:
        engine.push(text_reply("ok"))
        list(
            oai.chat.completions.create(
                model="m", messages=ASK, stream=True, extra_body={"id_slot": 0}
            )
        )
        assert "id_slot" not in engine.requests[-1].json
    finally:
        peers.id_slot = 1


def _raw_stream(gateway, body) -> bytes:
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        return b"".join(r.iter_raw())


def test_tool_call_deltas_pass_unchanged(gateway, engine):
    engine.clear()
    reply = tool_reply(
        [("call_a", "recall", '{"id": "r12"}'), ("call_b", "search", '{"q": "naïve café"}')],
        split=4,
        interleave=True,
    )
    engine.push(reply)
    raw = _raw_stream(
        gateway, {"messages": ASK, "stream": True, "stream_options": {"include_usage": True}}
    )
    got = [json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: {")]
    sent = [f for f in reply.frames if isinstance(f, dict)]
    assert got[: len(sent)] == sent  # every chunk, fragments and indexes as sent


def test_multibyte_characters_split_across_writes_arrive_intact(oai, engine):
    frame = chunk({"content": "héllo 🌍 wörld"})
    engine.push(
        Stream(
            frames=[
                chunk({"role": "assistant", "content": None}),
                *split_writes(frame, "🌍"),
                chunk({}, "stop"),
            ]
        )
    )
    chunks = list(oai.chat.completions.create(model="m", messages=ASK, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "héllo 🌍 wörld"


def test_crlf_events_split_across_writes_are_relayed_whole(gateway, engine):
    """An OpenAI-compatible upstream may end lines with CRLF, write ``data:`` without the
    space and cut an event anywhere: each event reaches the client whole, in order."""
    engine.clear()
    first = json.dumps(chunk({"role": "assistant", "content": "ab"}))
    second = json.dumps(chunk({"content": "cd"}))
    cut = len(second) // 2
    engine.push(
        Stream(
            frames=[
                f"data:{first}\r\n\r\ndata: {second[:cut]}".encode(),
                f"{second[cut:]}\r".encode(),
                b"\n\r\n",
                f"data: {json.dumps(chunk({}, 'stop'))}\r\n\r\n".encode(),
            ]
        )
    )
    raw = _raw_stream(gateway, {"messages": ASK, "stream": True})
    # SSE: "data:" then one optional space (relayed as the engine wrote it)
    datas = [
        line[5:].removeprefix(" ") for line in raw.decode().split("\n") if line.startswith("data:")
    ]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:2]] == ["ab", "cd"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "\r" not in raw.decode()


def test_usage_chunk_only_when_asked_and_timings_move_to_the_finish_chunk(gateway, engine):
    engine.clear()
    engine.push(text_reply("abc"))
    raw = _raw_stream(gateway, {"messages": ASK, "stream": True})
    datas = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert all(c["choices"] for c in chunks) and all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["timings"]["prompt_n"] == 20  # from the dropped usage chunk
    engine.push(text_reply("abc"))
    raw = _raw_stream(
        gateway, {"messages": ASK, "stream": True, "stream_options": {"include_usage": True}}
    )
    datas = [
        json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: {")
    ]
    assert datas[-1]["choices"] == [] and datas[-1]["usage"]["total_tokens"] == 25


def test_mid_stream_engine_error_is_relayed(gateway, engine):
    engine.clear()
    engine.push(
        Stream(frames=[chunk({"content": "par"}), error_frame("kv cache full")], done=False)
    )
    raw = _raw_stream(gateway, {"messages": ASK, "stream": True})
    assert b"kv cache full" in raw and b'"par"' in raw


def test_engine_errors_keep_openai_shape(oai, engine):
    engine.push(
        HTTPError(
            400,
            {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "message": "request (9000 tokens) exceeds the "
                    "available context size (4096 tokens)",
                    "n_prompt_tokens": 9000,
                    "n_ctx": 4096,
                }
            },
        )
    )
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="m", messages=ASK, stream=True)
    assert err.value.code == "context_length_exceeded"
    assert err.value.body["n_ctx"] == 4096
    engine.push(HTTPError(500, {"error": {"code": 500, "type": "server_error", "message": "boom"}}))
    with pytest.raises(openai.APIStatusError) as err:
        oai.chat.completions.create(model="m", messages=ASK, stream=True)
    assert err.value.status_code == 502 and "boom" in err.value.message


def test_lease_refused_is_503_and_nothing_reaches_the_engine(oai, engine, peers):
    peers.lease_error = "unavailable"
    try:
        with pytest.raises(openai.APIStatusError) as err:
            oai.chat.completions.create(model="m", messages=ASK)
        assert err.value.status_code == 503
        assert err.value.code == "engine_unavailable"
        assert engine.requests == []
    finally:
        peers.lease_error = None


def test_lease_is_renewed_during_a_long_stream_and_released(oai, engine, peers):
    peers.lease_ttl_s = 1.5  # renew every 0.5 s
    try:
        engine.push(text_reply("slow reply here", pieces=8, delay_s=0.25))
        renewed = peers.renew_count
        list(oai.chat.completions.create(model="m", messages=ASK, stream=True))
        assert peers.renew_count >= renewed + 2
        assert _wait(lambda: peers.held() == 0)
    finally:
        peers.lease_ttl_s = 30.0


def test_client_gone_mid_stream_closes_upstream(gateway, engine, peers):
    engine.clear()
    engine.push(text_reply("x" * 200, pieces=100, delay_s=0.05))
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json={"messages": ASK, "stream": True},
        timeout=30,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                "content"
            ):
                break
    assert _wait(lambda: engine.disconnects >= 1, 10)
    assert _wait(lambda: peers.held() == 0)
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].cut)


def test_completions_and_embeddings_pass_through_or_relay_the_refusal(gateway, engine):
    engine.clear()
    r = httpx.post(gateway.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
    # the fake engine (like llama-server without --embeddings) refuses: relayed, its status
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    r = httpx.post(gateway.url + "/v1/completions", json={"prompt": 5}, timeout=30)
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]


def _text_chunk(text: str | None, finish: str | None = None, index: int = 0) -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "fake",
        "choices": [
            {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        ],
    }


def test_non_streamed_completion_is_assembled_from_an_upstream_stream(oai, engine, peers):
    """A non-streamed legacy completion is asked streamed upstream (so a client that leaves
    frees the slot) and assembled per choice index, with usage and the perf record."""
    engine.push(
        Stream(
            frames=[
                _text_chunk("Once"),
                _text_chunk(" upon"),
                _text_chunk(" a"),
                _text_chunk(" time", "length"),
            ]
        )
    )
    r = oai.completions.create(model="m", prompt="Tell me", max_tokens=4)
    req = engine.requests[-1].json
    assert req["stream"] is True and req["stream_options"] == {"include_usage": True}
    assert r.object == "text_completion" and r.choices[0].text == "Once upon a time"
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 25
    assert _wait(
        lambda: (
            peers.perf_records
            and peers.perf_records[-1].finish_reason == "length"
            and not peers.perf_records[-1].cut
        )
    )
    engine.push(
        Stream(
            frames=[
                _text_chunk("a", index=0),
                _text_chunk("b", index=1),
                _text_chunk("c", "stop", 0),
                _text_chunk("d", "stop", 1),
            ]
        )
    )
    r = oai.completions.create(model="m", prompt=["x", "y"], max_tokens=4)
    assert [(c.index, c.text, c.finish_reason) for c in r.choices] == [
        (0, "ac", "stop"),
        (1, "bd", "stop"),
    ]


def test_client_gone_from_a_non_streamed_completion_closes_upstream(gateway, engine, peers):
    engine.clear()
    engine.push(Stream(frames=[_text_chunk("x")] * 100, delay_s=0.05))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway.url + "/v1/completions",
            json={"prompt": "hi", "max_tokens": 100},
            timeout=httpx.Timeout(30, read=0.5),
        )
    assert _wait(lambda: engine.disconnects >= 1, 10)
    assert _wait(lambda: peers.held() == 0)


def test_non_streamed_answer_is_assembled_from_an_upstream_stream(oai, engine):
    """A non-streamed chat completion is asked streamed upstream (so a client that leaves
    frees the slot) and assembled: text, reasoning, tool calls merged by index, usage."""
    engine.push(
        tool_reply(
            [("call_a", "recall", '{"id": "r12"}'), ("call_b", "search", '{"q": "naïve"}')],
            content="Let me look.",
            split=3,
            interleave=True,
        )
    )
    r = oai.chat.completions.create(model="m", messages=ASK)
    req = engine.requests[-1].json
    assert req["stream"] is True and req["stream_options"] == {"include_usage": True}
    msg = r.choices[0].message
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me look."
    assert [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        ("call_a", "recall", '{"id": "r12"}'),
        ("call_b", "search", '{"q": "naïve"}'),
    ]
    assert r.usage.total_tokens == 25
    engine.push(text_reply("plain answer", reasoning="hmm"))
    r = oai.chat.completions.create(model="m", messages=ASK)
    assert r.choices[0].message.content == "plain answer"
    assert r.choices[0].message.model_extra["reasoning_content"] == "hmm"
    assert r.choices[0].message.tool_calls is None


def test_perf_records_name_the_leases_model_never_the_clients_or_the_upstreams(oai, engine, peers):
    """Issue 38 §6: a perf record's model (a Prometheus label value) is the lease's, whatever
    model name the client sends and whatever name the upstream answers with; streamed and
    not."""
    before = len(peers.perf_records)
    for i in range(6):
        engine.push(text_reply("ok"))
        create = oai.chat.completions.create
        if i % 2:
            list(create(model=f"client-flood-{i}", messages=ASK, stream=True))
        else:
            create(model=f"client-flood-{i}", messages=ASK)
    assert _wait(lambda: len(peers.perf_records) >= before + 6)
    # the fake engine answers "fake-model"; the lease's model is "fake"
    assert {r.model for r in peers.perf_records[before:]} == {"fake"}
