"""Issue 42's cache check on the real llama-server (the bundled SmolLM2-135M): with an MCP
server on, two turns of one conversation; the second request's prefix is the first request
and its reply, tools included (the same message fingerprints extended, the same tools
fingerprint), and the engine reuses at least 95% of it (``cache_n``).

SmolLM2's own template drops ``tools``, so the engine runs a test template that renders them
(``tests/chat/chatml_tools.jinja``, ChatML with the tools' JSON in the system message), as the
Gemma tests ship theirs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loki_shared import servers, subjects
from loki_shared.messages.perf import PerfRecord
from tests.chat.test_mcp_turns import write_stdio
from tests.fakes.fake_supervisor import FakeSupervisor
from tests.fakes.mcp_server import SLOW
from tests.templates.models import smollm2_model

pytestmark = pytest.mark.engine

TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")


@pytest.fixture(scope="module")
def tools_engine() -> Iterator[str]:
    """A llama-server on the bundled model with the test template that renders tools."""
    port = servers.free_port()
    extra = ["--jinja", "--chat-template-file", str(TEMPLATE)]
    argv = servers.llama_command(port, ctx=4096, model=smollm2_model(), extra=extra)
    proc = servers.ManagedProcess("llama-server-tools", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/health", timeout=180)
        yield url
    finally:
        proc.stop()


async def test_second_turn_reuses_the_prefix_with_mcp_tools_on(
    chat_runner, nc, client, tools_engine
):
    sup = await FakeSupervisor(nc, tools_engine, n_ctx=4096, model="").start()
    records: list[PerfRecord] = []

    async def on_record(msg: Any) -> None:
        records.append(PerfRecord.model_validate_json(msg.data))

    await nc.subscribe(subjects.PERF_RECORD, cb=on_record)
    try:
        write_stdio(chat_runner.home)
        chat = await chat_runner.start(
            tools=False, max_tokens=8, temperature=0.0, mcp_timeout_s=SLOW
        )
        cid, end1 = await client.turn("Reply with one word: pong", timeout=SLOW)
        assert end1.finish_reason in ("stop", "length"), end1.loki
        _, end2 = await client.turn("And again, one word.", cid, timeout=SLOW)
        assert end2.finish_reason in ("stop", "length"), end2.loki
        # the template really renders the tools: they are in the prompt the engine read
        schemas = chat.mcp.box(chat.toolbox, "default").schemas()
        assert [s["function"]["name"] for s in schemas][:1] == ["local__big"]
        async with httpx.AsyncClient(timeout=30) as http:
            rendered = await http.post(
                f"{tools_engine}/apply-template",
                json={"messages": [{"role": "system", "content": "S."}], "tools": schemas},
            )
        assert "local__echo" in rendered.json()["prompt"]
        for _ in range(100):
            mine = [r for r in records if r.conversation == cid and r.kind == "main"]
            if len(mine) >= 2:
                break
            await asyncio.sleep(0.1)
        first, second = mine[0], mine[1]
        assert first.tools_fingerprint and second.tools_fingerprint == first.tools_fingerprint
        assert second.fingerprints[: len(first.fingerprints)] == first.fingerprints
        t1, t2 = first.timings or {}, second.timings or {}
        prefix = t1["prompt_n"] + t1.get("cache_n", 0) + t1["predicted_n"]
        assert t2["cache_n"] >= 0.95 * prefix, (t1, t2)
    finally:
        await sup.stop()
