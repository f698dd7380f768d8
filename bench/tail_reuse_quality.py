"""What COMPACT_TAIL_REUSE costs in quality (issue 21 §1), on the real engine, bundled model.

For N compacted conversations (the cache-reuse probe's shape, one seed each: eight exchanges,
about 2,400 tokens, the last ~30% kept verbatim, a synthetic summary), a 32-token greedy
continuation is generated three ways, with ``logprobs`` of every chosen token:

- ``shifted``: tail first, sent right after the full conversation was cached, with
  ``--cache-reuse 256`` — llama-server shifts the tail's KV (what the key does);
- ``tail_first``: the same bytes recomputed from scratch (``cache_prompt: false``);
- ``summary_first``: the seeds' layout (system, summary, tail, new message), recomputed.

Two comparisons, each over the positions up to the first different token (greedy decoding
diverges after it): (a) ``shifted`` vs ``tail_first`` isolates the KV shift; (b)
``tail_first`` vs ``summary_first`` isolates the layout. ``top1_agreement``: positions of the
32 where both chose the same token before any divergence, ÷ 32; ``mean_abs_dlogprob``: mean
|Δ logprob| of the chosen token over those positions. Usage:
``python -m bench.tail_reuse_quality [--n 20]``; the result is printed as JSON and written to
``bench/results/tail_reuse_quality.json``.

Status (2026-12-01): one run of 20 conversations on llama-server b11434 completed (the shift
itself worked: ``cache_n`` 482, ``prompt_n`` 145 per conversation), but every continuation
came back without ``choices[0].logprobs.content``, so no figure was computed: how this build
returns per-token log-probabilities (``logprobs``/``top_logprobs`` on ``/v1/chat/completions``,
or ``n_probs`` on ``/completion``) must be checked before the figures mean anything.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import httpx

from bench import _common

_WORDS = (
    "request response buffer token window slot cache prefix stream chunk retry timeout "
    "lock queue worker record"
).split()
TOKENS = 32
RESULT = Path(__file__).resolve().parent / "results" / "tail_reuse_quality.json"
SUMMARY_FIRST_HEADER = (
    "[Summary of the earlier conversation, written by Loki when it was compacted.]\n"
)
TAIL_FIRST_HEADER = (
    "[Summary of the conversation before the messages above, written by Loki when it was "
    "compacted.]\n"
)


def conversation(seed: int) -> tuple[list[dict[str, str]], str, str]:
    """Eight exchanges, the new user message, the summary text (deterministic per seed)."""
    rng = random.Random(seed)

    def para(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n)) + "."

    conv: list[dict[str, str]] = []
    for i in range(8):
        conv += [
            {"role": "user", "content": f"Question {i}: " + para(120)},
            {"role": "assistant", "content": f"Answer {i}: " + para(60)},
        ]
    return conv, "Next question: " + para(20), "Goals and state so far: " + para(80)


def generate(url: str, messages: list[dict[str, str]], cache: bool) -> dict[str, Any]:
    """A greedy 32-token continuation: ``tokens``, ``logprobs`` and the ``timings``."""
    r = httpx.post(
        url + "/v1/chat/completions",
        json={
            "messages": messages,
            "max_tokens": TOKENS,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 1,
            "cache_prompt": cache,
        },
        timeout=600,
    )
    r.raise_for_status()
    data = r.json()
    content = (data["choices"][0].get("logprobs") or {}).get("content") or []
    return {
        "tokens": [c["token"] for c in content],
        "logprobs": [float(c["logprob"]) for c in content],
        "timings": data.get("timings") or {},
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float | None]:
    """(top-1 agreement over :data:`TOKENS`, mean |Δ logprob| before the first divergence)."""
    same = 0
    deltas: list[float] = []
    for ta, tb, la, lb in zip(a["tokens"], b["tokens"], a["logprobs"], b["logprobs"]):
        if ta != tb:
            break
        same += 1
        deltas.append(abs(la - lb))
    return same / TOKENS, (sum(deltas) / len(deltas) if deltas else None)


def one(url: str, seed: int) -> dict[str, Any]:
    """The three continuations and the two comparisons of one conversation."""
    system = {"role": "system", "content": "You are a helpful assistant."}
    conv, new, summary = conversation(seed)
    tail = conv[11:]  # starts on an assistant message, about the last 30%
    full = [system, *conv]
    tail_first = [
        system,
        *tail,
        {"role": "user", "content": TAIL_FIRST_HEADER + summary + "\n\n" + new},
    ]
    summary_first = [
        system,
        {"role": "user", "content": SUMMARY_FIRST_HEADER + summary},
        *tail,
        {"role": "user", "content": new},
    ]
    generate(url, full, True)  # the conversation as the slot held it before the compaction
    shifted = generate(url, tail_first, True)
    scratch = generate(url, tail_first, False)
    seeds_layout = generate(url, summary_first, False)
    shift_agree, shift_dlp = compare(shifted, scratch)
    layout_agree, layout_dlp = compare(scratch, seeds_layout)
    return {
        "seed": seed,
        "shifted_cache_n": shifted["timings"].get("cache_n"),
        "shifted_prompt_n": shifted["timings"].get("prompt_n"),
        "shift": {"top1_agreement": shift_agree, "mean_abs_dlogprob": shift_dlp},
        "layout": {"top1_agreement": layout_agree, "mean_abs_dlogprob": layout_dlp},
    }


def summarise(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Mean agreement and mean |Δ logprob| of one comparison over the conversations."""
    agree = [r[key]["top1_agreement"] for r in rows]
    dlp = [r[key]["mean_abs_dlogprob"] for r in rows if r[key]["mean_abs_dlogprob"] is not None]
    return {
        "top1_agreement": round(sum(agree) / len(agree), 4),
        "identical": sum(1 for a in agree if a == 1.0),
        "mean_abs_dlogprob": round(sum(dlp) / len(dlp), 5) if dlp else None,
    }


def run(n: int = 20) -> dict[str, Any]:
    """Measure ``n`` conversations on one engine (``--cache-reuse 256``)."""
    with _common.llama(ctx=4096, parallel=1, extra=["--cache-reuse", "256"]) as engine:
        rows = [one(engine.url, seed) for seed in range(n)]
    return {
        "conversations": n,
        "tokens": TOKENS,
        "shift": summarise(rows, "shift"),
        "layout": summarise(rows, "layout"),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    result = run(args.n)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
