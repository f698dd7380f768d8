"""The fake engine itself: its protocol is llama-server's, so other areas can rely on it."""

from __future__ import annotations

import httpx

from tests.fakes.fake_engine import HTTPError, tool_reply


async def test_fake_engine_streams_records_and_aggregates(fake_engine):
    fake_engine.push(tool_reply([("c0", "ping", '{"a": 1}')], content="hi"), HTTPError(503))
    body = (
        b'{"messages":[{"role":"user","content":"x"}],"stream":true,'
        b'"stream_options":{"include_usage":true}}'
    )
    async with httpx.AsyncClient() as http:
        async with http.stream(
            "POST", f"{fake_engine.url}/v1/chat/completions", content=body
        ) as resp:
            text = (await resp.aread()).decode()
        assert resp.headers["content-type"] == "text/event-stream"
        frames = [f for f in text.split("\n\n") if f]
        assert frames[-1] == "data: [DONE]" and '"timings"' in frames[-2]
        assert fake_engine.requests[0].body == body
        r = await http.post(f"{fake_engine.url}/v1/chat/completions", json={"messages": []})
        assert r.status_code == 503
        fake_engine.push(tool_reply([("c0", "ping", '{"a": 1}')], content="hi"))
        r = await http.post(f"{fake_engine.url}/v1/chat/completions", json={"messages": []})
        msg = r.json()["choices"][0]["message"]
        assert msg["content"] == "hi"
        assert msg["tool_calls"][0]["function"] == {"name": "ping", "arguments": '{"a": 1}'}
        assert r.json()["usage"]["prompt_tokens"] == 20
        assert (await http.get(f"{fake_engine.url}/v1/models")).json()["data"][0]["id"]
