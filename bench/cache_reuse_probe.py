"""Probe: can llama-server keep a compaction's verbatim tail in its prompt cache?

Not a harness bench (no target): the evidence behind the headline's floor in
``docs/behaviour.md`` (bench). On the real engine with the bundled model, a 16-message
conversation is cached, then a compacted prompt is sent in two layouts, from the same cache:

- Loki's (the compaction issue's): system, summary, tail, new user message — the summary
  sits between the cached system prompt and the tail, so the tail is recomputed;
- tail first: system, the torso's last user request, the tail, then the summary joined to the
  new user message — with ``--cache-reuse N`` llama-server shifts the cached block (it directly
  follows the common prefix) and computes only the summary and the new message.

Each layout is measured with and without ``--cache-reuse 32``; printed as ``(cache_n,
prompt_n)``. Usage: ``python -m bench.cache_reuse_probe``.
"""

from __future__ import annotations

import random
from typing import Any

import httpx

from bench import _common

_WORDS = (
    "request response buffer token window slot cache prefix stream chunk retry timeout "
    "lock queue worker record"
).split()


def _conversation(seed: int = 3) -> tuple[list[dict[str, str]], dict[str, str], str]:
    rng = random.Random(seed)

    def para(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n)) + "."

    conv: list[dict[str, str]] = []
    for i in range(8):
        conv += [
            {"role": "user", "content": f"Question {i}: " + para(120)},
            {"role": "assistant", "content": f"Answer {i}: " + para(60)},
        ]
    return (
        conv,
        {"role": "user", "content": "Next question: " + para(20)},
        "Summary of the conversation so far: " + para(80),
    )


def _send(url: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 1, "temperature": 0, "cache_prompt": True},
        timeout=600,
    )
    r.raise_for_status()
    timings = r.json()["timings"]
    return int(timings.get("cache_n") or 0), int(timings["prompt_n"])


def probe(cache_reuse: int) -> dict[str, Any]:
    """``{"full": .., "loki_layout": .., "tail_first": ..}`` as ``(cache_n, prompt_n)``."""
    system = {"role": "system", "content": "You are a helpful assistant."}
    conv, new, summary = _conversation()
    full = [system, *conv, new]
    tail = conv[11:]  # starts on an assistant message, about the last 30%
    extra = ["--cache-reuse", str(cache_reuse)] if cache_reuse else []
    with _common.llama(ctx=4096, parallel=1, extra=extra) as engine:
        out = {"full": _send(engine.url, full)}
        out["loki_layout"] = _send(
            engine.url, [system, {"role": "user", "content": summary}, *tail, new]
        )
        _send(engine.url, full)  # the same cache before the other layout
        out["tail_first"] = _send(
            engine.url,
            [
                system,
                conv[10],
                *tail,
                {"role": "user", "content": summary + "\n\n" + new["content"]},
            ],
        )
    return out


def main() -> None:
    for reuse in (0, 32):
        print(f"--cache-reuse {reuse}: {probe(reuse)}")


if __name__ == "__main__":
    main()
