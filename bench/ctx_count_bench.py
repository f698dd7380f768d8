"""How far the chat service's token count at send is from the engine's ``prompt_tokens``
(issue 23: "count tokens, don't guess"), before (estimates) and after (exact counts).

The benchmarks' scripted session (:func:`bench.headline_bench.script_session`: short
questions, long messages, pasted code, pasted tool output) is played against the real
llama-server with the bundled model, each turn one request of the growing conversation
(system prompt + every message so far; reply capped at :data:`MAX_TOKENS`). For each request
the count is made the way the chat service makes it when it builds a request
(:class:`loki_chat.meter.ContextMeter`: the last completion's measure plus the messages since,
or the whole prompt when nothing was measured), once with estimates (``LOKI_TOKENIZE_TIMEOUT_S``
0: characters/4 + 4 per message) and once with the engine's own counts
(:class:`loki_chat.tokens.TokenCounts`: ``/tokenize`` and the template overhead learnt from
``/apply-template``), and compared with the ``usage.prompt_tokens`` of that request. The
whole-prompt count (no measure) is reported too: it is what a count after a compaction is.

Error = |count − prompt_tokens| / prompt_tokens. Loopback only; stops by itself.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench import _common, headline_bench

TIMEOUT_S = {"quick": 600, "full": 1500}
CTX = 8192
MAX_TOKENS = 16
#: Requests whose prompt passes this share of the window drop their oldest exchange first.
FILL = 0.8


def _errors(counts: list[int], prompts: list[int]) -> list[float]:
    return [abs(c - p) / p for c, p in zip(counts, prompts, strict=True) if p]


def distribution(errors: list[float]) -> dict[str, Any]:
    """Median, 90th percentile, max (percent) and the share within 2% of a list of errors."""
    if not errors:
        return {"n": 0}
    pct = [e * 100 for e in errors]
    return {
        "n": len(pct),
        "median_pct": round(statistics.median(pct), 2),
        "p90_pct": round(_common.percentile(pct, 90), 2),
        "max_pct": round(max(pct), 2),
        "within_2pct_share": round(sum(1 for e in pct if e <= 2.0) / len(pct), 3),
    }


async def play(engine_url: str, turns: int) -> dict[str, Any]:
    """Play ``turns`` turns of the scripted session; per request: prompt_tokens, the counts
    (estimate / exact, at send and whole prompt) and the turn's kind."""
    from loki_chat.meter import ContextMeter
    from loki_chat.settings import Settings
    from loki_chat.tokens import TokenCounts
    from loki_shared.messages.chat import ChatMessage

    system = Settings.model_fields["system_prompt"].default
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=engine_url, timeout=120) as http:
        counter = TokenCounts(http, timeout_s=10.0)
        counter.use(engine_url, None, "bundled", external=False)
        est, exact = ContextMeter(), ContextMeter(counter=counter)
        messages: list[ChatMessage] = []
        for turn in headline_bench.script_session(max(6, turns))[:turns]:
            messages.append(ChatMessage(role="user", content=turn.text))
            await exact.prime(system, messages)
            at_send = {
                "estimate": est.used(system, messages),
                "exact": exact.used(system, messages),
            }
            whole = {
                "estimate": est.view_tokens(system, messages),
                "exact": exact.view_tokens(system, messages),
            }
            wire = [{"role": "system", "content": system}] + [
                {"role": m.role, "content": m.content} for m in messages
            ]
            resp = await http.post(
                "/v1/chat/completions",
                json={
                    "messages": wire,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "cache_prompt": True,
                },
            )
            resp.raise_for_status()
            doc = resp.json()
            usage = doc.get("usage") or {}
            prompt = int(usage.get("prompt_tokens") or 0)
            reply = doc["choices"][0]["message"].get("content") or ""
            rows.append({"kind": turn.kind, "prompt": prompt, "at_send": at_send, "whole": whole})
            messages.append(ChatMessage(role="assistant", content=reply))
            for meter in (est, exact):
                meter.record(usage, 0, False, len(messages))
            if prompt > FILL * CTX:  # a crude window: the oldest exchange goes (no measure)
                del messages[:2]
                est.invalidate()
                exact.invalidate()
    return {"rows": rows, "fallbacks": counter.fallbacks, "batches": counter.batches}


def run(quick: bool) -> dict[str, Any]:
    """The bench entry point (see the module docstring)."""
    turns = 18 if quick else 30
    start = time.monotonic()
    with _common.llama(ctx=CTX) as engine:
        facts = _common.engine_build(engine.url)
        played = asyncio.run(play(engine.url, turns))
    rows = played["rows"]
    prompts = [r["prompt"] for r in rows]
    dists: dict[str, dict[str, Any]] = {}
    for form in ("at_send", "whole"):
        for how in ("estimate", "exact"):
            dists[f"{form}/{how}"] = distribution(_errors([r[form][how] for r in rows], prompts))
    by_kind = []
    for kind in ("short", "long", "paste", "tool"):
        ks = [r for r in rows if r["kind"] == kind]
        if not ks:
            continue
        kp = [r["prompt"] for r in ks]
        e = distribution(_errors([r["whole"]["estimate"] for r in ks], kp))
        x = distribution(_errors([r["whole"]["exact"] for r in ks], kp))
        by_kind.append(
            [kind, len(ks), e["median_pct"], e["max_pct"], x["median_pct"], x["max_pct"]]
        )
    table_rows = [
        [
            form.replace("at_send", "at send (measure + since)").replace(
                "whole", "whole prompt (no measure)"
            ),
            how,
            d["n"],
            d["median_pct"],
            d["p90_pct"],
            d["max_pct"],
            d["within_2pct_share"],
        ]
        for key, d in dists.items()
        for form, how in [key.split("/")]
    ]
    tables = [
        _common.table(
            "Count at send vs prompt_tokens (error, %)",
            ["count", "counted by", "requests", "median", "p90", "max", "share within 2%"],
            table_rows,
            notes=(
                f"The benchmarks' scripted session, {turns} turns, one request each "
                f"(window {CTX}, replies capped at {MAX_TOKENS} tokens), bundled model. "
                "`estimate`: characters/4 + 4 per message (before issue 23); `exact`: the "
                "engine's tokenizer and template overhead (after)."
            ),
        ),
        _common.table(
            "Whole-prompt error by the kind of the last message (%)",
            ["kind", "requests", "estimate median", "estimate max", "exact median", "exact max"],
            by_kind,
        ),
    ]
    exact_at_send = dists["at_send/exact"]
    targets = [
        _common.target(
            "count at send within 2% of prompt_tokens (exact counts, max)",
            exact_at_send.get("max_pct"),
            "<=",
            2,
            "%",
            issue="23",
        ),
    ]
    return _common.result(
        "Token count at send vs the engine's prompt_tokens",
        tables=tables,
        targets=targets,
        data={
            "distributions": dists,
            "rows": rows,
            "exact_fallbacks": played["fallbacks"],
            "seconds": round(time.monotonic() - start, 1),
        },
        notes="Issue 23. Exact counts fell back to the estimate "
        f"{played['fallbacks']} time(s) of {played['batches']} batch(es).",
        engine=facts,
    )
