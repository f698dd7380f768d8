"""Compaction against the REAL llama-server with the bundled model: the engine accepts the
continuation request, prefills only the demand, and an archived block comes back verbatim.
(The transcript path and the 40-turn run are in bench/compaction_bench.py.)"""

from __future__ import annotations

import json

import httpx

from loki_chat.request import build_payload, encode, wire_messages
from loki_shared.messages.engine import Lease
from tests.builders import A
from tests.fakes.fake_supervisor import FakeSupervisor

from .test_compaction_policy import block, long_conv, recall_text


async def test_real_engine_continuation_prefills_only_the_demand(harness, nc, recall, engine_url):
    sup = await FakeSupervisor(nc, engine_url, n_ctx=4096, model="smollm2", id_slot=0).start()
    try:
        h = harness(compact_continuation=True, max_tokens=8)
        # about 2,500 tokens: the continuation (prompt + demand + summary budget) must fit
        # the 4,096-token window, or the policy rightly takes the transcript path
        conv = long_conv("real1", blocks=2)
        conv.messages.pop()
        lease = Lease(model="smollm2", n_ctx=4096, base_url=engine_url, id_slot=0)
        # a turn step as the loop sends it (streamed), accepted
        body = encode(
            build_payload(
                h.settings, lease, wire_messages(h.settings.system_prompt, conv.messages), None
            )
        )
        async with httpx.AsyncClient() as http:
            text, usage = "", None
            async with http.stream(
                "POST",
                engine_url + "/v1/chat/completions",
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=300,
            ) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        obj = json.loads(line[6:])
                        usage = obj.get("usage") or usage
                        for c in obj.get("choices") or []:
                            text += (c.get("delta") or {}).get("content") or ""
        prompt_tokens = usage["prompt_tokens"]
        h.policy.note_step(conv.id, lease, body, usage, len(conv.messages))
        conv.messages.append(A(text or "…"))
        assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3200))
        mark = h.markers[-1]
        assert not (mark.get("failure") or "").startswith(("HTTP", "network"))
        if mark["path"] == "continuation" or mark.get("failure") not in (
            None,
            "sent_view_mismatch",
        ):
            # the continuation request went out: only the demand was prefilled
            pass
        # the continuation request was sent first whatever the model wrote; its prompt_n
        # is the demand, far below the conversation's prompt
        cont_n = h.policy.continuation_prompt_n
        assert cont_n and cont_n[0] < 0.25 * prompt_tokens, (cont_n, prompt_tokens)
        for block_id in mark["archived"]:
            got = await recall_text(nc, block_id)
            assert got.split("\n", 1)[1] in {f"Here is file {i}:\n" + block(i) for i in range(3)}
        assert mark["archived"]
    finally:
        await sup.stop()
