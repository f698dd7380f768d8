"""The headline's long mode (issue 37): does a conversation's cache cost creep in with age?

The headline's scripted session (short and long messages, pasted code and tool output, side
work between turns: a ``/v1`` request and a ``bench`` request, the compactions the 4,096-token
window forces) runs to 200 turns (60 in quick mode; ``LOKI_HEADLINE_LONG_TURNS`` sets it) on
the real llama-server with the bundled model, with loki-reuse's keys (the headline's best
configuration), through the whole stack. The recomputation ratio (Σ prompt_n / Σ new tokens,
the headline's method: :func:`bench.headline_bench.analyse`) is reported per window of 50
turns: each request counts in the window of the turn it was sent in (side work and summaries
included). Target: every window ≤ 1.03. The engine restart step is the headline's own
(:func:`bench.headline_bench.run_restart`), not repeated here.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from typing import Any

from bench import _common
from bench import headline_bench as headline

TIMEOUT_S = {"quick": 3600, "full": 7200}
WINDOW = 50


def _turn(req: dict[str, Any], turn_ts: list[float]) -> int:
    """The 0-based turn a request counts in: the last user message logged before it."""
    return max(0, bisect.bisect_right(turn_ts, float(req["ts"])) - 1)


def _extra(req: dict[str, Any]) -> int:
    """prompt_n − new: what the engine prefilled that was not new to it."""
    return int(req["prompt_n"] or 0) - int(req["new"] or 0)


def windows(
    per_request: list[dict[str, Any]], turn_ts: list[float], size: int = WINDOW
) -> list[dict[str, Any]]:
    """The ratio per window of ``size`` turns: each request goes to the turn whose user
    message was logged last before it was sent (requests before the first turn: turn 0).

    Returns:
        ``[{"turns": "1–50", "requests", "prefilled", "new", "extra_by_kind", "ratio"}]`` in
        turn order; ``extra_by_kind`` is Σ (prompt_n − new) per request kind (main, compact,
        prewarm, v1, bench…): where a window's recomputation comes from.
    """
    out: dict[int, dict[str, Any]] = {}
    for req in per_request:
        w = out.setdefault(
            _turn(req, turn_ts) // size,
            {"requests": 0, "prefilled": 0, "new": 0, "extra_by_kind": {}},
        )
        w["requests"] += 1
        w["prefilled"] += int(req["prompt_n"] or 0)
        w["new"] += int(req["new"] or 0)
        kind = str(req.get("kind") or "?")
        w["extra_by_kind"][kind] = w["extra_by_kind"].get(kind, 0) + _extra(req)
    rows = []
    for index in sorted(out):
        w = out[index]
        last = min((index + 1) * size, len(turn_ts))
        rows.append(
            {
                "turns": f"{index * size + 1}–{last}",
                **w,
                "ratio": round(w["prefilled"] / w["new"], 4) if w["new"] else None,
            }
        )
    return rows


def top_extra(
    per_request: list[dict[str, Any]], turn_ts: list[float], n: int = 12
) -> list[dict[str, Any]]:
    """The ``n`` requests with the most prompt_n − new, each with its turn (1-based) and kind."""
    rows = [
        {
            "turn": _turn(r, turn_ts) + 1,
            "extra": _extra(r),
            **{
                k: r.get(k)
                for k in ("kind", "prompt_tokens", "cache_n", "prompt_n", "new", "exact")
            },
        }
        for r in per_request
    ]
    return sorted(rows, key=lambda r: -r["extra"])[:n]


def run(quick: bool) -> dict[str, Any]:
    """See the module docstring."""
    n_turns = int(os.environ.get("LOKI_HEADLINE_LONG_TURNS") or (60 if quick else 200))
    turns = headline.script_session(n_turns)
    config = next(c for c in headline.loki_configs(False) if c.name == "loki-reuse")
    deadline = time.monotonic() + TIMEOUT_S["quick" if quick else "full"] - 300
    fig = headline.run_loki(turns, headline.CTX, config, deadline)
    rows = windows(fig["per_request"], fig["turn_user_ts"])
    worst = max((r["ratio"] for r in rows if r["ratio"] is not None), default=None)
    return _common.result(
        f"Headline, long mode: {fig['turns_done']} turns of loki-reuse",
        tables=[
            _common.table(
                f"Recomputation ratio per {WINDOW} turns",
                ["turns", "requests", "Σ prompt_n", "Σ new", "prompt_n − new by kind", "ratio"],
                [
                    [
                        r["turns"],
                        r["requests"],
                        r["prefilled"],
                        r["new"],
                        ", ".join(f"{k} {v}" for k, v in sorted(r["extra_by_kind"].items()) if v),
                        r["ratio"],
                    ]
                    for r in rows
                ],
                notes=f"Whole session: ratio {fig['ratio']}, exact floor {fig.get('floor')}, "
                f"{fig['compactions']} compactions, {fig['summary_requests']} summary requests, "
                f"wall {fig['wall_s']} s.",
            )
        ],
        targets=[
            _common.target(
                f"worst {WINDOW}-turn window, loki-reuse ratio", worst, "<=", 1.03, issue="37"
            ),
            _common.target("turns done", fig["turns_done"], ">=", n_turns, issue="37"),
        ],
        data={
            "windows": rows,
            "figures": {k: v for k, v in fig.items() if k != "per_request"},
            # the requests that recomputed most, with the turn they count in: where to look
            "top_extra": top_extra(fig["per_request"], fig["turn_user_ts"]),
        },
        notes="CTX 4096, replies capped at 24 tokens, temperature 0.7: the headline's session "
        "continued past its 40 turns (the script cycles its kinds of message).",
        engine=fig.get("engine"),
    )


def main() -> None:
    """Run by hand: ``python -m bench.headline_long_bench [--quick]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    doc = run(parser.parse_args().quick)
    print(json.dumps(doc["tables"], indent=1))
    print(json.dumps(doc["targets"], indent=1))


if __name__ == "__main__":
    main()
