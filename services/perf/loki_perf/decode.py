"""Tolerant decoding of one perf record (the JSON published on ``loki.perf.record``).

This is deliberately separate from the chat's own parsing of the stream: a counter of the
wrong type must never cost the record, so the raw JSON is read field by field rather than
validated as one :class:`loki_shared.messages.perf.PerfRecord`.

Rules (each is tested in ``tests/perf/test_decode.py``):

- *Unknown is not 0*: a figure the engine did not send stays ``None``; sums skip it.
- A field of the wrong type (a string where a count is expected, a bool, a negative count,
  NaN) is dropped alone and its name is listed in :attr:`Entry.dropped`; the rest of the
  record is kept.
- llama.cpp's final chunk carries ``timings`` (``cache_n``, ``prompt_n``, ``predicted_n``,
  ``draft_n``, ``draft_n_accepted``, ``prompt_ms``, ``predicted_ms``) and ``usage``
  (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``).
  ``timings`` wins; ``usage`` fills what ``timings`` lacks (an external OpenAI-compatible API
  sends only ``usage``).
- *Full hit*: when the whole prompt is already in the slot, llama.cpp still evaluates the last
  prompt token to get logits, so it reports ``cache_n = N-1, prompt_n = 1``. Such a record is a
  full hit: :attr:`Entry.eff_cached` is ``N`` and :attr:`Entry.recomputed` is 0.
- Several engines (issue 44): ``engine`` (the pooled engine that ran it; "" without a pool),
  ``moved_from`` (the engine that held the conversation's prefix when the grant went
  elsewhere) and ``transfer`` (``restored`` or ``recomputed``; anything else is dropped).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

try:  # orjson parses about twice as fast; the standard library is the fallback
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _fast_loads = json.loads  # type: ignore[assignment]  # same call, another signature


def _loads(raw: bytes | str) -> Any:
    """Parse JSON; what strict JSON refuses (NaN, Infinity) is retried with the standard
    library, so such a value costs only its field (dropped by the field rules), not the record.

    Raises:
        ValueError, UnicodeDecodeError: not JSON even for the standard library.
    """
    try:
        return _fast_loads(raw)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        return json.loads(raw)


#: Request kinds a record may carry; anything else is read as ``unknown``.
KINDS = ("main", "subagent", "verify", "task", "compact", "bench", "foreign", "prewarm")
UNKNOWN_KIND = "unknown"

#: Depth buckets (upper bounds in tokens of context at the end of prefill) used for speeds.
DEPTH_BOUNDS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEPTH_NAMES = ("1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "over_128k")

_MODEL_MAX = 96
_ENGINE_MAX = 96
#: What a moved grant did to its slot (``PerfRecord.transfer``).
TRANSFERS = ("restored", "recomputed")


class RecordDecodeError(ValueError):
    """The payload is not a JSON object at all (the only reason a record is refused)."""


@dataclass(slots=True)
class Loss:
    """Why a completion recomputed what the slot held before (see :mod:`loki_perf.ring`).

    ``type`` is ``loss`` (the messages strictly extended the previous ones, yet the cache did
    not cover the previous total) or ``divergence`` (the messages did not strictly extend:
    ``index``/``role`` name the first message whose fingerprint differs; ``role`` is None when
    this request is a truncation of the previous one). ``tokens`` = previous total − tokens
    reused (None when a figure is unknown). ``cause`` is the category of the request that ran
    last on the engine in between (``conversation``, ``subagent``, ``verify``, ``task``,
    ``summary``, ``bench``, ``foreign``, ``unknown``), ``none`` when nothing ran in between,
    or ``divergence``. ``between`` lists what ran in between, oldest first, as runs
    ``[kind, conversation, count]`` of consecutive records.
    """

    type: str
    cause: str
    tokens: int | None
    prev_seq: int
    prev_total: int | None
    index: int | None = None
    role: str | None = None
    between: list[list[Any]] = field(default_factory=list)
    between_truncated: bool = False


@dataclass(slots=True)
class Entry:
    """One decoded completion record. Token counts are engine tokens, times milliseconds.

    ``seq`` is the JetStream stream sequence (or any increasing number in unit use).
    ``cut`` is None when the publisher sent something that is not a bool (then it is treated
    as cut: no loss is computed after it).
    """

    seq: int
    ts: float
    conversation: str | None = None
    kind: str = UNKNOWN_KIND
    model: str = ""
    external: bool = False
    slot: int | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    prompt_ms: float | None = None
    predicted_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str | None = None
    cut: bool | None = False
    fingerprints: list[str] | None = None
    roles: list[str | None] | None = None
    prefix_unstable: bool = False  # the template probe said: no stable prefix (issue 16)
    tools_fingerprint: str | None = None  # the tools offered ("" none; None unknown; issue 42)
    engine: str = ""  # the pooled engine that ran it ("": one engine; issue 44)
    moved_from: str | None = None  # the engine that held the prefix when it went elsewhere
    transfer: str | None = None  # restored / recomputed (a moved grant), None: not said
    dropped: list[str] = field(default_factory=list)
    # derived by decode()
    cached: int | None = None  # tokens the engine reused (cache_n, else usage cached_tokens)
    computed: int | None = None  # tokens the engine prefilled (prompt_n, else usage difference)
    full_hit: bool = False
    eff_cached: int | None = None  # cached, +1 on a full hit
    recomputed: int | None = None  # computed, 0 on a full hit
    depth: int | None = None  # prompt size N = cached + computed
    generated: int | None = None  # predicted_n, else usage completion_tokens
    pp_tps: float | None = None  # prompt tokens per second
    tg_tps: float | None = None  # generated tokens per second
    bucket: int | None = None  # index into DEPTH_NAMES
    # filled by the ring
    loss: Loss | None = None
    loss_tokens: int | None = None  # raw previous total − reused, even below the threshold
    advice: dict[str, Any] | None = None

    @property
    def total(self) -> int | None:
        """prompt_n + cache_n + predicted_n (what the slot holds after this completion), or
        None when one of them is unknown."""
        if self.cached is None or self.computed is None or self.generated is None:
            return None
        return self.cached + self.computed + self.generated


def _count(value: Any) -> int | None:
    """A token counter: a non-negative int (an integral float is accepted); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    return None


