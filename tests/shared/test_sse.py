"""The one decoder of llama-server / OpenAI streams (``loki_shared.sse.SSEDecoder``).

Recorded streams live in ``tests/shared/data/*.sse``: two captured from the real
llama-server with the bundled model (a chat completion with multi-byte text, usage and
timings; a legacy completion; only the model path in ``model`` was shortened) and
hand-written ones for the forms seen in public reports
(an ``error:`` field, ``event: error``, CRLF with pings and multi-line data, two tool calls
at index 0, a stream cut mid-event, errors inside data).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loki_shared.sse import SSEDecoder, decode_all, error_object, json_object

DATA = Path(__file__).parent / "data"
RECORDINGS = sorted(DATA.glob("*.sse"))


def _view(events, decoder):
    """What a reader sees: every event and the decoder's verdict."""
    return (
        [(e.kind, e.raw, e.data, e.event, e.chunk, e.error) for e in events],
        decoder.done,
        decoder.error,
        decoder.figures,
    )


def _feed_in_pieces(body: bytes, cuts: list[int]):
    decoder = SSEDecoder()
    events = []
    start = 0
    for cut in [*sorted(set(cuts)), len(body)]:
        events += decoder.feed(body[start:cut])
        start = cut
    events += decoder.close()
    return events, decoder


def test_recordings_are_there():
    names = {p.name for p in RECORDINGS}
    assert {"llama_server_chat.sse", "llama_server_completion.sse", "error_field.sse"} <= names
    assert len(RECORDINGS) >= 8


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_recorded_streams_decode_the_same_whatever_the_read_boundaries(data):
    """A stream split at random byte offsets (inside a multi-byte character, between CR and
    LF, inside ``data:``) decodes to exactly the events of the whole body."""
    path = data.draw(st.sampled_from(RECORDINGS), label="recording")
    body = path.read_bytes()
    # any offset, with the risky ones drawn often: after a CR, LF or colon, inside a
    # multi-byte character
    risky = [i for i in range(1, len(body)) if body[i - 1] in b"\r\n:" or 0x80 <= body[i] < 0xC0]
    offset = st.one_of(st.integers(0, len(body)), st.sampled_from(risky))
    cuts = data.draw(st.lists(offset, max_size=12), label="cuts")
    whole = _view(*decode_all(body))
    assert _view(*_feed_in_pieces(body, cuts)) == whole
    assert whole[0], f"{path.name} decodes to nothing"


def test_recorded_streams_fed_byte_by_byte():
    for path in RECORDINGS:
        body = path.read_bytes()
        assert _view(*_feed_in_pieces(body, list(range(len(body))))) == _view(*decode_all(body)), (
            path.name
        )


def test_sse_multibyte_split_byte_by_byte():
    frame = (
        "data: "
        + json.dumps({"choices": [{"delta": {"content": "héllo 🙂 世界"}}]}, ensure_ascii=False)
        + "\n\n"
    ).encode()
    dec = SSEDecoder()
    out = []
    for i in range(len(frame)):
        out += dec.feed(frame[i : i + 1])
    assert len(out) == 1 and out[0].kind == "chunk"
    assert out[0].chunk["choices"][0]["delta"]["content"] == "héllo 🙂 世界"


def test_sse_crlf_comments_and_multiline_data():
    dec = SSEDecoder()
    out = dec.feed(b": ping\r\n\r\n:\r\n\r\ndata: a\r\ndata: b\r\n\r\ndata: [DONE]\n\n")
    assert [(e.kind, e.data) for e in out] == [("invalid", "a\nb"), ("done", "[DONE]")]
    assert dec.done
    # CR alone ends lines too (the SSE format), and a CRLF cut between CR and LF
    dec = SSEDecoder()
    assert dec.feed(b'data: {"a":1}\r') == []
    assert [e.chunk for e in dec.feed(b"\n\r\n")] == [{"a": 1}]
    # a CR at the end of a read may be half of a CRLF: the event ends with the next byte
    assert dec.feed(b'data: {"b":2}\r\r') == []
    assert [e.chunk for e in dec.feed(b"data: [DONE]\r\r")] == [{"b": 2}]
    assert [e.kind for e in dec.close()] == ["done"]


