"""What COMPACT_TAIL_REUSE costs in quality (issue 21 §1), on the real engine, bundled model.

``python -m bench --only tail_reuse_quality [--quick]``.

Conversations: the benchmarks' scripted session (:func:`bench.headline_bench.script_session`,
40 turns: short questions, long messages, pasted code, pasted test output); each assistant
reply is the engine's own greedy answer to its user turn alone (:data:`REPLY_TOKENS` tokens).
Conversation *k* is the session just before turn *e* (the last :data:`CONVERSATIONS` turns,
:data:`QUICK_CONVERSATIONS` in quick mode): the turns before it, back to about
:data:`TARGET_TOKENS` tokens, compacted the way the chat service does it — the cut of
:func:`loki_chat.compaction.decide.plan_cut` (about the last 20% verbatim, from an assistant
message), the summary message of :func:`~loki_chat.compaction.decide.summary_message` (an
extractive summary of the torso stands in for the model's), ``sent_after`` as the policy
marks it, and turn *e* as the next user message. Three prompts are rendered by the engine
(``/apply-template`` + ``/tokenize``) from :func:`loki_chat.request.wire_messages`:

- ``summary_first``: the seeds' layout (key off): system, summary, tail, new message;
- ``tail_first``: :func:`loki_chat.compaction.layout.laid_out` (key on): system, tail, the
  summary under its tail-first header joined to the new message;
- ``full``: the conversation before the compaction (what the slot held).

Each conversation, on one llama-server with ``--cache-reuse 256`` (the supervisor's default
with the key on) and ``--cache-ram 0`` (no host prompt cache: only the slot's KV counts):

1. ``summary_first`` from scratch (``cache_prompt: false``), a :data:`TOKENS`-token greedy
   continuation (``ignore_eos``, ``n_probs`` :data:`N_PROBS`: llama-server b11434 returns
   ``completion_probabilities`` on ``/completion``; each step carries the chosen token's
   ``logprob`` — pre-sampling, the model's own distribution — and ``top_logprobs``);
2. ``tail_first`` from scratch, the same;
3. ``full`` from scratch (1 token): the slot now holds the conversation as before the
   compaction;
4. ``tail_first`` with the cache: llama-server keeps the system prompt and shifts the tail's
   KV to its new place (``timings.cache_n`` says how much was reused), computes the rest;
5. control: the first ``cache_n`` tokens of ``tail_first`` from scratch, then ``tail_first``
   with the cache — the same split between cached and computed tokens as 4, no shift.

Comparisons, each against a reference continuation, teacher-forced: at every one of the
:data:`TOKENS` positions the candidate's next-token distribution is read on the reference's
own prefix (from the candidate's greedy run up to its first different token, then one
single-token request per position on the reference's tokens, from the candidate's cache), so
every position counts, not only those before a divergence:

- (a) KV shift: candidate 4 (shifted) vs reference 2 (the same bytes recomputed);
- (b) layout: candidate 2 (tail first) vs reference 1 (summary first), both recomputed;
- (c) control: candidate 5 vs reference 2 — what remains without the shift (a cached prefix
  and a computed rest are not bit-identical to one prefill: other batch shapes), the floor
  (a) is read against.

``top1_agreement``: share of positions where the reference's token is the candidate's most
likely (a tie of logprobs counts as agreement); ``mean_abs_dlogprob``: mean over positions of |log p_candidate(t) − log
p_reference(t)| for the reference's token t (natural log; a token outside the candidate's
top :data:`N_PROBS` counts at the candidate's last listed logprob, a lower bound, and is
counted in ``outside_top``); ``identical``: conversations whose free-running greedy
continuations are the same 32 tokens; ``first_divergence``: median position of the first
different token (32 = none).

Status (2026-12-01, full mode, 20 conversations, llama-server b11434, 911 s on 2 cores): (a)
KV shift: top-1 agreement 0.952, mean |Δ logprob| 0.107; (c) control: 0.994, 0.007; (b)
layout: 0.897, 0.275 — the section ``tail_reuse_quality`` of BENCHMARKS.md; what they mean
for a user: docs/behaviour.md (``COMPACT_TAIL_REUSE``).

A first version (before this harness module) asked ``/v1/chat/completions`` for ``logprobs``
and read no ``choices[0].logprobs.content``. Probed again on b11434 (2026-12-01), this build
returns them on both endpoints: ``logprobs: true`` (+ ``top_logprobs``, which becomes
``n_probs``) on ``/v1/chat/completions`` as ``choices[0].logprobs.content``, and ``n_probs`` on
``/completion`` as ``completion_probabilities`` (pre-sampling, ``logprob`` per step, the
chosen token and ``top_logprobs``). This module uses ``/completion`` on token ids, so a prompt
is the same token sequence in every condition and a teacher-forced position costs one token.

Raises (from :func:`run`): ``loki_shared.servers.ServerNotFound`` without llama-server or the
bundled model; :class:`bench._common.BenchError` when the engine returns no probabilities.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench import _common, headline_bench

TIMEOUT_S = {"quick": 900, "full": 3000}
#: Greedy continuation length compared (tokens).
TOKENS = 32
#: Probabilities returned per position (``n_probs``).
N_PROBS = 20
#: Compacted conversations measured, full / quick mode.
CONVERSATIONS = 20
QUICK_CONVERSATIONS = 4
#: Turns of the scripted session (the headline's full session).
SESSION_TURNS = 40
#: Size of a conversation before its compaction (tokens, engine's count of its messages): the
#: real-engine test's ~2,400 (tail ≈ 480 tokens, above ``--cache-reuse 256``).
TARGET_TOKENS = 2400
#: Tokens of each generated assistant reply (the headline's cap).
REPLY_TOKENS = headline_bench.MAX_TOKENS
CACHE_REUSE = 256
CTX = 4096


# --------------------------------------------------------------------------- engine calls
@dataclass
class Step:
    """One generated position: the chosen (greedy) token ``id`` and its ``logprob``, and the
    ``top`` ``{token id: logprob}`` of the position (at most :data:`N_PROBS`)."""

    id: int
    logprob: float
    top: dict[int, float]


@dataclass
class Run:
    """A continuation: its steps and the request's ``timings``."""

    steps: list[Step]
    timings: dict[str, Any]

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self.steps]


