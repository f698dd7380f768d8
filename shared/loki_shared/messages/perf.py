"""Messages of the perf service (``loki.perf.*``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Msg, Reply, RequestKind


class PerfRecord(Msg):
    """One completion, published on ``loki.perf.record`` (JetStream) by whoever ran it.

    Build and publish it with :mod:`loki_shared.perf_publish`.

    ``ts`` is the Unix time (seconds) the completion ended. ``kind`` is the request kind;
    ``preset`` is ``"local"`` or ``"external"`` (an external API's records are kept but never
    flagged as losses); ``slot`` the ``id_slot`` used (None: the engine chose).
    ``timings`` and ``usage`` are the final chunk's objects as llama-server (or an external
    API) sent them, undecoded: the perf service decodes them tolerantly (llama.cpp:
    ``timings.cache_n, prompt_n, predicted_n, draft_n, draft_n_accepted, prompt_ms,
    predicted_ms``; OpenAI: ``usage.prompt_tokens, completion_tokens,
    prompt_tokens_details.cached_tokens``). Times the client measured are in milliseconds
    (``ttft_ms``: first delta of any type; ``total_ms``: request sent to stream end).
    ``cut`` is true when the stream ended without its final chunk (stopped, error,
    disconnect). ``fingerprints[i]`` is the cumulative hash of the messages sent up to ``i``
    (see :func:`loki_shared.fingerprint.fingerprints`) and ``roles[i]`` message ``i``'s role.
    ``prefix_unstable`` is true when the lease's chat template probe said the model's
    template does not keep a stable prefix (``TemplateProbe.stable_prefix`` False): the perf
    service then attributes a cache loss on it to cause ``template`` (issue 16).
    ``tools_fingerprint`` is :func:`loki_shared.fingerprint.tools_fingerprint` of the
    ``tools`` the request offered (``""``: none; None: the publisher does not say): a loss
    after the conversation's tools changed is attributed to cause ``tools`` (issue 42).
    ``engine``: the pooled engine that ran it (``Placement.engine``; ``""``: one engine, no
    pool); ``moved_from``: the engine that held the conversation's longest prefix when the
    grant went elsewhere (the perf service attributes a loss on it to cause
    ``engine_moved``); ``transfer``: ``restored`` (the slot file restored before the request:
    ``cache_n`` then says whether it held) or ``recomputed`` (moved without a file); None: not
    moved (issue 44).
    No message text ever goes here.
    """

    ts: float
    conversation: str | None = None
    kind: RequestKind
    model: str = ""
    preset: str = "local"  # "local" or "external"
    slot: int | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str | None = None
    cut: bool = False
    fingerprints: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    prefix_unstable: bool = False
    tools_fingerprint: str | None = None
    engine: str = ""
    moved_from: str | None = None
    transfer: str | None = None


class SummaryRequest(Msg):
    """``loki.perf.summary`` (the body may be ``{}``)."""


class PerfSummary(Reply):
    """Aggregates over the ring: at least the count of completions and the sums of
    ``prompt_n`` and ``cache_n`` (unknown values are not counted as 0); ``detail`` holds the
    rest (hit rate, per-kind figures, speeds by depth, losses by cause, ``cache_ram`` advice);
    its keys are listed in docs/behaviour.md (perf)."""

    completions: int = 0
    prompt_n: int = 0
    cache_n: int = 0
    detail: dict[str, Any] = Field(default_factory=dict)


class LossesRequest(Msg):
    """``loki.perf.losses``: the ``limit`` most recent losses (1..5000)."""

    limit: int = 100


class LossesReply(Reply):
    """Newest first. Each item: ``seq, ts, conversation, kind, model, type`` (``loss`` or
    ``divergence``), ``cause``, ``tokens`` (previous total − tokens reused; None if unknown),
    ``prev_seq, prev_total, cache_n, prompt_n``, ``index``/``role`` (first differing message
    of a divergence), ``between`` (what ran on the engine in between: ``kind, cause,
    conversation, count``, oldest first) and ``between_truncated``."""

    losses: list[dict[str, Any]] = Field(default_factory=list)


class CacheRamAdviceRequest(Msg):
    """``loki.perf.cacheram``: advice events with a stream sequence above ``since_seq``."""

    since_seq: int = 0


class CacheRamAdviceReply(Reply):
    """``advise`` is true when, after ``since_seq``, a conversation came back (its ``main``
    request strictly extending its previous one after other requests ran) with
    ``cached_tokens`` under half of its prompt: the engine's host-RAM prompt cache
    (``--cache-ram``) was too small to keep it. ``events`` (at most 20, newest last): ``seq,
    ts, conversation, cached_tokens, prompt_tokens, between``. ``last_seq``: the newest
    record seen (pass it back as ``since_seq`` to get only new events)."""

    advise: bool = False
    count: int = 0
    events: list[dict[str, Any]] = Field(default_factory=list)
    last_seq: int = 0