def test_error_field_event_error_and_data_error_are_the_same_error():
    """The issue's frames: an ``error:`` field mid-stream (llama.cpp PR #16109), then
    ``[DONE]``; ``event: error``; ``data: {"error": ...}``: one kind, one shape."""
    error = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
    events, dec = decode_all((DATA / "error_field.sse").read_bytes())
    assert [e.kind for e in events] == ["chunk", "error", "done"]
    assert events[1].error == error and dec.error == error
    forms = [
        b"error: " + json.dumps(error).encode() + b"\n\n",
        b"event: error\ndata: " + json.dumps({"error": error}).encode() + b"\n\n",
        b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n",
        b"data: " + json.dumps({"error": error}).encode() + b"\n\n",
    ]
    for raw in forms:
        (event,) = SSEDecoder().feed(raw)
        assert (event.kind, event.error) == ("error", error), raw
    (event,) = SSEDecoder().feed(b"error: plain words\n\n")
    assert event.error == {"message": "plain words"}
    assert error_object({"code": 500}) == {"code": 500, "message": '{"code": 500}'}
    events, dec = decode_all((DATA / "data_error.sse").read_bytes())
    assert [e.kind for e in events] == ["chunk", "error", "error"]
    assert events[2].error == {"message": "plain text error"}
    assert dec.error["message"] == "kv cache full"  # the first error is the stream's


def test_stream_without_done_is_cut_and_a_half_event_is_invalid():
    events, dec = decode_all((DATA / "cut_no_done.sse").read_bytes())
    assert [e.kind for e in events] == ["chunk", "chunk", "invalid"]
    assert not dec.done and dec.cut
    # a last whole event not followed by the blank line is decoded at close
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]") == []
    assert [e.kind for e in dec.close()] == ["done"] and not dec.cut


def test_usage_and_timings_on_any_chunk_last_value_wins():
    events, dec = decode_all((DATA / "crlf_pings_multiline.sse").read_bytes())
    assert [e.kind for e in events] == ["chunk"] * 5 + ["done"]
    assert events[1].chunk["choices"][0]["delta"]["content"] == "bé 🌍"
    assert events[2].chunk["choices"][0]["delta"]["content"] == "c"  # multi-line data
    figures = dec.figures
    assert figures.timings == {"prompt_n": 5, "cache_n": 0, "predicted_n": 3}  # never summed
    assert figures.usage["total_tokens"] == 8
    assert figures.finish_reason == "stop" and figures.model == "m.gguf"
    dec = SSEDecoder()
    dec.feed(b'data: {"timings": {"prompt_n": 2}, "usage": null}\n\n')
    dec.feed(b'data: {"timings": "junk", "choices": [{"finish_reason": null}]}\n\n')
    assert dec.figures.timings == {"prompt_n": 2} and dec.figures.usage is None


def test_real_llama_server_recordings():
    events, dec = decode_all((DATA / "llama_server_chat.sse").read_bytes())
    assert dec.done and dec.error is None
    text = "".join(
        (e.chunk["choices"][0]["delta"].get("content") or "")
        for e in events
        if e.kind == "chunk" and e.chunk["choices"]
    )
    assert text and "\ufffd" not in text
    assert dec.figures.usage["completion_tokens"] > 0
    assert dec.figures.timings["predicted_n"] == dec.figures.usage["completion_tokens"]
    events, dec = decode_all((DATA / "llama_server_completion.sse").read_bytes())
    assert dec.done and any(e.chunk and e.chunk["choices"][0].get("text") for e in events)


def test_json_object_decodes_an_object_or_nothing():
    assert json_object(b'{"a": 1}') == {"a": 1}
    assert json_object('{"a": "é"}') == {"a": "é"}
    for junk in (b"[1]", b"null", b"not json", b"\xff\xfe", b""):
        assert json_object(junk) is None
