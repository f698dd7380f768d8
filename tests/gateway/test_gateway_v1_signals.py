"""Issue 14 through ``/v1`` (inputs 1, 3 and 5) and two small ``/v1`` items of issue 17,
against the scripted fake engine, with the official ``openai`` SDK or raw HTTP as client.

1. An ``error:`` field / ``event: error`` mid-stream reaches the client as
   ``data: {"error": ...}`` (the form the SDKs raise on).
3. The body reaches the engine as the client wrote it — every field of OpenAI's chat schema —
   except the documented rewrites (``id_slot``, ``stream``, ``stream_options.include_usage``).
5. An engine that closes the stream after two deltas: the client's stream ends with an error
   event in OpenAI's shape, no ``[DONE]``; the perf record is marked cut.
17. ``/v1/models`` ids are file names; ``/v1/embeddings`` on an engine without embeddings is
   llama-server's 501 in OpenAI's shape, which SDKs do not retry.
"""

from __future__ import annotations

import copy
import json
import time

import httpx
import openai
import pytest

from tests.fakes.fake_engine import FakeEngine, Stream, chunk, text_reply
from tests.fakes.gateway_peers import FakePeers

# the frame, verbatim
HEL = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}\n\n'
ERROR = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine():
    with FakeEngine() as fake:
        yield fake


@pytest.fixture(scope="module")
def peers(gw_nats, engine):
    fake = FakePeers(gw_nats, engine.url, id_slot=1)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def oai(gateway, engine):
    engine.clear()
    engine.model_id = "fake-model"
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0, timeout=30)


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _datas(raw: bytes) -> list[str]:
    """The ``data`` of each event the client got (test-side reading, on purpose independent
    of the decoder under test)."""
    out = []
    for event in raw.decode().split("\n\n"):
        lines = [
            line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
        ]
        if lines:
            out.append("\n".join(lines))
    return out


def _raw_stream(gateway, body) -> bytes:
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        return b"".join(r.iter_raw())


@pytest.mark.parametrize(
    "form",
    [
        b"error: " + json.dumps(ERROR).encode() + b"\n\n",
        b"event: error\ndata: " + json.dumps(ERROR).encode() + b"\n\n",
    ],
    ids=["error field", "event: error"],
)
def test_error_field_or_event_mid_stream_reaches_the_client_as_a_data_error(
    gateway, engine, peers, oai, form
):
    engine.push(Stream(frames=[HEL, form, b"data: [DONE]\n\n"], done=False))
    raw = _raw_stream(gateway, {"messages": ASK, "stream": True})
    datas = _datas(raw)
    assert json.loads(datas[0])["choices"][0]["delta"]["content"] == "Hel"
    assert json.loads(datas[1]) == {"error": {**ERROR, "param": None}}
    assert b"error:" not in raw and b"event: error" not in raw
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].cut)
    # the SDK raises on it (it would have taken "Hel" for a whole answer)
    engine.push(Stream(frames=[HEL, form, b"data: [DONE]\n\n"], done=False))
    with pytest.raises(openai.APIError) as err:
        list(oai.chat.completions.create(model="m", messages=ASK, stream=True))
    assert "Context size has been exceeded." in err.value.message
    # a non-streamed request gets the engine error in OpenAI's shape
    engine.push(Stream(frames=[HEL, form, b"data: [DONE]\n\n"], done=False))
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": ASK}, timeout=30)
    assert (
        r.status_code == 502 and "Context size has been exceeded." in r.json()["error"]["message"]
    )