def _ms(value: Any) -> float | None:
    """A duration in milliseconds: a finite non-negative number; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _take(src: Any, key: str, conv, dropped: list[str], label: str):
    """Read ``src[key]`` through ``conv``; a present value that does not convert is
    recorded in ``dropped`` as ``label``."""
    if not isinstance(src, dict) or key not in src or src[key] is None:
        return None
    out = conv(src[key])
    if out is None:
        dropped.append(label)
    return out


def _counts(src: dict, keys: tuple[str, ...], prefix: str, dropped: list[str]) -> list:
    """``src[k]`` for each key as a token count (None when absent or dropped); the fast path
    (a plain non-negative int) avoids a call per field."""
    out: list[int | None] = []
    for k in keys:
        v = src.get(k)
        if v is None:
            out.append(None)
        elif type(v) is int and v >= 0:
            out.append(v)
        else:
            c = _count(v)
            if c is None:
                dropped.append(prefix + k)
            out.append(c)
    return out


def _durations(src: dict, keys: tuple[str, ...], prefix: str, dropped: list[str]) -> list:
    """Like :func:`_counts` for durations in milliseconds."""
    out: list[float | None] = []
    for k in keys:
        v = src.get(k)
        if v is None:
            out.append(None)
        else:
            d = _ms(v)
            if d is None:
                dropped.append(prefix + k)
            out.append(d)
    return out


_TIMING_COUNTS = ("cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted")
_TIMING_MS = ("prompt_ms", "predicted_ms")
_USAGE_COUNTS = ("prompt_tokens", "completion_tokens")


def depth_bucket(depth: int) -> int:
    """Index into :data:`DEPTH_NAMES` of the smallest bucket holding ``depth`` tokens."""
    return bisect_left(DEPTH_BOUNDS, depth)


def decode(raw: bytes | str | dict, seq: int, ts_fallback: float) -> Entry:
    """Decode one record tolerantly.

    Args:
        raw: the message payload (JSON bytes/str) or an already decoded dict.
        seq: the stream sequence of the message.
        ts_fallback: Unix time (seconds) used when ``ts`` is absent or invalid.

    Raises:
        RecordDecodeError: the payload is not JSON or not a JSON object.
    """
    if isinstance(raw, dict):
        data = raw
    else:
        try:
            data = _loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordDecodeError(f"record {seq} is not JSON") from exc
        if not isinstance(data, dict):
            raise RecordDecodeError(f"record {seq} is not a JSON object")

    dropped: list[str] = []
    e = Entry(seq=seq, ts=ts_fallback, dropped=dropped)

    ts = _take(data, "ts", _ms, dropped, "ts")
    if ts is not None:
        e.ts = ts
    conv = data.get("conversation")
    if isinstance(conv, str) and conv:
        e.conversation = conv
    elif conv is not None:
        dropped.append("conversation")
    kind = data.get("kind")
    if isinstance(kind, str) and kind in KINDS:
        e.kind = kind
    else:
        dropped.append("kind")
    model = data.get("model")
    if isinstance(model, str):
        e.model = model[:_MODEL_MAX]
    elif model is not None:
        dropped.append("model")
    e.external = data.get("preset") == "external"
    slot = data.get("slot")
    if slot is not None:
        e.slot = _count(slot)
        if e.slot is None:
            dropped.append("slot")

    timings = data.get("timings")
    if timings is not None and not isinstance(timings, dict):
        dropped.append("timings")
        timings = None
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, dict):
        dropped.append("usage")
        usage = None
    if timings:
        (e.cache_n, e.prompt_n, e.predicted_n, e.draft_n, e.draft_n_accepted) = _counts(
            timings, _TIMING_COUNTS, "timings.", dropped
        )
        e.prompt_ms, e.predicted_ms = _durations(timings, _TIMING_MS, "timings.", dropped)
    if usage:
        e.prompt_tokens, e.completion_tokens = _counts(usage, _USAGE_COUNTS, "usage.", dropped)
        details = usage.get("prompt_tokens_details")
        if details is not None and not isinstance(details, dict):
            dropped.append("usage.prompt_tokens_details")
        elif details:
            e.cached_tokens = _take(
                details,
                "cached_tokens",
                _count,
                dropped,
                "usage.prompt_tokens_details.cached_tokens",
            )

    e.ttft_ms = _take(data, "ttft_ms", _ms, dropped, "ttft_ms")
    e.total_ms = _take(data, "total_ms", _ms, dropped, "total_ms")
    fr = data.get("finish_reason")
    if isinstance(fr, str):
        e.finish_reason = fr
    elif fr is not None:
        dropped.append("finish_reason")
    e.prefix_unstable = data.get("prefix_unstable") is True
    engine = data.get("engine")
    if isinstance(engine, str):
        e.engine = engine[:_ENGINE_MAX]
    elif engine is not None:
        dropped.append("engine")
    moved = data.get("moved_from")
    if isinstance(moved, str) and moved:
        e.moved_from = moved[:_ENGINE_MAX]
    elif moved is not None and moved != "":
        dropped.append("moved_from")
    transfer = data.get("transfer")
    if transfer in TRANSFERS:
        e.transfer = transfer
    elif transfer is not None:
        dropped.append("transfer")
    tf = data.get("tools_fingerprint")
    e.tools_fingerprint = tf if isinstance(tf, str) else None
    cut = data.get("cut", False)
    if isinstance(cut, bool):
        e.cut = cut
    else:
        e.cut = None
        dropped.append("cut")
    fps = data.get("fingerprints")
    if isinstance(fps, list) and set(map(type, fps)) <= {str}:
        e.fingerprints = fps
    elif fps is not None:
        dropped.append("fingerprints")
    roles = data.get("roles")
    if isinstance(roles, list):
        if set(map(type, roles)) <= {str}:
            e.roles = roles
        else:
            e.roles = [r if isinstance(r, str) else None for r in roles]
    elif roles is not None:
        dropped.append("roles")

    _derive(e)
    return e


def _derive(e: Entry) -> None:
    """Fill the derived figures of ``e`` (see the :class:`Entry` field comments)."""
    cached = e.cache_n if e.cache_n is not None else e.cached_tokens
    computed = e.prompt_n
    if computed is None and e.prompt_tokens is not None and cached is not None:
        computed = max(0, e.prompt_tokens - cached)
    e.cached, e.computed = cached, computed
    if cached is not None and computed is not None:
        e.depth = cached + computed
        # llama.cpp: a fully cached prompt re-evaluates its last token
        # (cache_n = N-1, prompt_n = 1).
        e.full_hit = computed == 1 and cached >= 1
        e.eff_cached = cached + 1 if e.full_hit else cached
        e.recomputed = 0 if e.full_hit else computed
    elif e.prompt_tokens is not None:
        e.depth = e.prompt_tokens
    e.generated = e.predicted_n if e.predicted_n is not None else e.completion_tokens
    if e.prompt_n and e.prompt_ms:
        e.pp_tps = e.prompt_n * 1000.0 / e.prompt_ms
    if e.predicted_n and e.predicted_ms:
        e.tg_tps = e.predicted_n * 1000.0 / e.predicted_ms
    if e.depth is not None:
        e.bucket = depth_bucket(e.depth)


#: The cause of a loss on a model whose chat template does not keep a stable prefix.
TEMPLATE_CAUSE = "template"
#: The cause of a loss after the tools the conversation is offered changed (an MCP server's
#: tool list, issue 42): the tools are part of the prompt prefix.
TOOLS_CAUSE = "tools"


def category(kind: str) -> str:
    """The loss cause a request of ``kind`` stands for when it ran in between
    (``main`` of another conversation is ``conversation``; ``compact`` is ``summary``)."""
    if kind == "main":
        return "conversation"
    if kind == "compact":
        return "summary"
    return kind


#: The cause of a loss on a conversation moved to another engine (issue 44): the grant went
#: to an engine other than the one that held its prefix (``moved_from``, or the previous
#: record's ``engine``), and what a slot-file restore brought back did not cover it.
ENGINE_MOVED_CAUSE = "engine_moved"

#: Every value the ``cause`` of a loss (and the ``cause`` metric label) can take.
CAUSES = (
    "conversation",
    "subagent",
    "verify",
    "task",
    "summary",
    "bench",
    "foreign",
    "prewarm",
    UNKNOWN_KIND,
    "none",
    "divergence",
    "template",
    TOOLS_CAUSE,
    ENGINE_MOVED_CAUSE,
)
