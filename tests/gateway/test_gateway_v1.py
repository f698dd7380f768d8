"""``/v1`` with the official ``openai`` SDK as the client and the REAL llama-server (bundled
SmolLM2) behind a lease from a fake supervisor on NATS."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from tests.fakes.gateway_peers import FakePeers

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def peers(gw_nats, engine_url):
    fake = FakePeers(gw_nats, engine_url, id_slot=0).start()
    yield fake
    fake.stop()


@pytest.fixture
def oai(gateway, engine_url):
    _wait_engine_idle(engine_url)
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key="client-key-not-forwarded", max_retries=0, timeout=120
    )


def _slots(engine_url):
    return httpx.get(engine_url + "/slots", timeout=5).json()


def _wait_engine_idle(engine_url, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(s.get("is_processing") for s in _slots(engine_url)):
            return
        time.sleep(0.1)
    raise TimeoutError("engine still busy")


def _record_of(records, usage):
    """The one record among ``records`` whose usage is a Responses ``usage``'s (input and
    output tokens as prompt and completion tokens); None if none."""
    for r in records:
        if r.usage and (r.usage.get("prompt_tokens"), r.usage.get("completion_tokens")) == (
            usage.input_tokens,
            usage.output_tokens,
        ):
            return r
    return None


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


ASK = [{"role": "user", "content": "Reply with one word: pong"}]


def test_models(oai):
    models = oai.models.list()
    assert len(models.data) >= 1 and models.data[0].id
    # llama-server names the model by its path; the gateway shows the file name
    assert models.data[0].id.endswith(".gguf") and "/" not in models.data[0].id


def test_embeddings_without_engine_support_is_501(gateway, peers):
    """The bundled engine runs without ``--embeddings``: its 501 reaches the client in
    OpenAI's shape, marked not to be retried (issue 17)."""
    r = httpx.post(gateway.url + "/v1/embeddings", json={"input": "hello"}, timeout=60)
    assert r.status_code == 501, r.text
    error = r.json()["error"]
    assert error["type"] == "not_supported_error" and "embeddings" in error["message"]
    assert r.headers["x-should-retry"] == "false"
    assert _wait(lambda: peers.held() == 0)


def test_chat_not_streamed_under_a_released_lease_with_a_perf_record(oai, peers):
    before = (peers.lease_count, len(peers.perf_records))
    r = oai.chat.completions.create(model="any", messages=ASK, max_tokens=8)
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.prompt_tokens > 0
    assert peers.lease_count == before[0] + 1
    assert _wait(lambda: peers.held() == 0)
    assert peers.leases == {}
    assert _wait(lambda: len(peers.perf_records) > before[1])
    rec = peers.perf_records[-1]
    assert rec.kind == "foreign" and rec.roles == ["user"] and len(rec.fingerprints) == 1
    assert rec.timings["prompt_n"] >= 1 and rec.usage["completion_tokens"] >= 1
    assert rec.slot == 0 and not rec.cut


def test_stream_without_usage_has_no_usage_chunk_but_keeps_timings(oai, peers):
    chunks = list(oai.chat.completions.create(model="any", messages=ASK, max_tokens=8, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    # llama-server puts timings on the finish chunk when usage was not asked: same here
    assert (last.model_extra or {}).get("timings", {}).get("predicted_n", 0) >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].usage is not None)


def test_stream_with_usage_when_asked(oai):
    chunks = list(
        oai.chat.completions.create(
            model="any",
            messages=ASK,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])


def test_legacy_completions_streamed_and_not(oai, peers):
    """/v1/completions on the real engine: the non-streamed answer is assembled from the
    upstream stream (same text as the engine's own non-streamed answer at temperature 0)."""
    before = len(peers.perf_records)
    r = oai.completions.create(
        model="any", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].text.strip()
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    chunks = list(
        oai.completions.create(
            model="any", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert _wait(lambda: len(peers.perf_records) >= before + 2 and peers.held() == 0)


def test_tool_messages_are_normalised_and_accepted(oai):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "assistant", "content": ""},  # an empty assistant turn
        {"role": "user", "content": "Thanks. Say ok."},
    ]
    tools = [{"type": "function", "function": {"name": "clock", "description": "time"}}]
    r = oai.chat.completions.create(model="any", messages=messages, tools=tools, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_n_above_one_is_a_clear_400(oai):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="any", messages=ASK, n=2, max_tokens=4)
    assert err.value.status_code == 400
    assert err.value.code == "unsupported_value"
    assert "n > 1" in err.value.message


def test_context_overflow_is_context_length_exceeded(oai, peers):
    long = "lorem ipsum dolor sit amet " * 1500  # well past n_ctx 4096
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model="any", max_tokens=4, messages=[{"role": "user", "content": long}]
        )
    assert err.value.code == "context_length_exceeded"
    assert err.value.body["type"] == "invalid_request_error"
    assert _wait(lambda: peers.held() == 0)