#: A body with every field of OpenAI's chat completions request (and each message role's).
EVERY_FIELD = {
    "model": "gpt-4o",
    "messages": [
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {"role": "system", "content": [{"type": "text", "text": "You are Loki."}]},
        {
            "role": "user",
            "name": "ana",
            "content": [
                {"type": "text", "text": "Look — 🌍"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                },
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {
                    "type": "file",
                    "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "name": "loki",
            "audio": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "recall_search", "arguments": '{"query":"alpha"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "hits"}]},
        {"role": "assistant", "content": "Done.", "function_call": None},
        {"role": "user", "content": "Thanks"},
    ],
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "legacy", "description": "d", "parameters": {"type": "object"}}],
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "max_completion_tokens": 64,
    "max_tokens": 64,
    "metadata": {"k": "v"},
    "modalities": ["text"],
    "n": 1,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "Done."},
    "presence_penalty": -0.5,
    "prompt_cache_key": "conv-1",
    "reasoning_effort": "low",
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
    },
    "safety_identifier": "u-1",
    "seed": 7,
    "service_tier": "auto",
    "stop": ["\n\n", "END"],
    "store": False,
    "stream": True,
    "stream_options": {"include_usage": False, "include_obfuscation": False},
    "temperature": 0.2,
    "tool_choice": {"type": "function", "function": {"name": "recall_search"}},
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "recall_search",
                "description": "search",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                "strict": True,
            },
        }
    ],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "ana",
    "verbosity": "low",
    "web_search_options": {"search_context_size": "low"},
    "id_slot": 0,
}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
def test_the_engine_gets_the_clients_body_but_for_the_documented_rewrites(
    gateway, engine, peers, stream
):
    engine.clear()
    sent = copy.deepcopy(EVERY_FIELD)
    sent["stream"] = stream
    engine.push(text_reply("ok"))
    r = httpx.post(gateway.url + "/v1/chat/completions", json=sent, timeout=30)
    assert r.status_code == 200, r.text
    got = engine.requests[-1].json
    expected = copy.deepcopy(sent)
    expected["id_slot"] = 1  # the lease's
    expected["stream"] = True  # a non-streamed answer is assembled from a stream
    expected["stream_options"] = {"include_usage": True, "include_obfuscation": False}
    assert got == expected
    assert got["messages"][3]["content"] is None  # not rewritten to "" (litellm #37711)


@pytest.mark.parametrize("end", ["abort", "clean"])
def test_engine_closing_the_stream_early_ends_the_clients_with_an_error(
    gateway, engine, peers, oai, end
):
    frames = [chunk({"role": "assistant", "content": "Once"}), chunk({"content": " upon"})]
    engine.push(Stream(frames=frames, done=False, end=end))
    raw = _raw_stream(gateway, {"messages": ASK, "stream": True})
    datas = _datas(raw)
    assert [json.loads(d)["choices"][0]["delta"]["content"] for d in datas[:2]] == ["Once", " upon"]
    error = json.loads(datas[-1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "engine closed the stream" in error["message"] and error["code"] == "stream_cut"
    assert "[DONE]" not in datas and len(datas) == 3
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].cut)
    assert _wait(lambda: peers.held() == 0)
    engine.push(Stream(frames=frames, done=False, end=end))
    with pytest.raises(openai.APIError) as err:
        list(oai.chat.completions.create(model="m", messages=ASK, stream=True))
    assert "engine closed the stream" in err.value.message
    engine.push(Stream(frames=frames, done=False, end=end))
    with pytest.raises(openai.APIStatusError) as err:
        oai.chat.completions.create(model="m", messages=ASK)
    assert err.value.status_code == 502 and err.value.code == "stream_cut"


def test_models_are_named_by_their_file_name(gateway, oai, engine):
    engine.model_id = "/models/qwen/Qwen3-8B-Q4_K_M.gguf"
    models = oai.models.list()
    assert [m.id for m in models.data] == ["Qwen3-8B-Q4_K_M.gguf"]
    raw = httpx.get(gateway.url + "/v1/models", timeout=10).json()
    assert raw["models"] == [{"name": "Qwen3-8B-Q4_K_M.gguf", "model": "Qwen3-8B-Q4_K_M.gguf"}]
    engine.model_id = "fake-model"
    assert [m.id for m in oai.models.list().data] == ["fake-model"]  # a plain id stays


def test_embeddings_on_an_engine_without_them_is_its_501_never_retried(gateway, engine, peers):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=2, timeout=30)
    before = peers.lease_count
    with pytest.raises(openai.APIStatusError) as err:
        client.embeddings.create(model="m", input="hello")
    assert err.value.status_code == 501
    assert err.value.body == {
        "message": "This server does not support embeddings. Start it with `--embeddings`",
        "type": "not_supported_error",
        "param": None,
        "code": None,
    }
    assert peers.lease_count == before + 1  # the SDK did not retry (x-should-retry: false)
    assert _wait(lambda: peers.held() == 0)
