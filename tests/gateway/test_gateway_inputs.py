"""Inputs from the world (issue 38, part A), against the scripted fake engine and a real
gateway: assembled answers keep every streamed field; JSON text that is no Unicode is a 400
naming the field on every JSON route; remote media URLs never reach the engine (refused, or
fetched by Loki under its policy: loopback servers only); models named as ``/v1/models``
names them, ``GET /v1/models/{id}``; the Responses API relayed; the API's documents behind
the key, no other header standing for it; ``param`` on every error body."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from tests.fakes.fake_engine import FakeEngine, Stream, chunk, responses_reply, text_reply
from tests.fakes.gateway_peers import FakePeers
from tests.fakes.media import png

KEY = "inputs-key-38"
ASK = [{"role": "user", "content": "hi"}]
MODEL_PATH = "/models/qwen/Qwen3-8B-Q4_K_M.gguf"
MODEL_ID = "Qwen3-8B-Q4_K_M.gguf"


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


@pytest.fixture(scope="module")
def gw(gateway_factory, peers):
    return gateway_factory(key=KEY)


@pytest.fixture
def http(gw, engine) -> Iterator[httpx.Client]:
    engine.clear()
    engine.model_id = "fake-model"
    engine.aliases = []
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=30) as client:
        yield client


def _wait(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error


# -- item 1: a non-streamed answer keeps what the stream carried ------------------------


def _lp(token: str, logprob: float) -> dict:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": token, "logprob": logprob, "bytes": list(token.encode())}],
    }


def test_assembled_chat_answer_keeps_logprobs_and_unknown_fields_in_order(http, engine):
    frames: list = [chunk({"role": "assistant", "content": None})]
    for i, (piece, logprob) in enumerate([("Hel", -0.1), ("lo", -0.2), ("!", -0.3)]):
        frame = chunk({"content": piece, "x_note": f"<{i}>"})
        frame["choices"][0]["logprobs"] = {"content": [_lp(piece, logprob)]}
        frame["choices"][0]["x_choice"] = {"seen": [i]}
        frames.append(frame)
    frames.append(chunk({}, "stop"))
    engine.push(Stream(frames=frames))
    r = http.post(
        "/v1/chat/completions", json={"messages": ASK, "logprobs": True, "top_logprobs": 1}
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "Hello!"
    assert choice["logprobs"]["content"] == [_lp("Hel", -0.1), _lp("lo", -0.2), _lp("!", -0.3)]
    assert choice["x_choice"] == {"seen": [0, 1, 2]}  # a field Loki does not know: kept
    assert choice["message"]["x_note"] == "<0><1><2>"  # a delta text field: joined
    assert choice["finish_reason"] == "stop"
    assert list(choice) == ["index", "message", "logprobs", "x_choice", "finish_reason"]


def test_assembled_tool_calls_keep_the_fields_the_stream_carried(http, engine):
    """A server's own tool-call fields (a thought signature beside the call, a field of its
    ``function``) reach the assembled answer as the stream carried them."""
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": ', "x_strict": True},
        "extra_content": {"google": {"thought_signature": "sig=="}},
    }
    frames = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
        chunk({}, "tool_calls"),
    ]
    engine.push(Stream(frames=frames))
    r = http.post("/v1/chat/completions", json={"messages": ASK})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "x"}', "x_strict": True},
            "extra_content": {"google": {"thought_signature": "sig=="}},
        }
    ]


def _text_chunk(text: str, finish: str | None = None, **extra) -> dict:
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [{"text": text, "index": 0, "finish_reason": finish, **extra}],
    }


def test_assembled_completion_keeps_the_streams_logprobs_never_a_hand_written_null(http, engine):
    engine.push(
        Stream(
            frames=[
                _text_chunk("a", logprobs={"content": [_lp("a", -1.0)]}),
                _text_chunk("b", "length", logprobs={"content": [_lp("b", -2.0)]}),
            ]
        )
    )
    r = http.post("/v1/completions", json={"prompt": "x", "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "ab"
    assert choice["logprobs"] == {"content": [_lp("a", -1.0), _lp("b", -2.0)]}
    # llama-server says "logprobs": null when none were asked: kept as the stream said
    engine.push(Stream(frames=[_text_chunk("c", logprobs=None), _text_chunk("", "stop")]))
    r = http.post("/v1/completions", json={"prompt": "x"})
    assert r.json()["choices"][0] == {
        "index": 0,
        "text": "c",
        "logprobs": None,
        "finish_reason": "stop",
    }
    # a stream that carried no logprobs at all: none written by hand
    engine.push(Stream(frames=[_text_chunk("d"), _text_chunk("", "stop")]))
    r = http.post("/v1/completions", json={"prompt": "x"})
    assert "logprobs" not in r.json()["choices"][0]


# -- item 2: JSON text that is no Unicode --------------------------------------------


SURROGATE = b'{"messages": [{"role": "user", "content": "a \\ud83d b"}]}'


def test_a_lone_surrogate_is_a_400_naming_the_field_and_nothing_goes_further(http, engine, peers):
    sends = len(peers.sends)
    r = http.post(
        "/v1/chat/completions", content=SURROGATE, headers={"content-type": "application/json"}
    )
    error = _error(r, 400)
    assert error["param"] == "messages[0].content"
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_text"
    r = http.post(
        "/api/chat/send",
        content=b'{"content": "a \\ud83d b"}',
        headers={"content-type": "application/json"},
    )
    assert _error(r, 400)["param"] == "content"
    r = http.post("/api/conversations", content=b'{"title": "\\udc00"}')  # no content type
    assert _error(r, 400)["param"] == "title"
    # bytes that are not UTF-8: named too
    r = http.post(
        "/api/chat/send",
        content=b'{"content": "caf\xe9"}',
        headers={"content-type": "application/json"},
    )
    assert _error(r, 400)["param"] == "content"
    assert engine.requests == [] and len(peers.sends) == sends  # nothing went further
    # a full pair is a character: it passes
    engine.push(text_reply("ok"))
    r = http.post(
        "/v1/chat/completions",
        content=b'{"messages": [{"role": "user", "content": "a \\ud83d\\ude00 b"}]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    assert engine.requests[-1].json["messages"][0]["content"] == "a 😀 b"


def test_json_nested_too_deeply_is_a_400(http):
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/chat/completions", "/api/chat/send", "/api/conversations"):
        r = http.post(path, content=deep, headers={"content-type": "application/json"})
        _error(r, 400)


def test_every_json_route_refuses_a_lone_surrogate_with_a_400(http):
    schema = http.get("/openapi.json").json()
    routes = [
        (method, path)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if method in ("post", "put", "patch", "delete")
        and "application/json" in (op.get("requestBody") or {}).get("content", {})
    ]
    assert len(routes) >= 15, routes
    for method, path in routes:
        url = re.sub(r"\{[^}]+\}", "x1", path)
        r = http.request(
            method.upper(),
            url,
            content=b'{"name": "\\ud800", "content": ["ok", {"k\\udfff": 1}]}',
            headers={"content-type": "application/json"},
        )
        error = _error(r, 400)
        assert error["param"] == "name" and error["code"] == "invalid_text", (path, error)


# -- error bodies: param, null when none -----------------------------------------------


def test_error_bodies_carry_param(http, gw):
    assert (
        _error(http.post("/v1/chat/completions", json={"messages": ASK, "n": 2}), 400)["param"]
        is None
    )
    assert _error(http.post("/api/chat/send", json={"content": 5}), 400)["param"] == "content"
    assert _error(httpx.get(gw.url + "/v1/models", timeout=10), 401)["param"] is None
    assert _error(http.get("/v1/nothing-here"), 404)["param"] is None


# -- model names -------------------------------------------------------------------------


def test_answers_name_the_model_as_v1_models_does(http, engine):
    engine.model_id = MODEL_PATH
    engine.aliases = [MODEL_PATH, "short"]
    listed = http.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [MODEL_ID]
    assert listed["data"][0]["aliases"] == [MODEL_ID, "short"]
    frames = [
        chunk({"role": "assistant", "content": None}, model=MODEL_PATH),
        chunk({"content": 'say "model": "/a/b"'}, model=MODEL_PATH),
        chunk({}, "stop", model=MODEL_PATH),
    ]
    engine.push(Stream(frames=list(frames)))
    r = http.post("/v1/chat/completions", json={"messages": ASK})
    assert r.json()["model"] == MODEL_ID
    engine.push(Stream(frames=list(frames)))
    with http.stream(
        "POST", "/v1/chat/completions", json={"messages": ASK, "stream": True}
    ) as resp:
        raw = b"".join(resp.iter_raw())
    assert MODEL_PATH.encode() not in raw
    got = [json.loads(x[6:]) for x in raw.decode().split("\n") if x.startswith("data: {")]
    assert {c["model"] for c in got} == {MODEL_ID}
    assert got[1]["choices"][0]["delta"]["content"] == 'say "model": "/a/b"'  # text untouched
    engine.embeddings = True
    try:
        r = http.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 200 and r.json()["model"] == MODEL_ID
    finally:
        engine.embeddings = False


def test_an_upload_whose_file_name_is_not_utf8_is_stored_under_a_text_name(http):
    """Multipart is not JSON, but its file name is text from the world too: bytes that are
    not UTF-8 never make a 500."""
    boundary = b"b0undary"
    body = (
        b"--" + boundary + b"\r\n"
        b'Content-Disposition: form-data; name="file"; filename="caf\xe9 \xed\xa0\xbd.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\nhello\r\n--" + boundary + b"--\r\n"
    )
    r = http.post(
        "/api/chat/upload",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=b0undary"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"].endswith(".txt")  # read as Latin-1 by the multipart parser: text


def test_one_model_by_its_listed_id_and_404_for_any_other(http, gw, engine):
    engine.model_id = MODEL_PATH
    r = http.get(f"/v1/models/{MODEL_ID}")
    assert r.status_code == 200 and r.json()["id"] == MODEL_ID
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    error = _error(http.get("/v1/models/nope.gguf"), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    _error(http.get(f"/v1/models{MODEL_PATH}"), 404)  # the path is no listed id


# -- the Responses API -------------------------------------------------------------------


def test_responses_relayed_streamed_and_not_with_v1_rules(http, gw, engine, peers):
    engine.model_id = MODEL_PATH
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert _error(httpx.post(gw.url + "/v1/responses", json={"input": "x"}), 401)
    before = len(peers.perf_records)
    engine.push(responses_reply("Hi there", MODEL_PATH))
    answer = client.responses.create(model="m", input="hello", extra_body={"id_slot": 0})
    assert answer.output_text == "Hi there" and answer.model == MODEL_ID
    sent = engine.requests[-1]
    assert sent.path == "/v1/responses" and sent.json["stream"] is True
    assert sent.json["id_slot"] == 1 and sent.json["input"] == "hello"  # the lease's slot
    assert _wait(lambda: len(peers.perf_records) > before)
    record = peers.perf_records[-1]
    assert record.usage == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert record.timings["prompt_n"] == 11 and not record.cut and record.kind == "foreign"
    engine.push(responses_reply("Streamed", MODEL_PATH))
    events = list(client.responses.create(model="m", input="hello", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]
    final = events[-1].response
    assert final.output_text == "Streamed" and final.model == MODEL_ID
    # cut before response.completed: an error, never a complete answer
    cut = responses_reply("x")
    cut.frames = cut.frames[:2]
    engine.push(cut)
    assert _error(http.post("/v1/responses", json={"input": "x"}), 502)["code"] == "stream_cut"
    error = _error(http.post("/v1/responses", json={"input": 5}), 400)
    assert error["param"] == "input"


# -- remote media URLs ---------------------------------------------------------------------


class _Images:
    """Loopback HTTP servers that serve images and record every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.servers: list[ThreadingHTTPServer] = []
        self.image = png(16, 16, (10, 200, 30))

    def start(self, host: str) -> str:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append((host, self.path))
                if self.path.startswith("/to/"):
                    self.send_response(302)
                    self.send_header("Location", "http://" + self.path[4:])
                    self.end_headers()
                    return
                body = {
                    "/img.png": owner.image,
                    "/big.png": owner.image + b"\0" * 4096,
                    "/text": b"not an image",
                }.get(self.path, b"")
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"{host}:{server.server_address[1]}"

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def images() -> Iterator[_Images]:
    srv = _Images()
    yield srv
    srv.stop()


