"""The headline: how close Loki gets to recomputing nothing.

A scripted session (at least 30 turns: short and long user messages, pasted code, pasted
tool output, at least one compaction, side work between turns — a ``/v1`` client request and
a ``bench`` request) runs on the real llama-server with the bundled model, once per
configuration:

- ``naive``: a plain client straight to llama-server, with a clock line in the system prompt
  (as many chat front-ends do) and, when the window fills, the oldest exchanges dropped;
- ``loki-default``: the whole Loki stack with default keys;
- ``loki-side-slot``, ``loki-cache-ram``, ``loki-continuation``: one key on each;
- ``loki-best``: every key this machine allows (the seeds' keys);
- ``loki-reuse`` (full mode only): loki-best + COMPACT_TAIL_REUSE + PREWARM (issue 21; not
  yet measured).

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
``cache_n = N−1, prompt_n = 1``). The physical limit is 1.0. See ``docs/behaviour.md (bench)``.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import _common
from loki_shared.sse import decode_all

TIMEOUT_S = {"quick": 2700, "full": 5400}

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


def classify(ex: _common.Exchange) -> str:
    """What a recorded request was: ``v1`` / ``bench`` (tagged side jobs), ``compact`` (an
    untagged non-streamed request: the summariser's shape, every turn step is streamed),
    else ``main``."""
    text = json.dumps(ex.body.get("messages", [])[:1])
    if SIDE_V1_TAG in text:
        return "v1"
    if SIDE_BENCH_TAG in text:
        return "bench"
    if not ex.body.get("stream"):
        return "compact"  # the chat service streams every turn step; summaries are not
    return "main"


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
    new = new_tokens(
        [
            Request(kind, p, g, "main" if kind == "compact" else None)
            for kind, p, g in zip(kinds, prompts, gens, strict=True)
        ]
    )
    prefilled = [int(e.prompt_n or 0) for e in kept]
    by_kind: dict[str, dict[str, int]] = {}
    for kind, pre, nw in zip(after_compaction(kinds), prefilled, new, strict=True):
        slot = by_kind.setdefault(kind, {"requests": 0, "prefilled": 0, "new": 0})
        slot["requests"] += 1
        slot["prefilled"] += pre
        slot["new"] += nw
    mismatch = [
        abs(len(p) - (int(e.cache_n or 0) + int(e.prompt_n or 0)))
        for p, e in zip(prompts, kept, strict=True)
    ]
    figures = (
        recomputation(prefilled, new)
        if kept
        else {"prefilled": 0, "new": 0, "extra": 0, "ratio": None, "requests": 0}
    )
    figures.update(
        left_out=len(exchanges) - len(kept),
        by_kind=by_kind,
        check={
            "requests_off": sum(1 for m in mismatch if m > 1),
            "max_abs_diff": max(mismatch, default=0),
        },
        per_request=[
            {
                "kind": k,
                "prompt_tokens": len(p),
                "cache_n": e.cache_n,
                "prompt_n": e.prompt_n,
                "new": n,
            }
            for k, p, e, n in zip(kinds, prompts, kept, new, strict=True)
        ],
        total_prompt_ms=round(sum(float((e.timings or {}).get("prompt_ms") or 0) for e in kept), 1),
    )
    return figures


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


def loki_configs(quick: bool) -> list[LokiConfig]:
    """Configurations measured. CACHE_RAM: on a CPU-only machine the supervisor's auto value
    is llama-server's own default (it only ever raises it for an all-GPU model), so the
    configuration passes that value explicitly."""
    try:
        from loki_supervisor.plan import ENGINE_DEFAULT_CACHE_RAM_MIB as cram
    except ImportError:  # supervisor not installed: the documented engine default
        cram = 8192
    every = [
        LokiConfig("loki-default", {}),
        LokiConfig("loki-side-slot", {"LOKI_SIDE_SLOT": "on"}, side_slot=True),
        LokiConfig("loki-cache-ram", {"LOKI_CACHE_RAM": str(cram)}, cache_ram_mib=cram),
        LokiConfig("loki-continuation", {"LOKI_COMPACT_CONTINUATION": "on"}),
        LokiConfig(
            "loki-best",
            {
                "LOKI_SIDE_SLOT": "on",
                "LOKI_CACHE_RAM": str(cram),
                "LOKI_COMPACT_CONTINUATION": "on",
            },
            side_slot=True,
            cache_ram_mib=cram,
        ),
        LokiConfig(
            "loki-reuse",
            {
                "LOKI_SIDE_SLOT": "on",
                "LOKI_CACHE_RAM": str(cram),
                "LOKI_COMPACT_CONTINUATION": "on",
                "LOKI_COMPACT_TAIL_REUSE": "true",
                "LOKI_PREWARM": "true",
            },
            side_slot=True,
            cache_ram_mib=cram,
        ),
    ]
    if quick:
        return [c for c in every if c.name in ("loki-default", "loki-best")]
    return every


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

    def turn(self, text: str) -> None:
        body: dict[str, Any] = {"content": text}
        if self.conversation:
            body["conversation"] = self.conversation
        r = self.http.post("/api/chat/send", json=body)
        if r.status_code != 202:
            raise _common.BenchError(f"/api/chat/send: {r.status_code} {r.text[:300]}")
        self.conversation = r.json()["conversation"]
        time.sleep(0.2)
        self.wait_idle()

    def compact(self) -> None:
        r = self.http.post("/api/chat/compact", json={"conversation": self.conversation})
        if r.status_code >= 500:
            raise _common.BenchError(f"/api/chat/compact: {r.status_code} {r.text[:300]}")
        self.wait_idle()

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
    with _common.llama(ctx=n_ctx, parallel=parallel, extra=extra) as engine:
        proxy = _common.RecordingProxy(engine.url).start()
        try:
            env = {
                "LOKI_ENGINE_URL": proxy.url,
                "LOKI_CTX": str(ctx),
                "LOKI_MAX_TOKENS": str(MAX_TOKENS),
                "LOKI_TEMPERATURE": "0.7",
                **config.keys,
            }
            with (
                tempfile.TemporaryDirectory(prefix="loki-bench-") as home,
                _common.stack(Path(home), env) as stack,
            ):
                client = LokiClient(
                    f"http://127.0.0.1:{stack.config.web_port}",
                    stack.nats_url,
                    stack.nats_login("bench"),
                )
                start = time.monotonic()
                done = 0
                for i, turn in enumerate(turns):
                    if time.monotonic() > deadline:
                        break
                    done += 1
                    client.turn(turn.text)
                    if turn.compact:
                        client.compact()
                    for side in turn.side:
                        client.side(side, i)
                    _progress(config.name, done, len(turns), start)
                wall = time.monotonic() - start
                perf = _perf_summary(client)
                paths = asyncio.run(compaction_paths(stack.nats_url))
            figures = analyse(engine.url, proxy.exchanges)
        finally:
            proxy.stop()
        figures.update(
            wall_s=round(wall, 1),
            turns_done=done,
            perf_service=perf,
            compactions=sum(n for path, n in paths.items() if path != "refused"),
            compaction_paths=dict(paths),
            summary_requests=figures["by_kind"].get("compact", {}).get("requests", 0),
            engine_argv=engine.argv[engine.argv.index("-c") :],
            keys=config.keys,
            engine=_common.engine_build(engine.url),
        )
        return figures


async def compaction_paths(nats_url: str) -> dict[str, int]:
    """How many compaction events of each ``path`` (``summary``, ``continuation``,
    ``fallback``, ``shrink``, ``refused``) the stack stored in its ``LOKI_EVENTS`` stream
    (``loki.events.compaction``); empty when the stream is missing."""
    import nats

    from loki_shared import subjects
    from loki_shared.messages.events import CompactionEvent

    counts: dict[str, int] = {}
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(subjects.STREAM_EVENTS)
        except Exception:  # noqa: BLE001 - no compaction ever published: no stream
            return counts
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(subjects.STREAM_EVENTS, seq)
            except Exception:  # noqa: BLE001 - a deleted sequence
                continue
            if msg.subject != subjects.EVENTS_COMPACTION:
                continue
            path = CompactionEvent.model_validate_json(msg.data).path
            counts[path] = counts.get(path, 0) + 1
    finally:
        await nc.close()
    return counts


# =========================================================================== the bench
#: Time the bench gives itself (s); a configuration that would run past its share stops
#: early and reports the turns it did (the harness's TIMEOUT_S is a little longer).
BUDGET_S = {"quick": 2400, "full": 5000}


def run(quick: bool) -> dict[str, Any]:
    """Run the session for each Loki configuration and the naive client; see the module
    docstring. Quick: 30 turns, loki-best, loki-default, naive. Full: 40 turns, every
    configuration. CTX 4096 (half the bundled model's training window): the session fills it
    and compacts once or twice. Each configuration gets an equal share of the time left (the
    naive client half of one); one that runs out reports the turns it did."""
    n_turns = 30 if quick else 40
    ctx = CTX
    turns = script_session(n_turns)
    budget_end = time.monotonic() + BUDGET_S["quick" if quick else "full"]
    configs = loki_configs(quick)
    configs.sort(key=lambda c: c.name != "loki-best")  # the figure that matters first
    order: list[LokiConfig | None] = [*configs, None]  # None: the naive client
    runs: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    # a Loki turn costs about twice a naive one on this model (the stack's own steps and the
    # summaries it generates): the naive client gets half a Loki configuration's share
    weights = [1.0 if config else 0.5 for config in order]
    for index, config in enumerate(order):
        name = config.name if config else "naive"
        share = weights[index] / sum(weights[index:])
        deadline = time.monotonic() + (budget_end - time.monotonic()) * share
        try:
            if config is None:
                runs[name] = run_naive(turns, ctx, deadline)
            else:
                runs[name] = run_loki(turns, ctx, config, deadline)
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is reported
            errors[name] = f"{type(exc).__name__}: {exc}"
    runs = {k: runs[k] for k in sorted(runs, key=lambda k: (k != "naive", k))}

    rows = []
    for name, fig in runs.items():
        kinds = fig["by_kind"]
        rows.append(
            [
                name,
                fig["ratio"],
                fig["turns_done"],
                fig["prefilled"],
                fig["new"],
                fig["extra"],
                fig["requests"],
                fig["compactions"],
                fig.get("summary_requests", 0),
                sum(kinds.get(k, {}).get("requests", 0) for k in ("v1", "bench")),
                fig["total_prompt_ms"] / 1000,
                fig["wall_s"],
            ]
        )
    for name, err in errors.items():
        rows.append([name, *([None] * 10), f"failed: {err[:160]}"])
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
    if "loki-default" in runs:
        targets.append(
            _common.target(
                "summary requests in the session (loki-default)",
                runs["loki-default"].get("summary_requests"),
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
                    k["prefilled"] / k["new"] if k["new"] else None,
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
        "summaries included. Method: `docs/behaviour.md (bench)`."
    )
    return _common.result(
        "Headline: prompt recomputation ratio",
        tables=[
            _common.table(
                "Recomputation ratio by configuration",
                [
                    "configuration",
                    "ratio",
                    "turns",
                    "Σ prompt_n",
                    "Σ new",
                    "extra",
                    "requests",
                    "compactions",
                    "summary requests",
                    "side jobs",
                    "prefill s",
                    "wall s",
                ],
                rows,
                notes="turns: turns done of the scripted session (fewer when the "
                "time budget ran out: the figures cover those). compactions: "
                "compaction events for Loki (any path but `refused`), truncations for "
                "the naive client; summary requests: the `compact` requests the engine "
                "served.",
            ),
            _common.table(
                "By request kind",
                ["configuration", "kind", "requests", "Σ prompt_n", "Σ new", "ratio"],
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
            "errors": errors,
        },
        notes=notes,
        engine=next((r["engine"] for r in runs.values() if r.get("engine")), None),
    )
