"""The recording proxy passes requests and streams through unchanged and records the
engine's figures (scripted fake engine: exact bytes; the real engine is used by the benches)."""

from __future__ import annotations

import json

import httpx

from bench import _common
from tests.fakes.fake_engine import FakeEngine, default_timings, text_reply


def test_streamed_and_plain_requests_are_recorded_and_passed_through() -> None:
    with FakeEngine() as engine:
        timings = default_timings(prompt_n=7, cache_n=30)
        engine.push(
            text_reply("héllo wörld", pieces=4, timings=timings),
            text_reply("plain", timings=default_timings(prompt_n=3, cache_n=40)),
        )
        proxy = _common.RecordingProxy(engine.url).start()
        try:
            body = {
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            with httpx.Client(timeout=30) as client:
                streamed = client.post(f"{proxy.url}/v1/chat/completions", json=body)
                plain = client.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "x"}]},
                )
                health = client.get(f"{proxy.url}/health")
        finally:
            proxy.stop()
        sent = engine.requests
    assert streamed.status_code == 200 and plain.status_code == 200
    assert health.status_code == 200
    # the engine received exactly what the client sent
    assert json.loads(sent[0].body) == body
    # the client received the engine's stream: the text reassembles
    text = ""
    for line in streamed.text.splitlines():
        if line.startswith("data:") and "[DONE]" not in line:
            for choice in json.loads(line[5:]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    assert text == "héllo wörld"
    first, second = proxy.exchanges
    assert first.body == body and first.status == 200
    assert first.content == "héllo wörld"
    assert (first.prompt_n, first.cache_n) == (7, 30)
    assert second.content == "plain" and (second.prompt_n, second.cache_n) == (3, 40)
    assert [o[2] for o in proxy.other] == ["/health"]


def test_no_upstream_is_a_502() -> None:
    proxy = _common.RecordingProxy(None).start()
    try:
        r = httpx.post(f"{proxy.url}/v1/chat/completions", json={}, timeout=10)
    finally:
        proxy.stop()
    assert r.status_code == 502 and proxy.exchanges == []