def complete(http: httpx.Client, prompt: list[int], n: int, cache: bool) -> Run:
    """``POST /completion`` on token ids: greedy, ``n`` tokens, ``n_probs``; ``cache`` False
    recomputes the whole prompt (llama-server sets n_past 0, no chunk reuse either).

    Raises:
        httpx.HTTPStatusError: the engine refused the request.
        bench._common.BenchError: a step without ``completion_probabilities``.
    """
    r = http.post(
        "/completion",
        json={
            "prompt": prompt,
            "n_predict": n,
            "temperature": 0,
            "n_probs": N_PROBS,
            "cache_prompt": cache,
            "ignore_eos": True,
        },
    )
    r.raise_for_status()
    data = r.json()
    probs = data.get("completion_probabilities") or []
    if len(probs) != n:
        raise _common.BenchError(
            f"asked {n} tokens with n_probs, got {len(probs)} completion_probabilities"
        )
    steps = [
        Step(
            int(p["id"]),
            float(p["logprob"]),
            {int(t["id"]): float(t["logprob"]) for t in p.get("top_logprobs") or []},
        )
        for p in probs
    ]
    return Run(steps, data.get("timings") or {})


def render(http: httpx.Client, wire: list[dict[str, Any]]) -> list[int]:
    """The token ids of a chat request as llama-server builds its prompt (``/apply-template``
    with the generation prompt, then ``/tokenize`` with special tokens parsed)."""
    r = http.post("/apply-template", json={"messages": wire})
    r.raise_for_status()
    r = http.post(
        "/tokenize",
        json={"content": r.json()["prompt"], "add_special": True, "parse_special": True},
    )
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def count(http: httpx.Client, text: str) -> int:
    """Tokens of ``text`` alone (``/tokenize``)."""
    r = http.post("/tokenize", json={"content": text, "add_special": False})
    r.raise_for_status()
    return len(r.json()["tokens"])


# --------------------------------------------------------------------------- conversations
def reply(http: httpx.Client, system: str, text: str) -> str:
    """The engine's greedy answer to one user turn alone (:data:`REPLY_TOKENS` tokens)."""
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
            "max_tokens": REPLY_TOKENS,
            "temperature": 0,
        },
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"] or "…")


def summary_text(torso: list[Any]) -> str:
    """A stand-in for the model's summary, deterministic: the first words of each user turn
    of the torso."""
    asks = []
    for m in torso:
        if m.role == "user" and isinstance(m.content, str):
            words = m.content.replace("\n", " ").split()
            asks.append(" ".join(words[:10]))
    return (
        "Goals: the user reviews code and test output, one topic at a time. Asked so far: "
        + "; ".join(asks)
        + ". Decisions: none recorded. State: each question was answered briefly."
    )