def _image_body(url: str) -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is it?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ]
    }


def test_remote_media_urls_are_refused_by_default_and_never_reach_the_engine(http, engine, images):
    where = images.start("127.0.0.1")
    url = f"http://{where}/latest/meta-data/iam"
    error = _error(http.post("/v1/chat/completions", json=_image_body(url)), 400)
    assert error["param"] == "messages[0].content[1].image_url.url"
    assert error["code"] == "remote_media_refused" and "data:" in error["message"]
    audio = {"type": "input_audio", "input_audio": {"data": url, "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [audio]}]}
    error = _error(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "messages[0].content[0].input_audio.data"
    part = {"type": "input_image", "image_url": url}
    body = {"input": [{"role": "user", "content": [part]}]}
    error = _error(http.post("/v1/responses", json=body), 400)
    assert error["param"] == "input[0].content[0].image_url"
    assert engine.requests == [] and images.requests == []  # nothing fetched, nothing sent
    # a data URL passes as it is
    data_url = "data:image/png;base64," + base64.b64encode(images.image).decode()
    engine.push(text_reply("green"))
    assert http.post("/v1/chat/completions", json=_image_body(data_url)).status_code == 200
    assert engine.requests[-1].json["messages"][0]["content"][1]["image_url"]["url"] == data_url


def test_fetching_on_checks_hosts_addresses_redirects_size_and_type(
    gateway_factory, peers, engine, images
):
    here = images.start("127.0.0.1")
    other = images.start("127.0.0.2")  # loopback too, outside the allowed network
    gw = gateway_factory(
        key=KEY,
        LOKI_IMAGE_FETCH_HOSTS="127.0.0.1,127.0.0.2",
        LOKI_IMAGE_FETCH_NETWORKS="127.0.0.1/32",
        LOKI_UPLOAD_MAX_MB="0.003",
    )
    engine.clear()
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=30) as http:
        engine.push(text_reply("green"))
        r = http.post("/v1/chat/completions", json=_image_body(f"http://{here}/img.png"))
        assert r.status_code == 200, r.text
        sent = engine.requests[-1].json["messages"][0]["content"][1]["image_url"]["url"]
        assert sent == "data:image/png;base64," + base64.b64encode(images.image).decode()
        # a redirect to an address outside the allowed networks: refused before connecting
        r = http.post("/v1/chat/completions", json=_image_body(f"http://{here}/to/{other}/img.png"))
        assert "127.0.0.2" in _error(r, 400)["message"]
        assert not [x for x in images.requests if x[0] == "127.0.0.2"]
        # a host not on the list
        r = http.post("/v1/chat/completions", json=_image_body("http://localhost:1/img.png"))
        assert "LOKI_IMAGE_FETCH_HOSTS" in _error(r, 400)["message"]
        # too large, not an image
        r = http.post("/v1/chat/completions", json=_image_body(f"http://{here}/big.png"))
        _error(r, 413)
        r = http.post("/v1/chat/completions", json=_image_body(f"http://{here}/text"))
        assert "not an image" in _error(r, 400)["message"]
        assert len(engine.requests) == 1  # only the good one reached the engine


# -- the API's documents and the key ------------------------------------------------------


def test_api_documents_behind_the_key_docs_pages_off_and_no_other_header_counts(gw, http):
    bare = httpx.Client(base_url=gw.url, timeout=10)
    assert _error(bare.get("/openapi.json"), 401)
    assert http.get("/openapi.json").status_code == 200
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert bare.get(page).status_code == 404 and http.get(page).status_code == 404
    for headers in (
        {"x-api-key": KEY},
        {"api-key": KEY},
        {"X-Loki-Key": KEY},
        {"Cookie": f"loki_key={KEY}"},
        {"Authorization": KEY},  # no Bearer scheme
        {"Authorization": f"Basic {KEY}"},
    ):
        for path in ("/v1/models", "/api/conversations", "/openapi.json"):
            assert bare.get(path, headers=headers).status_code == 401, (headers, path)
    assert bare.get("/v1/models", params={"api_key": KEY}).status_code == 401
    # the UI works offline: the page loads nothing from another origin
    page = bare.get("/").text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), page
    bare.close()
