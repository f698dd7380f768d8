"""COMPACT_TAIL_REUSE against the REAL llama-server (bundled SmolLM2, ``--cache-reuse 256`` as
the supervisor passes it with the key on): after a compaction, the next turn's request, built
by the turn loop's own functions, reuses most of the verbatim tail (``timings.cache_n``
large, ``prompt_n`` small) with the key on; with it off the tail is recomputed.

The summary itself comes from the scripted fake engine (the policy's transcript request): a
summary request sent to the one-slot real engine would evict the conversation's prompt, which
is not what is measured here."""

from __future__ import annotations

import random
from typing import Any

import httpx

from loki_chat.compaction import layout
from loki_chat.conversation import Conversation
from loki_chat.request import build_payload, encode, wire_messages
from loki_shared import servers
from loki_shared.messages.engine import Lease
from tests.builders import A, U
from tests.fakes.fake_engine import text_reply

SUMMARY = "Goals: eight questions on buffers and caches. Decisions: none. State: answered."
_WORDS = (
    "request response buffer token window slot cache prefix stream chunk retry timeout "
    "lock queue worker record"
).split()


def conversation(cid: str) -> Conversation:
    """Eight exchanges, about 2,400 tokens (the probe's shape: bench/cache_reuse_probe.py)."""
    rng = random.Random(3)

    def para(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n)) + "."

    conv = Conversation(id=cid)
    for i in range(8):
        conv.messages += [U(f"Question {i}: " + para(120)), A(f"Answer {i}: " + para(60))]
    return conv


async def send(url: str, settings: Any, conv: Conversation, tail_first: bool) -> dict[str, Any]:
    """One turn step as the loop builds it (layout, wire, payload), not streamed; the answer's
    ``timings``."""
    lease = Lease(model="smollm2", n_ctx=4096, base_url=url)
    wire = wire_messages(settings.system_prompt, layout.laid_out(conv.messages, tail_first))
    payload = build_payload(settings, lease, wire, None)
    payload.update(stream=False, max_tokens=1, temperature=0)
    payload.pop("stream_options", None)
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            url + "/v1/chat/completions",
            content=encode(payload),
            headers={"Content-Type": "application/json"},
            timeout=600,
        )
    assert resp.status_code == 200, resp.text[:300]
    timings: dict[str, Any] = resp.json()["timings"]
    return timings


async def test_real_engine_tail_first_reuses_the_tail(harness, fake_engine, supervisor):
    server = servers.start_llama(ctx=4096, extra=["--cache-reuse", "256"])
    try:
        figures: dict[bool, dict[str, Any]] = {}
        for on in (False, True):
            h = harness(compact_tail_reuse=on, system_prompt="You are a helpful assistant.")
            conv = conversation(f"tail-{on}")
            full = await send(server.url, h.settings, conv, on)  # the slot holds it all
            fake_engine.push(text_reply(SUMMARY))
            assert await h.policy.maybe_compact(h.view(conv, "manual", ctx_used=3300))
            assert conv.messages[0].loki.injected == "summary"
            assert (conv.messages[0].loki.sent_after is not None) is on
            tail = len(conv.messages) - 1
            conv.messages.append(U("Next question: which buffer holds the stream?"))
            figures[on] = {**await send(server.url, h.settings, conv, on), "tail": tail}
            figures[on]["full_prompt"] = full["prompt_n"] + full.get("cache_n", 0)
        off, on_ = figures[False], figures[True]
        print("tail reuse, off:", off, "on:", on_)
        # off: only the system prompt is reused, the tail is computed again
        assert off["cache_n"] < 0.1 * off["full_prompt"], off
        # on: most of the tail is reused, the engine computes the summary and the new message
        assert on_["cache_n"] > off["cache_n"] + 300, (off, on_)
        assert on_["prompt_n"] < 0.6 * off["prompt_n"], (off, on_)
    finally:
        server.process.stop()
