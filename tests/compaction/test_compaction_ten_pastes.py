"""The ten-paste scenario of issue 23 on the REAL llama-server (bundled model, its own
2,048-token window): ten user messages of about 1,700 tokens of code-like text each, through
the chat service's turn loop with the default compaction policy and exact token counts.

Target: no reactive overflow (the engine never refuses a prompt as too long), the first
request after each compaction fits, and the count made when each request is built is
within 2% of the engine's ``prompt_tokens``."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from tests.fakes.fake_supervisor import FakeSupervisor

pytestmark = pytest.mark.engine

N_CTX = 2048
PASTE_TOKENS = 1700


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = servers.start_llama(ctx=N_CTX, data_dir=Path(tmp_path_factory.mktemp("llama")))
    yield server.url
    server.process.stop()


def paste(i: int, url: str) -> str:
    """About :data:`PASTE_TOKENS` tokens (counted by the engine) of code-like text:
    identifiers, numbers and random-looking strings, where characters/4 is far off."""
    lines = [f"# paste {i}: module m{i}"]
    k = 0
    text = ""
    while True:
        for _ in range(8):
            h = (i * 7919 + k * 104729) % 1_000_003
            lines.append(
                f"def fn_{i}_{k}(x{k % 5}, y_{h % 97}): return x{k % 5} * {h % 1013} + "
                f"hash('{h:x}{k * 31 % 251:x}') % {h % 89 + 2}  # k={k}"
            )
            k += 1
        text = "\n".join(lines)
        n = len(httpx.post(url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"])
        if n >= PASTE_TOKENS:
            return text


async def test_ten_pastes_never_overflow_and_counts_match(
    chat_runner, nc, client, recall, small_engine, caplog
):
    caplog.set_level(logging.INFO)
    pastes = [paste(i, small_engine) for i in range(10)]
    sup = await FakeSupervisor(nc, small_engine, n_ctx=N_CTX, model="", max_tokens=64).start()
    try:
        await chat_runner.start(tools=False, temperature=0.0, tokenize_timeout_s=2.0)
        cid = None
        for i in range(10):
            cid, end = await client.turn(
                f"Here is part {i} of the code; say in one line what it does.\n" + pastes[i],
                cid,
                timeout=600,
            )
            assert "error" not in end.loki, (i, end.loki)
            assert end.usage["prompt_tokens"] <= N_CTX
        marks = [
            e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "compaction"
        ]
        assert marks, "the window forces compactions"
        assert not [m for m in marks if m["trigger"] == "reactive"], marks
        # a turn-start archive-then-drop (the new paste alone is ~90% of the window: the
        # previous summary cannot stay beside it) leaves room for the 64-token reply
        assert all(m["tokens_after"] + 64 <= N_CTX for m in marks if m["path"] == "shrink"), marks
        gaps = [
            float(m.group(1))
            for r in caplog.records
            if (m := re.search(r"\[ctx\].*\((\d+)%\)", r.getMessage()))
        ]
        assert not gaps, gaps  # the [ctx] line only appears past 2%
    finally:
        await sup.stop()