@dataclass
class Prompts:
    """One compacted conversation rendered three ways, and its sizes."""

    turn: int
    full: list[int]
    summary_first: list[int]
    tail_first: list[int]
    tail_messages: int


def compacted(
    http: httpx.Client, system: str, turns: list[Any], replies: dict[int, str], end: int
) -> Prompts:
    """The session before turn ``end`` (back to about :data:`TARGET_TOKENS` tokens),
    compacted as the chat service does it, rendered three ways (see the module docstring).
    ``replies``: the assistant replies by turn, filled here as needed (:func:`reply`).

    Raises:
        bench._common.BenchError: the conversation has nothing to compact.
    """
    from loki_chat.compaction import layout
    from loki_chat.compaction.decide import continued, plan_cut, summary_message
    from loki_chat.request import wire_messages
    from loki_shared.messages.chat import ChatMessage

    start, size = end, 0
    while start > 0 and size < TARGET_TOKENS:
        start -= 1
        if start not in replies:
            replies[start] = reply(http, system, turns[start].text)
        size += count(http, turns[start].text) + count(http, replies[start]) + 10
    messages: list[ChatMessage] = []
    for i in range(start, end):
        messages += [
            ChatMessage(role="user", content=turns[i].text),
            ChatMessage(role="assistant", content=replies[i]),
        ]
    cut = plan_cut(messages)
    if cut is None:
        raise _common.BenchError(f"nothing to compact before turn {end}")
    summary = summary_message(cut, summary_text(cut.torso))
    new = ChatMessage(role="user", content=turns[end].text)
    seeds = [summary, *cut.tail, new]
    marked = summary.model_copy(deep=True)
    if marked.loki is None:
        raise _common.BenchError("the summary message carries no loki mark")
    marked.loki.sent_after = len(continued(cut.tail))  # as the policy marks it, key on
    keyed = [marked, *cut.tail, new]
    return Prompts(
        end,
        render(http, wire_messages(system, messages)),
        render(http, wire_messages(system, layout.laid_out(seeds, False))),
        render(http, wire_messages(system, layout.laid_out(keyed, True))),
        len(cut.tail),
    )


# --------------------------------------------------------------------------- comparing
def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first different token of two continuations (their length when none)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def forced(http: httpx.Client, prompt: list[int], reference: Run, own: Run) -> list[Step]:
    """The candidate's steps on the reference's prefix at every position: its own greedy
    steps up to and including the first different token (same context so far), then one
    request per later position on ``prompt`` + the reference's tokens before it, from the
    candidate's cache (the slot holds ``prompt`` as the candidate computed it)."""
    d = first_divergence(reference.ids, own.ids)
    steps = own.steps[: d + 1]
    for i in range(d + 1, len(reference.steps)):
        steps.append(complete(http, prompt + reference.ids[:i], 1, cache=True).steps[0])
    return steps


def compare(reference: Run, candidate: list[Step]) -> dict[str, Any]:
    """Per-position agreement and |Δ logprob| of the reference's token (module docstring)."""
    agree, deltas, outside = 0, [], 0
    for ref, cand in zip(reference.steps, candidate, strict=True):
        lp = cand.top.get(ref.id)
        # the reference's token is (one of) the candidate's most likely: ties count as agreement
        agree += lp is not None and lp >= max(cand.top.values())
        if lp is None:
            outside += 1
            lp = min(cand.top.values(), default=cand.logprob)
        deltas.append(abs(lp - ref.logprob))
    n = len(reference.steps)
    return {
        "positions": n,
        "top1_agreement": agree / n,
        "mean_abs_dlogprob": sum(deltas) / n,
        "max_abs_dlogprob": max(deltas),
        "outside_top": outside,
    }


def measure(http: httpx.Client, p: Prompts) -> dict[str, Any]:
    """The four requests and the two comparisons of one conversation."""
    seeds = complete(http, p.summary_first, TOKENS, cache=False)
    scratch = complete(http, p.tail_first, TOKENS, cache=False)
    layout_steps = forced(http, p.tail_first, seeds, scratch)
    complete(http, p.full, 1, cache=False)  # the slot as it was before the compaction
    shifted = complete(http, p.tail_first, TOKENS, cache=True)
    shift_steps = forced(http, p.tail_first, scratch, shifted)
    # control: the same split (the reused part cached, the rest computed) without a shift
    reused = int(shifted.timings.get("cache_n") or 0)
    complete(http, p.tail_first[:reused], 1, cache=False)
    unshifted = complete(http, p.tail_first, TOKENS, cache=True)
    control_steps = forced(http, p.tail_first, scratch, unshifted)
    return {
        "turn": p.turn,
        "full_tokens": len(p.full),
        "tail_first_tokens": len(p.tail_first),
        "summary_first_tokens": len(p.summary_first),
        "tail_messages": p.tail_messages,
        "shifted_cache_n": shifted.timings.get("cache_n"),
        "shifted_prompt_n": shifted.timings.get("prompt_n"),
        "scratch_prompt_n": scratch.timings.get("prompt_n"),
        "shift": {
            **compare(scratch, shift_steps),
            "first_divergence": first_divergence(scratch.ids, shifted.ids),
        },
        "layout": {
            **compare(seeds, layout_steps),
            "first_divergence": first_divergence(seeds.ids, scratch.ids),
        },
        "control_cache_n": unshifted.timings.get("cache_n"),
        "control": {
            **compare(scratch, control_steps),
            "first_divergence": first_divergence(scratch.ids, unshifted.ids),
        },
    }


