"""The headline: how close Loki gets to recomputing nothing.

A scripted session (at least 30 turns: short and long user messages, pasted code, pasted
tool output, at least one compaction, side work between turns — a ``/v1`` client request and
a ``bench`` request) runs on the real llama-server with the bundled model, once per
configuration:

- ``naive``: a plain client straight to llama-server, with a clock line in the system prompt
  (as many chat front-ends do) and, when the window fills, the oldest exchanges dropped;
- ``loki-default``: the whole Loki stack with default keys;
- ``loki-side-slot``, ``loki-cache-ram``, ``loki-continuation``: one key on each;
- ``loki-best``: every key this machine allows (the seeds' keys), PREWARM off (the
  reference for the time to first token after a compaction);
- ``loki-reuse``: loki-best + COMPACT_TAIL_REUSE + PREWARM (issue 21), the engine with
  ``--cache-reuse`` as the supervisor gives it for the key;
- ``loki-restart`` (:func:`run_restart`): the engine restart step with SLOT_PERSIST.

Every request the engine serves goes through :class:`bench._common.RecordingProxy`, which keeps
the request body and llama-server's ``timings``. Then:

    ratio = Σ prompt_n (tokens the engine prefilled) / Σ new tokens

A request's new tokens are the tokens of its prompt that were not in the previous request of
the same conversation: ``max(1, len(P_i) − held(P_i, P_prev ⊕ G_prev))`` where ``P`` is the
prompt as the engine tokenizes it (the request body rendered by the engine's own chat template,
``/apply-template``, then ``/tokenize``), ``G`` the generated tokens (``/tokenize`` of the
generated text: the engine holds them after the request too), and ``held`` the tokens of
matching runs of at least :data:`MIN_BLOCK` tokens in a :mod:`difflib` alignment. So a clock
line changes only its own few tokens' "newness", while the engine must recompute everything
after it; a compaction's summary is new, its verbatim tail is not (the engine recomputes it
anyway); a transcript summary request is compared with the conversation it summarises.
Conversations: the main one, each kind of side job (tagged), summaries (compared with the
main one). ``max(1, ·)``: llama.cpp always evaluates at least one token (a full hit reads
``cache_n = N−1, prompt_n = 1``). The physical limit is 1.0.

Beside it, each configuration's exact-attention floor (:func:`exact_floor`): ``(Σ new +
Σ forced) / Σ new``, forced = the tokens that are not new but that an ideal exact-attention
prompt cache (every earlier request kept, reuse only after an identical prefix) must still
recompute — after each compaction, the tail and summary its layout places behind something
new. Then the time to first token of the first turn after each compaction ÷ the median of
the session's ordinary turns (:func:`ttft_after_compaction`, from the display log), and the
share of a turn's prompt recomputed after llama-server is killed and relaunched with
SLOT_PERSIST (:func:`run_restart`). See ``docs/behaviour.md (bench)``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import _common
from loki_chat.compaction.summary_client import RETRY_SAMPLING
from loki_shared.sse import decode_all

TIMEOUT_S = {"quick": 600, "full": 5400}

#: Reply length cap for every completion of the session (tokens): the figure is about the
#: prompt, and generation is the slow part on a shared 2-core machine.
MAX_TOKENS = 24

#: The conversation's window (tokens; per slot with SIDE_SLOT).
CTX = 4096

#: Shortest run of tokens counted as carried over from the previous request.
MIN_BLOCK = 8

SIDE_V1_TAG = "[side:v1]"


def _progress(name: str, done: int, total: int, start: float) -> None:
    import sys

    print(
        f"[headline] {name}: turn {done}/{total} at {time.monotonic() - start:.0f} s",
        file=sys.stderr,
        flush=True,
    )


SIDE_BENCH_TAG = "[side:bench]"


# =========================================================================== arithmetic
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def held_tokens(prompt: Sequence[int], reference: Sequence[int], min_block: int = MIN_BLOCK) -> int:
    """Tokens of ``prompt`` that were already in ``reference``: the sizes of the matching
    blocks of a :class:`difflib.SequenceMatcher` alignment (no junk heuristic), counting
    only runs of at least ``min_block`` tokens (shorter runs are chance matches of common
    tokens, not content carried over)."""
    import difflib

    matcher = difflib.SequenceMatcher(None, list(prompt), list(reference), autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= min_block)


@dataclass
class Request:
    """One request for :func:`new_tokens`: its ``group`` (the conversation it belongs to),
    its prompt and generated tokens, and ``reference``: the group whose latest request it
    is compared with (None: its own group; a summary request is compared with the
    conversation it summarises)."""

    group: str
    prompt: Sequence[int]
    generated: Sequence[int] = ()
    reference: str | None = None


def new_tokens(requests: Sequence[Request], min_block: int = MIN_BLOCK) -> list[int]:
    """Tokens of each request that were not in the previous request of the same
    conversation: ``max(1, len(P_i) − held(P_i, P_prev ⊕ G_prev))``, ``P_prev ⊕ G_prev``
    the prompt and generated tokens of the latest earlier request of the reference group
    (what the engine holds after it), ``held`` from :func:`held_tokens`. The first request
    of a group is new but for the prefix it shares with the request just before it (the
    engine holds that one whatever its conversation). ``max(1, ·)``: llama.cpp always evaluates at least one
    token (a full hit reads ``cache_n = N−1, prompt_n = 1``)."""
    last: dict[str, list[int]] = {}
    previous: list[int] | None = None
    out: list[int] = []
    for req in requests:
        ref = last.get(req.reference or req.group)
        held = held_tokens(req.prompt, ref, min_block) if ref else 0
        if previous is not None and previous is not ref:
            # what the engine held just before, when it shares more (a template's opening)
            held = max(held, common_prefix(req.prompt, previous))
        out.append(max(1, len(req.prompt) - held))
        previous = last[req.group] = list(req.prompt) + list(req.generated)
    return out


def recomputation(prefilled: Sequence[int], new: Sequence[int]) -> dict[str, Any]:
    """``{"prefilled": Σ prompt_n, "new": Σ new, "extra": prefilled − new, "ratio":
    prefilled / new, "requests": n}``.

    Raises:
        ValueError: lengths differ, or no new token at all (ratio undefined).
    """
    if len(prefilled) != len(new):
        raise ValueError(f"{len(prefilled)} prompt_n for {len(new)} new-token counts")
    total_new = sum(new)
    if total_new <= 0:
        raise ValueError("no new token: the ratio is undefined")
    total = sum(prefilled)
    return {
        "prefilled": total,
        "new": total_new,
        "extra": total - total_new,
        "ratio": total / total_new,
        "requests": len(new),
    }


def exact_prefill(requests: Sequence[Request]) -> list[int]:
    """What an ideal exact-attention prompt cache would still prefill for each request:
    ``max(1, len(P_i) − max_{j<i} common_prefix(P_i, P_j ⊕ G_j))``.

    The ideal cache keeps every earlier request's prompt and generated tokens for ever (any
    slot, no memory limit), and reuses a cached token only after an identical prefix: with
    exact attention a token's K/V depend on every token before it, so a token whose prefix
    changed must be computed again even when its text is the same (llama.cpp's prompt cache;
    ``--cache-reuse`` shifts chunks instead, an approximation, so it can go below this).
    ``max(1, ·)``: llama.cpp always evaluates at least one token."""
    held: list[list[int]] = []
    out: list[int] = []
    for req in requests:
        prompt = list(req.prompt)
        best = max((common_prefix(prompt, h) for h in held), default=0)
        out.append(max(1, len(prompt) - best))
        held.append(prompt + list(req.generated))
    return out


def exact_floor(new: Sequence[int], exact: Sequence[int]) -> dict[str, Any]:
    """The exact-attention floor of a recorded session: ``{"floor": (Σ new + Σ forced) /
    Σ new, "forced": Σ forced, "per_request": [forced_i]}`` with ``forced_i = max(0, exact_i −
    new_i)`` (:func:`exact_prefill`, :func:`new_tokens`): tokens that are not new but that
    even an ideal exact-attention cache must recompute because something before them
    changed — after a compaction, the verbatim tail behind a new summary (the seeds' layout)
    or the summary and tail moved to another place (tail first), a clock line's suffix for
    the naive client. The measured ratio can reach this floor, not 1.0, without KV shifting.

    Raises:
        ValueError: lengths differ, or no new token at all.
    """
    if len(new) != len(exact):
        raise ValueError(f"{len(exact)} exact counts for {len(new)} new-token counts")
    total_new = sum(new)
    if total_new <= 0:
        raise ValueError("no new token: the floor is undefined")
    forced = [max(0, e - n) for e, n in zip(exact, new, strict=True)]
    return {
        "floor": (total_new + sum(forced)) / total_new,
        "forced": sum(forced),
        "per_request": forced,
    }


# =========================================================================== the session
@dataclass
class Turn:
    """One scripted user turn: ``kind`` (short, long, paste, tool), the text, and the side
    work run right after it (``v1``, ``bench``); ``compact``: ask a compaction after it."""

    kind: str
    text: str
    side: list[str] = field(default_factory=list)
    compact: bool = False


_TOPICS = [
    "the cache layer",
    "the parser",
    "the retry loop",
    "the config loader",
    "the scheduler",
    "the HTTP client",
    "the test fixtures",
    "the CLI",
]
_SHORT = [
    "ok, and then?",
    "Why?",
    "Can you make it shorter?",
    "Thanks. Next step?",
    "Is that safe?",
    "What about errors?",
    "Fine.",
    "Explain in one line.",
]
_WORDS = [
    "request",
    "response",
    "buffer",
    "token",
    "window",
    "slot",
    "cache",
    "prefix",
    "stream",
    "chunk",
    "retry",
    "timeout",
    "lock",
    "queue",
    "worker",
    "record",
    "summary",
    "archive",
    "block",
    "label",
    "index",
    "query",
    "latency",
    "budget",
    "context",
    "engine",
    "prompt",
    "reply",
    "model",
    "error",
    "commit",
    "branch",
    "test",
]


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _code_block(rng: random.Random, turn: int, scale: float = 1.0) -> str:
    lines = [f"# file: src/module_{turn}.py", "import json", "import time", ""]
    for f in range(max(1, round(rng.randint(5, 7) * scale))):
        name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{f}"
        lines += [
            f"def {name}(items, limit={rng.randint(2, 99)}):",
            f'    """Return the {rng.choice(_WORDS)}s of items under limit."""',
            "    out = []",
            "    for item in items:",
            f"        if item.get('{rng.choice(_WORDS)}', 0) < limit:",
            "            out.append(item)",
            "    return out",
            "",
        ]
    return "\n".join(lines)


def _tool_output(rng: random.Random, turn: int, scale: float = 1.0) -> str:
    lines = [f"$ pytest -q tests/test_module_{turn}.py"]
    for i in range(max(2, round(rng.randint(8, 12) * scale))):
        ok = rng.random() > 0.2
        lines.append(
            f"tests/test_module_{turn}.py::test_{rng.choice(_WORDS)}_{i} "
            + (
                "PASSED"
                if ok
                else f"FAILED - AssertionError: {rng.randint(1, 9)} != {rng.randint(10, 99)}"
            )
        )
    lines.append(
        f"==== {rng.randint(1, 3)} failed, {rng.randint(8, 12)} passed in "
        f"{rng.random() * 3:.2f}s ===="
    )
    return "\n".join(lines)


def script_session(
    n_turns: int = 30, seed: int = 7, scale: float = 1.0, explicit_compaction: bool = False
) -> list[Turn]:
    """The scripted session: a deterministic list of ``n_turns`` turns cycling short
    question, long message, pasted code, short question, pasted tool output, long message;
    side work after turns 3, 8, 13… (``v1``) and 5, 12, 19… (``bench``). ``scale`` shrinks
    or grows the long messages, pasted code and tool output. ``explicit_compaction``: one
    compaction request (the UI's button) two thirds in; off by default, the window forces
    the session's compactions as it fills (a manual compaction always takes the cold
    transcript path, a user's deliberate choice, not what a long conversation costs).

    Raises:
        ValueError: fewer than 6 turns.
    """
    if n_turns < 6:
        raise ValueError("a session needs at least 6 turns")
    rng = random.Random(seed)
    turns: list[Turn] = []
    cycle = ["short", "long", "paste", "short", "tool", "long"]
    for i in range(n_turns):
        kind = cycle[i % len(cycle)]
        topic = rng.choice(_TOPICS)
        if kind == "short":
            text = rng.choice(_SHORT)
        elif kind == "long":
            text = f"Let us look at {topic}. " + " ".join(
                _sentence(rng, rng.randint(8, 14))
                for _ in range(max(1, round(rng.randint(6, 9) * scale)))
            )
        elif kind == "paste":
            text = (
                f"Here is {topic}, review it briefly:\n```python\n{_code_block(rng, i, scale)}\n```"
            )
        else:
            text = (
                f"The tests of {topic} say:\n```\n{_tool_output(rng, i, scale)}\n```\nWhat failed?"
            )
        side = []
        if i % 5 == 3:
            side.append("v1")
        if i % 7 == 5:
            side.append("bench")
        turns.append(Turn(kind, text, side))
    if explicit_compaction:
        turns[(2 * n_turns) // 3].compact = True
    return turns


def side_messages(kind: str, index: int) -> list[dict[str, str]]:
    """The messages of one side job (a ``/v1`` client or a ``bench`` request): a conversation
    of its own, tagged in its system message so the proxy records can be told apart."""
    tag = SIDE_V1_TAG if kind == "v1" else SIDE_BENCH_TAG
    return [
        {"role": "system", "content": f"{tag} You translate English to French."},
        {"role": "user", "content": f"Translate: the build number {index} passed all tests."},
    ]


# =========================================================================== measuring
def tokenize_exchange(engine_url: str, ex: _common.Exchange) -> tuple[list[int], list[int]]:
    """``(prompt tokens, generated tokens)`` of one recorded request, rendered by the
    engine itself (``/apply-template`` then ``/tokenize``, special tokens parsed as the
    server does for a chat prompt).

    Raises:
        httpx.HTTPError: the engine did not answer.
    """
    import httpx

    if "messages" in ex.body:
        body = {
            k: v
            for k, v in ex.body.items()
            if k
            in (
                "messages",
                "tools",
                "tool_choice",
                "chat_template_kwargs",
                "parallel_tool_calls",
                "reasoning_format",
            )
        }
        r = httpx.post(f"{engine_url}/apply-template", json=body, timeout=60)
        r.raise_for_status()
        prompt_text = r.json()["prompt"]
    else:
        prompt_text = ex.body.get("prompt", "")
    r = httpx.post(
        f"{engine_url}/tokenize",
        json={"content": prompt_text, "add_special": True, "parse_special": True},
        timeout=60,
    )
    r.raise_for_status()
    prompt = r.json()["tokens"]
    generated: list[int] = []
    if ex.content:
        r = httpx.post(
            f"{engine_url}/tokenize",
            json={"content": ex.content, "add_special": False, "parse_special": False},
            timeout=60,
        )
        r.raise_for_status()
        generated = r.json()["tokens"]
    return prompt, generated


def summary_retries(exchanges: Sequence[_common.Exchange]) -> int:
    """How many of the ``compact`` requests were the one retry of a looping or empty summary
    (the chat service's :data:`~loki_chat.compaction.summary_client.RETRY_SAMPLING`: its
    ``repeat_penalty`` is the mark; a first ask never carries one)."""
    mark = RETRY_SAMPLING["repeat_penalty"]
    return sum(
        1 for ex in exchanges if classify(ex) == "compact" and ex.body.get("repeat_penalty") == mark
    )


def classify(ex: _common.Exchange) -> str:
    """What a recorded request was: ``v1`` / ``bench`` (tagged side jobs), ``compact`` (an
    untagged non-streamed request: the summariser's shape, every turn step is streamed),
    ``prewarm`` (streamed with ``max_tokens: 1``: PREWARM's shape, :mod:`loki_chat.prewarm`;
    a turn step asks :data:`MAX_TOKENS`), else ``main``."""
    text = json.dumps(ex.body.get("messages", [])[:1])
    if SIDE_V1_TAG in text:
        return "v1"
    if SIDE_BENCH_TAG in text:
        return "bench"
    if not ex.body.get("stream"):
        return "compact"  # the chat service streams every turn step; summaries are not
    if ex.body.get("max_tokens") == 1:
        return "prewarm"
    return "main"


#: The conversation a kind of request belongs to for :func:`new_tokens` (a prewarm sends
#: the main conversation's next prefix; others are their own kind).
GROUP = {"prewarm": "main"}


def after_compaction(kinds: Sequence[str]) -> list[str]:
    """``kinds`` with each ``main`` request that is the first after a compaction's summary
    relabelled ``main-after-compact``: the request that recomputes the verbatim tail behind
    the new summary (how much of the extra is that, by kind in the report)."""
    out: list[str] = []
    pending = False
    for kind in kinds:
        if kind == "compact":
            pending = True
        elif kind == "main" and pending:
            kind, pending = "main-after-compact", False
        out.append(kind)
    return out


def analyse(engine_url: str, exchanges: Sequence[_common.Exchange]) -> dict[str, Any]:
    """The recomputation figures of a recorded session (see the module docstring).

    Requests without an HTTP 200 or without ``timings.prompt_n`` are left out of both sums
    and counted in ``left_out``. ``check`` compares the rendered prompt's length with the
    engine's own ``cache_n + prompt_n`` (how exact the rendering is).
    """
    kept = [e for e in exchanges if e.status == 200 and isinstance(e.prompt_n, int)]
    prompts: list[list[int]] = []
    gens: list[list[int]] = []
    for ex in kept:
        p, g = tokenize_exchange(engine_url, ex)
        prompts.append(p)
        gens.append(g)
    kinds = [classify(e) for e in kept]
    requests = [
        Request(GROUP.get(kind, kind), p, g, "main" if kind == "compact" else None)
        for kind, p, g in zip(kinds, prompts, gens, strict=True)
    ]
    new = new_tokens(requests)
    exact = exact_prefill(requests)
    prefilled = [int(e.prompt_n or 0) for e in kept]
    forced = [max(0, x - n) for x, n in zip(exact, new, strict=True)]
    by_kind: dict[str, dict[str, int]] = {}
    for kind, pre, nw, fo in zip(after_compaction(kinds), prefilled, new, forced, strict=True):
        slot = by_kind.setdefault(kind, {"requests": 0, "prefilled": 0, "new": 0, "forced": 0})
        slot["requests"] += 1
        slot["prefilled"] += pre
        slot["new"] += nw
        slot["forced"] += fo
    mismatch = [
        abs(len(p) - (int(e.cache_n or 0) + int(e.prompt_n or 0)))
        for p, e in zip(prompts, kept, strict=True)
    ]
    figures = (
        recomputation(prefilled, new)
        if kept
        else {"prefilled": 0, "new": 0, "extra": 0, "ratio": None, "requests": 0}
    )
    floor = exact_floor(new, exact) if kept else {"floor": None, "forced": 0}
    figures.update(
        floor=floor["floor"],
        forced=floor["forced"],
        above_floor=(
            figures["ratio"] - floor["floor"]
            if figures["ratio"] is not None and floor["floor"] is not None
            else None
        ),
        left_out=len(exchanges) - len(kept),
        by_kind=by_kind,
        check={
            "requests_off": sum(1 for m in mismatch if m > 1),
            "max_abs_diff": max(mismatch, default=0),
        },
        per_request=[
            {
                "kind": k,
                "ts": e.ts,
                "prompt_tokens": len(p),
                "cache_n": e.cache_n,
                "prompt_n": e.prompt_n,
                "new": n,
                "exact": x,
            }
            for k, p, e, n, x in zip(kinds, prompts, kept, new, exact, strict=True)
        ],
        total_prompt_ms=round(sum(float((e.timings or {}).get("prompt_ms") or 0) for e in kept), 1),
    )
    return figures


@dataclass
class TurnTiming:
    """One user turn read back from the conversation's display log (``GET /api/chat``):
    ``index`` (0-based, in the order sent), ``ttft_s`` (seconds from the user message's
    event to the first assistant delta with text or a tool call, both stamped by the chat
    service: lease waits, a turn-start compaction and the prefill included; None when the
    turn produced none), ``compactions`` (the compaction markers since the previous turn's
    first token, each ``{"trigger", "path"}``: a turn-end compaction of the previous turn or
    a start/reactive one of this turn before its first token), ``timings`` / ``usage`` of
    its last completion (its ``turn_end`` event)."""

    index: int
    user_ts: float
    first_ts: float | None = None
    compactions: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_ts is None else self.first_ts - self.user_ts

    @property
    def after_summary_s(self) -> float | None:
        """Seconds from the last compaction marker logged in this turn (a turn-start or
        reactive compaction: the summary was made while the user waited) to the first
        token; None when no compaction ran inside the turn."""
        inside = [
            float(c["ts"])
            for c in self.compactions
            if c.get("path") != "refused" and float(c.get("ts") or 0) >= self.user_ts
        ]
        if self.first_ts is None or not inside:
            return None
        return self.first_ts - max(inside)


def turn_timeline(events: Sequence[dict[str, Any]]) -> list[TurnTiming]:
    """The turns of a display log (the SSE ``data`` objects, in seq order: ``{"seq", "ts",
    "choices": [{"delta", ...}], "timings"?, "usage"?, "loki"?}``, see
    :class:`loki_shared.messages.chat.ChatEvent`). A ``compaction`` marker is the first
    turn's after it whose first token had not come yet when it was logged."""
    turns: list[TurnTiming] = []
    pending: list[dict[str, Any]] = []
    for ev in events:
        loki = ev.get("loki") or {}
        choices = ev.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        mark = loki.get("event")
        current = turns[-1] if turns else None
        if mark == "user":
            turns.append(TurnTiming(len(turns), float(ev["ts"]), compactions=pending))
            pending = []
        elif mark == "compaction":
            info = {"trigger": loki.get("trigger"), "path": loki.get("path"), "ts": ev["ts"]}
            if current is not None and current.first_ts is None:
                current.compactions.append(info)
            else:
                pending.append(info)
        elif mark == "turn_end":
            if current is not None:
                current.timings, current.usage = ev.get("timings"), ev.get("usage")
        elif not loki and current is not None and current.first_ts is None:
            if any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")):
                current.first_ts = float(ev["ts"])
    return turns


def ttft_after_compaction(
    turns: Sequence[TurnTiming], kinds: Sequence[str] | None = None
) -> dict[str, Any]:
    """Time to first token of the first turn after each compaction against the median of
    the session's ordinary turns: ``{"ordinary_median_s", "ordinary_n", "after": [{"turn",
    "ttft_s", "ratio", "triggers", "kind", "same_kind_median_s", "same_kind_ratio"}],
    "worst_ratio", "median_ratio", "worst_same_kind_ratio"}``. Ordinary turns: every turn
    with a first token but the session's first (a cold prompt) and those after a
    compaction; a compaction whose path is ``refused`` changed nothing and is not one.
    ``after_summary_s`` / ``after_summary_ratio``: for a compaction inside the turn (turn
    start), the part of its TTFT after the summary was made (a prewarm cannot cover the
    summary itself). ``kinds``: the scripted kind of each turn (``short``, ``long``,
    ``paste``, ``tool``; :func:`script_session`); the same-kind ratio divides by the median
    of the ordinary turns of the same kind — what the compaction added, without the prefill
    of the new message itself (a pasted block after a compaction is as slow as any pasted
    block). Ratios are None when there is no ordinary turn (of that kind)."""
    import statistics

    def kind_of(t: TurnTiming) -> str | None:
        return kinds[t.index] if kinds is not None and t.index < len(kinds) else None

    def compacted(t: TurnTiming) -> bool:
        return any(c.get("path") != "refused" for c in t.compactions)

    plain = [t for t in turns[1:] if t.ttft_s is not None and not compacted(t)]
    ordinary = [t.ttft_s for t in plain if t.ttft_s is not None]
    median = statistics.median(ordinary) if ordinary else None
    after = []
    for t in turns:
        if not compacted(t) or t.ttft_s is None:
            continue
        rest = t.after_summary_s
        kind = kind_of(t)
        same = [o.ttft_s for o in plain if o.ttft_s is not None and kind and kind_of(o) == kind]
        same_median = statistics.median(same) if same else None
        after.append(
            {
                "turn": t.index + 1,
                "ttft_s": round(t.ttft_s, 3),
                "ratio": t.ttft_s / median if median else None,
                "triggers": [c.get("trigger") for c in t.compactions],
                "after_summary_s": None if rest is None else round(rest, 3),
                "after_summary_ratio": rest / median if median and rest is not None else None,
                "kind": kind,
                "same_kind_n": len(same),
                "same_kind_median_s": None if same_median is None else round(same_median, 3),
                "same_kind_ratio": t.ttft_s / same_median if same_median else None,
            }
        )
    ratios = [a["ratio"] for a in after if a["ratio"] is not None]
    same_ratios = [a["same_kind_ratio"] for a in after if a["same_kind_ratio"] is not None]
    return {
        "ordinary_median_s": None if median is None else round(median, 3),
        "ordinary_n": len(ordinary),
        "after": after,
        "worst_ratio": max(ratios, default=None),
        "median_ratio": statistics.median(ratios) if ratios else None,
        "worst_same_kind_ratio": max(same_ratios, default=None),
    }


# =========================================================================== naive client
class NaiveClient:
    """A chat front-end as many are written: the whole history each turn, a clock line in
    the system prompt, the oldest exchanges dropped when the prompt passes 75% of the
    window (down to about half of it)."""

    def __init__(self, engine: str, ctx: int) -> None:
        import httpx

        self.engine = engine
        self.ctx = ctx
        self.http = httpx.Client(base_url=engine, timeout=900)
        self.history: list[dict[str, str]] = []
        self.last_prompt_tokens = 0
        self.truncations = 0

    def _system(self) -> dict[str, str]:
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        return {
            "role": "system",
            "content": f"You are a helpful assistant.\nCurrent date and time: {now} UTC.",
        }

    @staticmethod
    def _estimate(message: dict[str, str]) -> int:
        return len(message["content"]) // 3 + 4

    def turn(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        estimate = sum(self._estimate(m) for m in self.history) + 40
        if estimate > 0.75 * self.ctx:
            while len(self.history) > 1 and estimate > 0.5 * self.ctx:
                dropped = self.history.pop(0)
                estimate -= self._estimate(dropped)
                if self.history and self.history[0]["role"] == "assistant":
                    estimate -= self._estimate(self.history.pop(0))
            self.truncations += 1
        r = self.http.post(
            "/v1/chat/completions",
            json={
                "messages": [self._system(), *self.history],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.7,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        r.raise_for_status()
        content = ""
        for event in decode_all(r.content)[0]:
            for choice in (event.chunk or {}).get("choices") or []:
                content += (choice.get("delta") or {}).get("content") or ""
        self.history.append({"role": "assistant", "content": content})

    def side(self, kind: str, index: int) -> None:
        r = self.http.post(
            "/v1/chat/completions", json={"messages": side_messages(kind, index), "max_tokens": 12}
        )
        r.raise_for_status()

    def compact(self) -> None:
        """A naive client has no compaction of its own; it only truncates (above)."""


def run_naive(turns: Sequence[Turn], ctx: int, deadline: float = float("inf")) -> dict[str, Any]:
    """The session with :class:`NaiveClient` on a one-slot llama-server; stops early (the
    figures cover the turns done) when ``time.monotonic()`` passes ``deadline``."""
    with _common.llama(ctx=ctx) as engine:
        proxy = _common.RecordingProxy(engine.url).start()
        try:
            client = NaiveClient(proxy.url, ctx)
            start = time.monotonic()
            done = 0
            for i, turn in enumerate(turns):
                if time.monotonic() > deadline:
                    break
                done += 1
                client.turn(turn.text)
                for side in turn.side:
                    client.side(side, i)
                _progress("naive", done, len(turns), start)
            wall = time.monotonic() - start
            figures = analyse(engine.url, proxy.exchanges)
        finally:
            proxy.stop()
        figures.update(
            wall_s=round(wall, 1),
            compactions=client.truncations,
            summary_requests=0,
            turns_done=done,
            engine_argv=engine.argv[engine.argv.index("-c") :],
            engine=_common.engine_build(engine.url),
        )
        return figures


# =========================================================================== Loki
@dataclass
class LokiConfig:
    """One Loki configuration: the keys given to the services and the engine layout that
    the supervisor's launch rules give for them on this machine."""

    name: str
    keys: dict[str, str]
    side_slot: bool = False
    cache_ram_mib: int | None = None
    #: ``--cache-reuse`` chunk (tokens) the supervisor adds for COMPACT_TAIL_REUSE.
    cache_reuse: int | None = None


def prewarm_on(keys: dict[str, str]) -> bool:
    """Whether a configuration's stack runs PREWARM: its ``LOKI_PREWARM`` key, else the chat
    service's default (on)."""
    value = keys.get("LOKI_PREWARM")
    if value is None:
        from loki_chat.settings import Settings

        return bool(Settings.model_fields["prewarm"].default)
    return value.strip().lower() in ("1", "true", "on", "yes")


def loki_configs(quick: bool) -> list[LokiConfig]:
    """Configurations measured. CACHE_RAM: on a CPU-only machine the supervisor's auto value
    is llama-server's own default (it only ever raises it for an all-GPU model), so the
    configuration passes that value explicitly."""
    try:
        from loki_supervisor.cache_reuse import DEFAULT_CACHE_REUSE as chunk
        from loki_supervisor.plan import ENGINE_DEFAULT_CACHE_RAM_MIB as cram
    except ImportError:  # supervisor not installed: the documented defaults
        cram, chunk = 8192, 256
    best = {
        "LOKI_SIDE_SLOT": "on",
        "LOKI_CACHE_RAM": str(cram),
        "LOKI_COMPACT_CONTINUATION": "on",
        # the reference without PREWARM (on by default): what a compaction costs the user
        "LOKI_PREWARM": "false",
    }
    reuse = {**best, "LOKI_COMPACT_TAIL_REUSE": "true", "LOKI_PREWARM": "true"}
    every = [
        LokiConfig("loki-default", {}),
        LokiConfig("loki-side-slot", {"LOKI_SIDE_SLOT": "on"}, side_slot=True),
        LokiConfig("loki-cache-ram", {"LOKI_CACHE_RAM": str(cram)}, cache_ram_mib=cram),
        LokiConfig("loki-continuation", {"LOKI_COMPACT_CONTINUATION": "on"}),
        LokiConfig("loki-best", dict(best), side_slot=True, cache_ram_mib=cram),
        LokiConfig("loki-reuse", reuse, side_slot=True, cache_ram_mib=cram, cache_reuse=chunk),
    ]
    if quick:
        return [c for c in every if c.name in ("loki-best", "loki-reuse")]
    return every


#: The engine restart step's configuration: loki-reuse's keys and SLOT_PERSIST, the engine
#: launched by the supervisor (SLOT_PERSIST saves and restores only an engine it launched).
RESTART_CONFIG = LokiConfig(
    "loki-restart",
    {
        "LOKI_SIDE_SLOT": "on",
        "LOKI_COMPACT_CONTINUATION": "on",
        "LOKI_COMPACT_TAIL_REUSE": "true",
        "LOKI_PREWARM": "true",
        "LOKI_SLOT_PERSIST": "on",
    },
)

#: llama-server is killed after this many turns of the script (the 15th has no side work
#: after it, so slot 0 holds the conversation; ~2,000 tokens, before the first compaction),
#: and the turn after the restart is measured.
RESTART_AFTER = 15


class LokiClient:
    """Drives a running stack through the gateway's HTTP API like the web UI does."""

    def __init__(self, base: str, nats_url: str, nats_login: dict[str, Any] | None = None) -> None:
        import httpx

        self.http = httpx.Client(base_url=base, timeout=900)
        self.nats_url = nats_url
        #: ``nats.connect`` options logging in to the stack's NATS (user ``bench``).
        self.nats_login = dict(nats_login or {})
        self.conversation: str | None = None

    def wait_idle(self, timeout: float = 900.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.http.get("/api/chat/state", params={"conversation": self.conversation})
            if r.status_code == 200:
                state = r.json()
                if not state.get("generating") and not state.get("queued"):
                    return state
            time.sleep(0.3)
        raise _common.BenchError("turn did not end in time")

    def turn(self, text: str) -> dict[str, Any]:
        """Send one user message and wait for the turn to end; returns the state then."""
        body: dict[str, Any] = {"content": text}
        if self.conversation:
            body["conversation"] = self.conversation
        r = self.http.post("/api/chat/send", json=body)
        if r.status_code != 202:
            raise _common.BenchError(f"/api/chat/send: {r.status_code} {r.text[:300]}")
        self.conversation = r.json()["conversation"]
        time.sleep(0.2)
        return self.wait_idle()

    def display_log(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The conversation's whole display log (the SSE ``data`` objects of ``GET
        /api/chat`` from seq 1 to the state's ``last_seq``). The stack must run with
        ``LOKI_SSE_COALESCE_MIN`` above the log's length (:data:`NO_COALESCE`) so that no
        delta is merged and each keeps its own ``ts``.

        Raises:
            BenchError: the log did not reach ``last_seq`` in ``timeout`` s.
        """
        last = int(self.wait_idle().get("last_seq") or 0)
        events: list[dict[str, Any]] = []
        if last <= 0:
            return events
        params = {"conversation": self.conversation, "last_event_id": 0}
        deadline = time.monotonic() + timeout
        with self.http.stream("GET", "/api/chat", params=params, timeout=timeout) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:].strip())
                    events.append(event)
                    if int(event.get("seq") or 0) >= last:
                        return events
                if time.monotonic() > deadline:
                    break
        raise _common.BenchError(f"display log ended at {len(events)} events of {last}")

    def engine_info(self) -> dict[str, Any]:
        """``GET /api/engine`` (the supervisor's :class:`EngineInfo`); {} when unanswered."""
        try:
            r = self.http.get("/api/engine", timeout=10)
        except Exception:  # noqa: BLE001 - the engine is restarting: no answer yet
            return {}
        return r.json() if r.status_code == 200 else {}

    def compact(self) -> dict[str, Any]:
        r = self.http.post("/api/chat/compact", json={"conversation": self.conversation})
        if r.status_code >= 500:
            raise _common.BenchError(f"/api/chat/compact: {r.status_code} {r.text[:300]}")
        return self.wait_idle()

    def side(self, kind: str, index: int) -> None:
        if kind == "v1":
            r = self.http.post(
                "/v1/chat/completions",
                json={"model": "local", "messages": side_messages(kind, index), "max_tokens": 12},
            )
            if r.status_code != 200:
                raise _common.BenchError(f"/v1/chat/completions: {r.status_code} {r.text[:300]}")
        else:
            asyncio.run(self._bench_request(index))

    async def _bench_request(self, index: int) -> None:
        """A ``bench`` request as Loki's own bench tooling sends one: a lease of kind
        ``bench`` from the supervisor, the request on the slot it names, the release."""
        import nats

        from loki_shared.lease import LeaseError, lease
        from loki_shared.messages.engine import LeaseRequest

        nc = await nats.connect(self.nats_url, **self.nats_login)
        try:
            try:
                async with lease(nc, LeaseRequest(kind="bench", wait_s=600)) as held:
                    answer = await self._bench_completion(nc, held.lease, index)
                    usage = answer.get("usage") or {}
                    held.report(usage.get("prompt_tokens"), job_done=True)
            except LeaseError as exc:
                raise _common.BenchError(f"lease refused: {exc}") from exc
        finally:
            await nc.close()

    async def _bench_completion(self, nc: Any, lease: Any, index: int) -> dict[str, Any]:
        """The bench request on the leased slot; its perf record published."""
        import httpx

        body: dict[str, Any] = {"messages": side_messages("bench", index), "max_tokens": 12}
        if lease.id_slot is not None:
            body["id_slot"] = lease.id_slot
        headers = {"Authorization": f"Bearer {lease.api_key}"} if lease.api_key else {}
        async with httpx.AsyncClient(timeout=900) as http:
            r = await http.post(f"{lease.base_url}/v1/chat/completions", json=body, headers=headers)
        answer = r.json()
        # a bench request is measured like any other completion (perf issue)
        from loki_shared.perf_publish import build_record, publish_record

        await publish_record(
            nc,
            build_record(
                kind="bench",
                messages=body["messages"],
                final=answer,
                model=lease.model,
                slot=lease.id_slot,
            ),
        )
        return answer


def _perf_summary(client: LokiClient, wait_s: float = 10.0) -> dict[str, Any] | None:
    """Loki's own account of the session (``GET /api/perf/summary``: completions, Σ
    prompt_n, Σ cache_n), read once it has as many completions as a moment ago (records
    arrive through JetStream)."""
    deadline = time.monotonic() + wait_s
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            r = client.http.get("/api/perf/summary", timeout=10)
            doc = r.json() if r.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a cross-check only
            doc = None
        if doc and last and doc.get("completions") == last.get("completions"):
            break
        last = doc or last
        time.sleep(1.0)
    if not last:
        return None
    return {k: last.get(k) for k in ("completions", "prompt_n", "cache_n")}


def run_loki(
    turns: Sequence[Turn], ctx: int, config: LokiConfig, deadline: float = float("inf")
) -> dict[str, Any]:
    """The session through the whole stack (``LOKI_ENGINE_URL`` → the recording proxy →
    llama-server launched with the layout the supervisor gives ``config``); stops early (the
    figures cover the turns done) when ``time.monotonic()`` passes ``deadline``."""
    extra: list[str] = []
    n_ctx, parallel = ctx, 1
    if config.side_slot:
        n_ctx, parallel, extra = 2 * ctx, 2, ["--no-kv-unified"]
    if config.cache_ram_mib is not None:
        extra += ["--cache-ram", str(config.cache_ram_mib)]
    if config.cache_reuse is not None:
        extra += ["--cache-reuse", str(config.cache_reuse)]
    with _common.llama(ctx=n_ctx, parallel=parallel, extra=extra) as engine:
        proxy = _common.RecordingProxy(engine.url).start()
        try:
            env = {**stack_env(ctx, config), "LOKI_ENGINE_URL": proxy.url}
            with (
                tempfile.TemporaryDirectory(prefix="loki-bench-") as home,
                _common.stack(Path(home), env) as stack,
            ):
                client = stack_client(stack)
                start = time.monotonic()
                done, pauses = drive(client, turns, config.name, deadline)
                wall = time.monotonic() - start
                timeline = turn_timeline(client.display_log())
                perf = _perf_summary(client)
                paths = compaction_paths(timeline)
            figures = analyse(engine.url, proxy.exchanges)
        finally:
            proxy.stop()
        figures.update(
            wall_s=round(wall, 1),
            turns_done=done,
            perf_service=perf,
            compactions=sum(n for path, n in paths.items() if path != "refused"),
            compaction_paths=dict(paths),
            ttft=ttft_after_compaction(timeline, [t.kind for t in turns]),
            turn_ttft_s=[None if t.ttft_s is None else round(t.ttft_s, 3) for t in timeline],
            turn_user_ts=[t.user_ts for t in timeline],
            reading_pauses=pauses,
            summary_requests=figures["by_kind"].get("compact", {}).get("requests", 0),
            summary_retries=summary_retries(proxy.exchanges),
            engine_argv=engine.argv[engine.argv.index("-c") :],
            keys=config.keys,
            engine=_common.engine_build(engine.url),
        )
        return figures


#: ``LOKI_SSE_COALESCE_MIN`` for the bench's stacks: no replay of the display log is
#: coalesced, so every delta keeps its own ``ts`` (:meth:`LokiClient.display_log`).
NO_COALESCE = 1_000_000_000

#: Seconds the scripted user reads after a turn that ended with a compaction, before the
#: side work and the next message (what PREWARM uses; after other turns nothing runs in
#: the background, so the script goes on at once there).
READ_S = 3.0


def stack_client(stack: Any) -> LokiClient:
    """A bench client of ``stack`` (a running :func:`bench._common.stack`): its web port, and
    NATS as the ``bench`` user."""
    return LokiClient(
        f"http://127.0.0.1:{stack.config.web_port}", stack.nats_url, stack.nats_login("bench")
    )


def stack_env(ctx: int, config: LokiConfig) -> dict[str, str]:
    """The environment of a configuration's stack (keys, window, reply cap, sampling)."""
    return {
        "LOKI_CTX": str(ctx),
        "LOKI_MAX_TOKENS": str(MAX_TOKENS),
        "LOKI_TEMPERATURE": "0.7",
        "LOKI_SSE_COALESCE_MIN": str(NO_COALESCE),
        **config.keys,
    }


def drive(
    client: LokiClient, turns: Sequence[Turn], name: str, deadline: float = float("inf")
) -> tuple[int, int]:
    """Run ``turns`` through ``client`` (each turn, its compaction request, a reading pause
    of :data:`READ_S` when the context shrank — a compaction at turn end —, its side work)
    until ``time.monotonic()`` passes ``deadline``. Returns ``(turns done, reading
    pauses)``."""
    start = time.monotonic()
    done = pauses = 0
    used = 0
    for i, turn in enumerate(turns):
        if time.monotonic() > deadline:
            break
        done += 1
        state = client.turn(turn.text)
        if turn.compact:
            state = client.compact()
        now_used = int(state.get("ctx_used") or 0)
        if now_used < used:
            pauses += 1
            time.sleep(READ_S)
        used = now_used
        for side in turn.side:
            client.side(side, i)
        _progress(name, done, len(turns), start)
    return done, pauses


def _engine_pids(stack: Any) -> list[int]:
    """The llama-server processes under the stack's supervisor."""
    sup = stack.procs["engine-supervisor"].proc.pid
    out = []
    for pid in _common.process_tree(sup):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if pid != sup and b"llama-server" in argv0:
            out.append(pid)
    return out


def _wait_engine(client: LokiClient, ok: Any, what: str, timeout: float = 180.0) -> dict[str, Any]:
    """Poll ``GET /api/engine`` until ``ok(info)``.

    Raises:
        BenchError: not within ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = client.engine_info()
        if info and ok(info):
            return info
        time.sleep(0.25)
    raise _common.BenchError(f"{what}: not within {timeout:.0f} s (last info {info})")


def _no_dirs(text: str) -> str:
    """``text`` with the directories of absolute paths cut (a bench's temporary home)."""
    import re

    return re.sub(r"(?<!\S)/(?:[^\s/]+/)+", "", text)


def recomputed_share(timings: dict[str, Any] | None) -> float | None:
    """``prompt_n / (cache_n + prompt_n)`` of one completion's ``timings`` (None without)."""
    if not timings or not isinstance(timings.get("prompt_n"), int):
        return None
    total = int(timings.get("cache_n") or 0) + int(timings["prompt_n"])
    return timings["prompt_n"] / total if total else None


def run_restart(
    turns: Sequence[Turn], ctx: int, config: LokiConfig = RESTART_CONFIG
) -> dict[str, Any]:
    """The engine restart step: the first :data:`RESTART_AFTER` turns of the script through
    the whole stack with SLOT_PERSIST on and the engine launched by the supervisor; once the
    supervisor reports slot 0 saved after the last of them (``slot_persist.action == "save"``
    holding at least that turn's prompt), llama-server is killed (``SIGKILL``: a crash, no
    save at the stop), the supervisor relaunches it and restores the file before any lease;
    then the next turn of the script. Its share recomputed = ``prompt_n / (cache_n +
    prompt_n)`` of that turn's completion (its ``turn_end`` timings).

    Raises:
        BenchError: no save, no llama-server to kill, or no restore in time.
    """
    env = stack_env(ctx, config)
    with (
        tempfile.TemporaryDirectory(prefix="loki-bench-") as home,
        _common.stack(Path(home), env) as stack,
    ):
        client = stack_client(stack)
        start = time.monotonic()
        done, _ = drive(client, turns[:RESTART_AFTER], config.name)
        before = turn_timeline(client.display_log())[-1]
        prompt = int((before.usage or {}).get("prompt_tokens") or 0)
        saved = _wait_engine(
            client,
            lambda i: (
                (i.get("slot_persist") or {}).get("action") == "save"
                and int((i.get("slot_persist") or {}).get("n_saved") or 0) >= prompt
            ),
            "slot 0 saved after the turn",
            timeout=120,
        )
        restarts = int(saved.get("restarts") or 0)
        pids = _engine_pids(stack)
        if not pids:
            raise _common.BenchError("no llama-server under the supervisor")
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        restored = _wait_engine(
            client,
            lambda i: (
                i.get("state") == "ready"
                and int(i.get("restarts") or 0) > restarts
                and (i.get("slot_persist") or {}).get("action") == "restore"
            ),
            "engine relaunched and slot 0 restored",
        )
        ready_s = time.monotonic() - killed
        client.turn(turns[RESTART_AFTER].text)
        done += 1
        timeline = turn_timeline(client.display_log())
        after = timeline[-1]
        wall = time.monotonic() - start
        engine = dict(stack.engine_info() or {})
    share = recomputed_share(after.timings)
    return {
        "turns_done": done,
        "restart_after_turn": RESTART_AFTER,
        "prompt_tokens_before": prompt,
        "before": {"timings": before.timings, "share": recomputed_share(before.timings)},
        "after": {
            "timings": after.timings,
            "share": share,
            "ttft_s": None if after.ttft_s is None else round(after.ttft_s, 3),
        },
        "ordinary_ttft_median_s": ttft_after_compaction(timeline[:-1])["ordinary_median_s"],
        "saved": saved.get("slot_persist"),
        "restored": restored.get("slot_persist"),
        "ready_s": round(ready_s, 1),
        "wall_s": round(wall, 1),
        "keys": config.keys,
        "engine_argv": [Path(a).name if a.startswith("/") else a for a in engine.get("argv") or []],
        "engine_notes": [_no_dirs(n) for n in engine.get("notes") or []],
    }


def compaction_paths(turns: Sequence[TurnTiming]) -> dict[str, int]:
    """How many compactions of each ``path`` (``summary``, ``continuation``, ``fallback``,
    ``shrink``) the conversation's display log marks (a ``refused`` one leaves no marker)."""
    counts: dict[str, int] = {}
    for turn in turns:
        for mark in turn.compactions:
            path = str(mark.get("path"))
            counts[path] = counts.get(path, 0) + 1
    return counts


# =========================================================================== the bench
#: Time the bench gives itself (s); a configuration that would run past its share stops
#: early and reports the turns it did (the harness's TIMEOUT_S is a little longer).
#: ``LOKI_HEADLINE_BUDGET_S`` lowers it for one run.
BUDGET_S = {"quick": 480, "full": 5000}

#: Share of the time left each kind of run gets (a Loki configuration 1): the restart step
#: runs half a session; a naive turn costs about as much as two Loki turns, but the naive
#: client is last and gets the rest.
WEIGHTS = {"restart": 0.5, "naive": 1.0}


def budget_s(quick: bool) -> float:
    """:data:`BUDGET_S`, or ``LOKI_HEADLINE_BUDGET_S`` when set lower."""
    base = float(BUDGET_S["quick" if quick else "full"])
    raw = os.environ.get("LOKI_HEADLINE_BUDGET_S", "").strip()
    return min(base, float(raw)) if raw else base


def run(quick: bool) -> dict[str, Any]:
    """Run the session for each Loki configuration, the engine restart step and (full mode)
    the naive client; see the module docstring. Quick: 30 turns, loki-best and loki-reuse,
    the restart step (about 6 minutes on a quiet 2-core machine; the naive client, 7 minutes
    alone, only in full mode). Full: 40 turns, every configuration. CTX 4096 (half the
    bundled model's training window): the session fills it and compacts once or twice. Each
    run gets its share of the time left (:data:`WEIGHTS`); one that runs out reports the
    turns it did."""
    n_turns = 30 if quick else 40
    ctx = CTX
    turns = script_session(n_turns)
    budget_end = time.monotonic() + budget_s(quick)
    configs = loki_configs(quick)
    # the figures that matter first
    configs.sort(key=lambda c: {"loki-best": 0, "loki-reuse": 1}.get(c.name, 2))
    order: list[LokiConfig | str] = [*configs[:2], "restart", *configs[2:]]
    if not quick:
        order.append("naive")
    weights = [WEIGHTS.get(c, 1.0) if isinstance(c, str) else 1.0 for c in order]
    runs: dict[str, dict[str, Any]] = {}
    restart: dict[str, Any] | None = None
    errors: dict[str, str] = {}
    for index, config in enumerate(order):
        name = config if isinstance(config, str) else config.name
        share = weights[index] / sum(weights[index:])
        deadline = time.monotonic() + (budget_end - time.monotonic()) * share
        try:
            if config == "naive":
                runs[name] = run_naive(turns, ctx, deadline)
            elif config == "restart":
                restart = run_restart(turns, ctx)
            else:
                assert isinstance(config, LokiConfig)
                runs[name] = run_loki(turns, ctx, config, deadline)
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is reported
            errors[RESTART_CONFIG.name if name == "restart" else name] = (
                f"{type(exc).__name__}: {exc}"
            )
    runs = {k: runs[k] for k in sorted(runs, key=lambda k: (k != "naive", k))}

    rows = []
    for name, fig in runs.items():
        kinds = fig["by_kind"]
        rows.append(
            [
                name,
                fig["ratio"],
                fig.get("floor"),
                fig.get("above_floor"),
                fig["turns_done"],
                fig["prefilled"],
                fig["new"],
                fig.get("forced"),
                fig["extra"],
                fig["requests"],
                fig["compactions"],
                fig.get("summary_requests", 0),
                fig.get("summary_retries", 0),
                sum(kinds.get(k, {}).get("requests", 0) for k in ("v1", "bench")),
                fig["total_prompt_ms"] / 1000,
                fig["wall_s"],
            ]
        )
    for name, err in errors.items():
        rows.append([name, *([None] * 14), f"failed: {err[:160]}"])
    loki = {k: v["ratio"] for k, v in runs.items() if k.startswith("loki") and v["ratio"]}
    best_name = min(loki, key=loki.get) if loki else None
    targets = [
        _common.target(
            "recomputation ratio, Loki's best configuration"
            + (f" ({best_name})" if best_name else ""),
            loki.get(best_name) if best_name else None,
            "<=",
            1.05,
            issue="10",
        )
    ]
    if best_name:
        targets.append(
            _common.target(
                f"compactions in the session ({best_name})",
                runs[best_name]["compactions"],
                ">=",
                1,
                issue="10",
            )
        )
    reuse, best = runs.get("loki-reuse"), runs.get("loki-best")
    targets += [
        _common.target(
            "recomputation ratio, loki-reuse (tail reuse + prewarm)",
            reuse["ratio"] if reuse else None,
            "<=",
            1.05,
            issue="21",
        ),
        _common.target(
            "loki-best ratio − its exact-attention floor",
            best.get("above_floor") if best else None,
            "<=",
            0.03,
            issue="21",
        ),
        _common.target(
            "TTFT of the first turn after a compaction ÷ median of the ordinary turns of the "
            "same kind, with prewarm (loki-reuse, worst compaction)",
            (reuse.get("ttft") or {}).get("worst_same_kind_ratio") if reuse else None,
            "<=",
            1.5,
            "×",
            issue="21",
        ),
        _common.target(
            "engine restart: share of the next turn's prompt recomputed (SLOT_PERSIST)",
            (restart or {}).get("after", {}).get("share"),
            "<=",
            0.05,
            issue="21",
        ),
    ]
    if "loki-default" in runs:
        targets.append(
            _common.target(
                "summary requests in the session, the one retry of a looping answer apart "
                "(loki-default)",
                runs["loki-default"].get("summary_requests", 0)
                - runs["loki-default"].get("summary_retries", 0),
                "<=",
                3,
                issue="26",
            )
        )
    if "naive" in runs and best_name:
        targets.append(
            _common.target(
                "naive ratio / Loki's best ratio",
                runs["naive"]["ratio"] / loki[best_name],
                ">=",
                1.0,
            )
        )
    ttft_rows = []
    for name, fig in runs.items():
        ttft = fig.get("ttft")
        if not ttft:
            continue
        ttft_rows.append(
            [
                name,
                "on" if prewarm_on(fig.get("keys", {})) else "off",
                ttft["ordinary_median_s"],
                ttft["ordinary_n"],
                "; ".join(
                    f"turn {a['turn']} ({'/'.join(str(t) for t in a['triggers'])}"
                    + (f", {a['kind']}" if a.get("kind") else "")
                    + f"): {a['ttft_s']:.2f} s"
                    + (f" = {a['ratio']:.2f}×" if a["ratio"] is not None else "")
                    + (
                        f" (÷ {a['kind']} median {a['same_kind_median_s']:.2f} s: "
                        f"{a['same_kind_ratio']:.2f}×)"
                        if a.get("same_kind_ratio") is not None
                        else ""
                    )
                    + (
                        f", after the summary {a['after_summary_s']:.2f} s"
                        + (
                            f" = {a['after_summary_ratio']:.2f}×"
                            if a["after_summary_ratio"] is not None
                            else ""
                        )
                        if a["after_summary_s"] is not None
                        else ""
                    )
                    for a in ttft["after"]
                )
                or "no compaction",
                ttft["worst_ratio"],
                ttft.get("worst_same_kind_ratio"),
                fig.get("reading_pauses"),
            ]
        )
    restart_rows = []
    if restart:
        after, before = restart["after"], restart["before"]
        t_after = after.get("timings") or {}
        restart_rows.append(
            [
                RESTART_CONFIG.name,
                restart["restart_after_turn"],
                restart["prompt_tokens_before"],
                (restart.get("saved") or {}).get("n_saved"),
                (restart.get("restored") or {}).get("n_restored"),
                restart["ready_s"],
                t_after.get("cache_n"),
                t_after.get("prompt_n"),
                after.get("share"),
                before.get("share"),
                after.get("ttft_s"),
                restart.get("ordinary_ttft_median_s"),
            ]
        )
    breakdown = []
    for name, fig in runs.items():
        for kind, k in sorted(fig["by_kind"].items()):
            breakdown.append(
                [
                    name,
                    kind,
                    k["requests"],
                    k["prefilled"],
                    k["new"],
                    k.get("forced"),
                    k["prefilled"] / k["new"] if k["new"] else None,
                    (k["new"] + k.get("forced", 0)) / k["new"] if k["new"] else None,
                ]
            )
    check_rows = []
    for name, fig in runs.items():
        perf = fig.get("perf_service") or {}
        check_rows.append(
            [
                name,
                fig["check"]["requests_off"],
                fig["check"]["max_abs_diff"],
                fig["left_out"],
                perf.get("completions"),
                perf.get("prompt_n"),
                " ".join(fig["engine_argv"]),
            ]
        )
    short = [k for k, v in runs.items() if v["turns_done"] < n_turns]
    if short:
        targets.append(
            _common.target(
                "configurations that ran the whole session", len(runs) - len(short), ">=", len(runs)
            )
        )
    notes = (
        f"Session: {n_turns} scripted turns (short and long messages, pasted code, pasted "
        f"test output), side work between turns (a `/v1` client request and a `bench` "
        f"request), the compactions the window (CTX {ctx}) forces; every reply capped "
        f"at {MAX_TOKENS} tokens. "
        "ratio = Σ prompt_n the engine prefilled / Σ tokens new to it (1.0 is the "
        "physical limit); every request the engine served is counted, side work and "
        "summaries included. The exact floor is what an ideal exact-attention cache "
        "would still prefill with the configuration's own prompts. "
        + ("Quick mode: no naive client (7 minutes alone; full mode only). " if quick else "")
        + "Method: `docs/behaviour.md (bench)`."
    )
    return _common.result(
        "Headline: prompt recomputation ratio",
        tables=[
            _common.table(
                "Recomputation ratio by configuration",
                [
                    "configuration",
                    "ratio",
                    "exact floor",
                    "ratio − floor",
                    "turns",
                    "Σ prompt_n",
                    "Σ new",
                    "Σ forced",
                    "extra",
                    "requests",
                    "compactions",
                    "summary requests",
                    "retries",
                    "side jobs",
                    "prefill s",
                    "wall s",
                ],
                rows,
                notes="exact floor = (Σ new + Σ forced) / Σ new: forced are the tokens "
                "that are not new but that even an ideal exact-attention prompt cache (every "
                "earlier request kept, reuse only after an identical prefix) recomputes, "
                "mostly the tail and summary after each compaction; `--cache-reuse` (KV "
                "shifting) can go below it. turns: turns done of the scripted session (fewer "
                "when the time budget ran out: the figures cover those). compactions: "
                "compactions marked in the conversation's display log for Loki, truncations for "
                "the naive client; summary requests: the `compact` requests the engine "
                "served; retries: those that asked a looping or empty summary once more "
                "(`repeat_penalty`).",
            ),
            _common.table(
                "Time to first token after a compaction",
                [
                    "configuration",
                    "prewarm",
                    "ordinary turns: median TTFT s",
                    "ordinary turns",
                    "first turn after each compaction (trigger, kind): TTFT, ÷ median (÷ the "
                    "median of ordinary turns of its kind); for a turn-start compaction, the "
                    "part after the summary",
                    "worst ÷ median",
                    "worst ÷ same-kind median",
                    "reading pauses",
                ],
                ttft_rows,
                notes="TTFT: from the user message's event to the first assistant delta in "
                "the conversation's display log (both stamped by the chat service: lease "
                "waits, a turn-start compaction and the prefill included). Ordinary turns: "
                "all but the session's first and the first after each compaction. Kind: the "
                "scripted message (short question, long message, pasted code, pasted tool "
                "output); a turn's TTFT includes the prefill of its own new message, so the "
                "target divides by the ordinary turns of the same kind (what the compaction "
                "adds); ÷ median of all ordinary turns is shown beside it. After a "
                "turn that ended with a compaction the scripted user reads for "
                f"{READ_S:g} s (what PREWARM uses) before the side work and the next "
                "message.",
            ),
            _common.table(
                "Engine restart (SLOT_PERSIST)",
                [
                    "configuration",
                    "killed after turn",
                    "prompt tokens then",
                    "slot 0 saved (tokens)",
                    "restored (tokens)",
                    "kill → ready s",
                    "next turn cache_n",
                    "next turn prompt_n",
                    "share recomputed",
                    "share recomputed, turn before",
                    "next turn TTFT s",
                    "ordinary TTFT s (median)",
                ],
                restart_rows,
                notes="The engine launched by the supervisor with loki-reuse's keys and "
                "`LOKI_SLOT_PERSIST=on`; once slot 0 is saved after the turn (engine idle), "
                "llama-server is killed with SIGKILL; the supervisor relaunches it and "
                "restores the file before any lease. share recomputed = prompt_n / "
                "(cache_n + prompt_n) of the next turn's completion.",
            ),
            _common.table(
                "By request kind",
                [
                    "configuration",
                    "kind",
                    "requests",
                    "Σ prompt_n",
                    "Σ new",
                    "Σ forced",
                    "ratio",
                    "exact floor",
                ],
                breakdown,
            ),
            _common.table(
                "Rendering check",
                [
                    "configuration",
                    "requests off by >1 token",
                    "max |rendered − (cache_n+prompt_n)|",
                    "left out",
                    "perf service completions",
                    "perf service Σ prompt_n",
                    "engine layout",
                ],
                check_rows,
                notes="The rendered prompt (engine's `/apply-template` + "
                "`/tokenize`) against the engine's own count of the same "
                "request; Loki's own account (`GET /api/perf/summary`) "
                "against the requests the proxy saw.",
            ),
        ],
        targets=targets,
        data={
            "turns": n_turns,
            "ctx": ctx,
            "max_tokens": MAX_TOKENS,
            "runs": runs,
            "restart": restart,
            "read_s": READ_S,
            "errors": errors,
        },
        notes=notes,
        engine=next((r["engine"] for r in runs.values() if r.get("engine")), None),
    )