def test_invalid_bodies_are_4xx(gateway):
    cases = [
        (b"not json", "JSON"),
        (b"[1, 2]", "object"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "role"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "content"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            "tools[0]",
        ),
    ]
    for raw, needle in cases:
        r = httpx.post(
            gateway.url + "/v1/chat/completions",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400, (raw, r.text)
        assert needle.lower() in r.json()["error"]["message"].lower(), r.text


def test_slots_paths_are_refused(gateway):
    for method, path in [
        ("GET", "/slots"),
        ("POST", "/slots/0?action=save"),
        ("GET", "/v1/slots"),
        ("POST", "/v1/slots/1?action=erase"),
    ]:
        r = httpx.request(method, gateway.url + path)
        assert r.status_code == 405, path
        assert r.json()["error"]["code"] == "method_not_allowed"


LONG_GEN = {"max_tokens": 2500, "ignore_eos": True, "temperature": 0.0}
IDLE_WAIT_S = 120  # generous: the machine may be loaded; what matters is the decode count


def _decodes(engine_url) -> float:
    """llama-server's ``llamacpp:n_decode_total`` (one per llama_decode call)."""
    for line in httpx.get(engine_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("llamacpp:n_decode_total"):
            return float(line.split()[-1])
    raise AssertionError("no n_decode_total in /metrics")


def _assert_cut_short(engine_url, before: float) -> None:
    """The slot went idle and the engine did not go on generating the 2500 tokens asked."""
    assert _wait(lambda: not any(s["is_processing"] for s in _slots(engine_url)), IDLE_WAIT_S), (
        "slot still busy after the client left"
    )
    done = _decodes(engine_url) - before
    assert done < 200, f"the engine went on decoding ({done} decodes) after the client left"


def test_disconnect_after_first_chunk_frees_the_slot(gateway, engine_url, peers):
    _wait_engine_idle(engine_url)
    before = _decodes(engine_url)
    body = {"messages": ASK, "stream": True, **LONG_GEN}
    with httpx.Client(timeout=IDLE_WAIT_S) as c:
        with c.stream("POST", gateway.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["x-accel-buffering"] == "no"
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data:") and '"content":"' in line:
                    seen += 1
                    if seen >= 10:
                        break
            assert seen == 10  # the engine is generating; 2490 tokens are still to come
    _assert_cut_short(engine_url, before)
    assert _wait(lambda: peers.held() == 0)
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].cut)


def _raw_post(port: int, body: dict) -> socket.socket:
    """Send a POST /v1/chat/completions on a raw socket (so the test decides exactly when
    the client goes away)."""
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(raw)).encode()
        + b"\r\n\r\n"
        + raw
    )
    return sock


def _no_token_yet(sock: socket.socket) -> bool:
    """Nothing but headers (a streamed answer starts at once) and no ``data:`` chunk yet."""
    sock.setblocking(False)
    got = b""
    try:
        while True:
            part = sock.recv(65536)
            if not part:
                break
            got += part
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
    return b"data:" not in got and b'"choices"' not in got


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_while_the_engine_reads_the_prompt_frees_the_slot(
    gateway, engine_url, peers, stream
):
    """The client leaves during prefill (streamed) or while waiting for a non-streamed
    answer: the engine stops instead of going on to generate 2500 tokens."""
    _wait_engine_idle(engine_url)
    before = _decodes(engine_url)
    prompt = f"{stream} alpha beta gamma delta " * 250  # ~1200 tokens of prefill
    body = {"messages": [{"role": "user", "content": prompt}], "stream": stream, **LONG_GEN}
    sock = _raw_post(gateway.port, body)
    try:
        assert _wait(lambda: any(s["is_processing"] for s in _slots(engine_url)), 20)
        assert _no_token_yet(sock)  # no token yet
    finally:
        sock.close()
    _assert_cut_short(engine_url, before)
    assert _wait(lambda: peers.held() == 0)
    # its record says the answer was cut (and is in before the next test counts records)
    assert _wait(lambda: peers.perf_records and peers.perf_records[-1].cut)


def test_responses_api_on_the_real_engine_streamed_and_not(oai, peers):
    """Issue 38: ``client.responses.create`` (the Responses API the pinned llama-server
    serves) through the gateway, with /v1's rules: a lease released, a perf record with the
    usage; the model named as /v1/models names it."""
    listed = oai.models.list().data[0].id
    before = (peers.lease_count, len(peers.perf_records))
    answer = oai.responses.create(
        model="any", input="Reply with one word: pong", max_output_tokens=8
    )
    assert answer.status == "completed" and answer.output_text
    assert answer.model == listed and answer.usage.input_tokens > 0
    assert peers.lease_count == before[0] + 1 and _wait(lambda: peers.held() == 0)
    # this request's record: the one whose usage is the answer's (a record of an earlier
    # test may still come in after ``before`` was read)
    assert _wait(lambda: _record_of(peers.perf_records[before[1] :], answer.usage))
    record = _record_of(peers.perf_records[before[1] :], answer.usage)
    assert record is not None and not record.cut and record.kind == "foreign"
    events = list(
        oai.responses.create(
            model="any", input="Reply with one word: pong", max_output_tokens=8, stream=True
        )
    )
    assert events[-1].type == "response.completed"
    assert events[-1].response.model == listed
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert _wait(lambda: peers.held() == 0)


def test_answers_name_the_model_and_keep_logprobs_on_the_real_engine(oai):
    """Issue 38: every answer's ``model`` is the id /v1/models lists (never the engine's
    model path); a non-streamed answer keeps the logprobs the stream carried, the same
    tokens in the same order as the streamed answer (greedy, so both are one answer)."""
    listed = oai.models.list().data[0].id
    assert oai.models.retrieve(listed).id == listed
    ask = {"model": "any", "messages": ASK, "max_tokens": 6, "temperature": 0, "seed": 1}
    r = oai.chat.completions.create(**ask, logprobs=True, top_logprobs=2)
    assert r.model == listed
    content = r.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 for t in content)
    chunks = list(oai.chat.completions.create(**ask, logprobs=True, top_logprobs=2, stream=True))
    assert {c.model for c in chunks} == {listed}
    streamed = [
        t.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in content] == streamed
    c = oai.completions.create(model="any", prompt="The sky is", max_tokens=4, logprobs=1)
    assert c.model == listed
    assert len(c.choices[0].logprobs.model_extra["content"]) >= 1