def summarise(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """One comparison over the conversations: means weighted by positions, identical
    continuations, median first divergence, worst position."""
    parts = [r[key] for r in rows]
    n = sum(p["positions"] for p in parts)
    return {
        "conversations": len(parts),
        "positions": n,
        "top1_agreement": sum(p["top1_agreement"] * p["positions"] for p in parts) / n,
        "mean_abs_dlogprob": sum(p["mean_abs_dlogprob"] * p["positions"] for p in parts) / n,
        "max_abs_dlogprob": max(p["max_abs_dlogprob"] for p in parts),
        "outside_top": sum(p["outside_top"] for p in parts),
        "identical": sum(1 for p in parts if p["first_divergence"] >= TOKENS),
        "first_divergence_median": statistics.median(p["first_divergence"] for p in parts),
    }


def meaning(shift: dict[str, Any], lay: dict[str, Any], control: dict[str, Any]) -> str:
    """The plain sentences for a user who turns the key on, written from the figures: whether
    the shift adds anything over the control (within 2 points of agreement and 0.02 of mean
    |Δ logprob|: nothing measurable), then what the layout changes."""
    close = (
        shift["top1_agreement"] >= control["top1_agreement"] - 0.02
        and shift["mean_abs_dlogprob"] <= control["mean_abs_dlogprob"] + 0.02
    )
    if close:
        shift_text = (
            "the KV shift itself adds nothing measurable: the shifted prompt picks the "
            f"recomputed prompt's next token at {shift['top1_agreement']:.1%} of positions, "
            f"as a cached prompt without a shift does ({control['top1_agreement']:.1%})"
        )
    else:
        shift_text = (
            "the KV shift itself moves the model's next-token distribution: the shifted "
            f"prompt picks the recomputed prompt's next token at {shift['top1_agreement']:.1%} "
            f"of positions (mean |Δ logprob| {shift['mean_abs_dlogprob']:.3f}), where a cached "
            f"prompt without a shift does at {control['top1_agreement']:.1%} "
            f"({control['mean_abs_dlogprob']:.3f})"
        )
    return (
        "What this means for a user who turns `LOKI_COMPACT_TAIL_REUSE` on: "
        + shift_text
        + "; and the new order (the summary after the tail) changes the first reply after a "
        "compaction: it follows the key-off reply's next token at "
        f"{lay['top1_agreement']:.1%} of positions (mean |Δ logprob| "
        f"{lay['mean_abs_dlogprob']:.3f}), and {lay['identical']} of {lay['conversations']} "
        f"replies start with the same {TOKENS} tokens. So with the key on, replies after a "
        "compaction are worded differently from the key-off ones, and the model reads a "
        "prompt order it was not trained on; whether that makes them worse is not what this "
        "measures (it measures difference, on the bundled 135M model; a larger model may "
        "differ less or more)."
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Measure :data:`CONVERSATIONS` (quick: :data:`QUICK_CONVERSATIONS`) conversations on one
    engine (harness entry point)."""
    from loki_chat.settings import Settings

    system = str(Settings.model_fields["system_prompt"].default)
    n = QUICK_CONVERSATIONS if quick else CONVERSATIONS
    turns = headline_bench.script_session(SESSION_TURNS)
    ends = list(range(SESSION_TURNS - n, SESSION_TURNS))
    t0 = time.monotonic()
    extra = ["--cache-reuse", str(CACHE_REUSE), "--cache-ram", "0"]
    with _common.llama(ctx=CTX, parallel=1, extra=extra) as engine:
        build = _common.engine_build(engine.url)
        with httpx.Client(base_url=engine.url, timeout=600) as http:
            replies: dict[int, str] = {}
            rows = []
            for end in ends:
                prompts = compacted(http, system, turns, replies, end)
                rows.append(measure(http, prompts))
                print(
                    f"[tail_reuse_quality] turn {end}: {len(rows)}/{n} "
                    f"({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
    shift, lay = summarise(rows, "shift"), summarise(rows, "layout")
    control = summarise(rows, "control")
    shifted = [r for r in rows if (r["shifted_cache_n"] or 0) >= CACHE_REUSE]
    figures = [
        [
            "(a) KV shift: tail first shifted vs the same bytes recomputed",
            shift["conversations"],
            shift["positions"],
            shift["top1_agreement"],
            shift["mean_abs_dlogprob"],
            shift["max_abs_dlogprob"],
            shift["outside_top"],
            shift["identical"],
            shift["first_divergence_median"],
        ],
        [
            "(c) control: same cached/computed split, no shift, vs recomputed",
            control["conversations"],
            control["positions"],
            control["top1_agreement"],
            control["mean_abs_dlogprob"],
            control["max_abs_dlogprob"],
            control["outside_top"],
            control["identical"],
            control["first_divergence_median"],
        ],
        [
            "(b) layout: tail first vs summary first, both recomputed",
            lay["conversations"],
            lay["positions"],
            lay["top1_agreement"],
            lay["mean_abs_dlogprob"],
            lay["max_abs_dlogprob"],
            lay["outside_top"],
            lay["identical"],
            lay["first_divergence_median"],
        ],
    ]
    per_conv = [
        [
            r["turn"],
            r["full_tokens"],
            r["tail_first_tokens"],
            r["shifted_cache_n"],
            r["shifted_prompt_n"],
            r["scratch_prompt_n"],
            r["shift"]["top1_agreement"],
            r["shift"]["mean_abs_dlogprob"],
            r["control"]["top1_agreement"],
            r["control"]["mean_abs_dlogprob"],
            r["layout"]["top1_agreement"],
            r["layout"]["mean_abs_dlogprob"],
            r["layout"]["first_divergence"],
        ]
        for r in rows
    ]
    notes = (
        f"{n} compacted conversations of the scripted session (the session before each of "
        f"its last {n} turns, about {TARGET_TOKENS} tokens, compacted by the chat service's "
        "own cut, summary message and layout functions), one llama-server "
        f"(`--cache-reuse {CACHE_REUSE} --cache-ram 0`, n_ctx {CTX}); a {TOKENS}-token "
        "greedy continuation per prompt, every position teacher-forced on the reference's "
        "tokens; log-probabilities from `/completion`'s `completion_probabilities` "
        f"(`n_probs` {N_PROBS}). The shift happened (cache_n ≥ {CACHE_REUSE}) in "
        f"{len(shifted)} of {n} conversations. Method: the module docstring of "
        "`bench/tail_reuse_quality_bench.py`.\n\n" + meaning(shift, lay, control)
    )
    return _common.result(
        "COMPACT_TAIL_REUSE: what the tail-first layout and the KV shift cost in quality",
        tables=[
            _common.table(
                "Next-token agreement over a 32-token greedy continuation",
                [
                    "comparison",
                    "conversations",
                    "positions",
                    "top-1 agreement",
                    "mean |Δ logprob|",
                    "max |Δ logprob|",
                    "outside top-20",
                    "identical continuations",
                    "first divergence (median)",
                ],
                figures,
                notes="top-1 agreement: share of positions where the candidate's most likely "
                "token is the reference's, on the reference's own prefix. |Δ logprob|: natural "
                "log of the reference's token, candidate minus reference. identical: free-"
                f"running greedy continuations equal over all {TOKENS} tokens; first "
                f"divergence: position of the first different token ({TOKENS} = none).",
            ),
            _common.table(
                "Per conversation",
                [
                    "before turn",
                    "full tokens",
                    "tail-first tokens",
                    "shifted cache_n",
                    "shifted prompt_n",
                    "recomputed prompt_n",
                    "(a) agreement",
                    "(a) mean |Δ|",
                    "(c) agreement",
                    "(c) mean |Δ|",
                    "(b) agreement",
                    "(b) mean |Δ|",
                    "(b) first divergence",
                ],
                per_conv,
            ),
        ],
        data={
            "shift": shift,
            "layout": lay,
            "control": control,
            "rows": rows,
            "tokens": TOKENS,
            "n_probs": N_PROBS,
            "cache_reuse": CACHE_REUSE,
            "target_tokens": TARGET_TOKENS,
            "duration_s": round(time.monotonic() - t0, 1),
        },
        notes=notes,
        engine=build,
    )
