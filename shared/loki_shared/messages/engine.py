"""Messages of the engine supervisor (``loki.engine.*``).

The lease protocol (what every caller of llama-server does around ONE completion request;
:mod:`loki_shared.lease` is the one client that does it, as ``async with lease(...)``):

1. request ``loki.engine.lease`` with :class:`LeaseRequest` (NATS timeout > ``wait_s``);
   the reply :class:`Lease` says where to send the request (``base_url``, ``api_key``) and
   with which ``id_slot`` (``None``: do not set ``id_slot`` in the body);
2. every ``ttl_s / 3`` while the request runs, request ``loki.engine.renew`` with
   :class:`RenewRequest` (a lease not renewed expires after ``ttl_s``: its slot is given to
   the next waiter, so a dead holder never blocks the engine);
3. request ``loki.engine.release`` with :class:`ReleaseRequest` when the response is read
   (or failed). Set ``job_done`` on the release of the LAST request of a side job (verify,
   sub-agent, task, bench): the supervisor then erases slot 0 when CACHE_ISOLATE allows it.
   A ``main`` release may carry ``prompt_tokens``/``cached_tokens`` from ``usage`` so the
   supervisor can advise raising CACHE_RAM.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import Msg, Reply, RequestKind

EngineStateName = Literal["starting", "ready", "failed", "stopped"]


class TemplateProbe(Msg):
    """What the engine's chat template really does, found by rendering small probe
    conversations through llama-server's ``POST /apply-template`` (no generation) when the
    engine became ready; cached by ``template_hash`` (sha256 of ``/props`` ``chat_template``).

    Each verdict is True, False, or None (not decided: the rendering failed, or the check
    does not apply; ``notes`` says why):

    - ``supports_tools``: a probe tool's name and description appear in the rendering when
      ``tools`` is sent. ``caps_supports_tools`` is what ``/props``
      ``chat_template_caps.supports_tools`` claims (None: not reported); the rendering wins.
    - ``renders_reasoning``: an earlier assistant message's ``reasoning_content`` appears in
      the rendering of a later request (what REASONING_ECHO needs to be worth anything).
    - ``stable_prefix``: the rendering of a conversation starts, byte for byte, with the
      rendering of every shorter one: [system, user] then + assistant, then + user, and
      (when tools are rendered) + a tool result after an assistant's tool call. A template
      that re-renders the last turn or moves the system prompt fails it.
    - ``strict_alternation``: the template refuses (raises on) two user messages in a row.

    ``notes``: one sentence per verdict that matters to a person ("this model's template
    ignores tools: recall is off for it"). ``error``: why the probe could not run at all.
    """

    template_hash: str = ""
    model: str = ""
    supports_tools: bool | None = None
    caps_supports_tools: bool | None = None
    renders_reasoning: bool | None = None
    stable_prefix: bool | None = None
    strict_alternation: bool | None = None
    notes: list[str] = Field(default_factory=list)
    error: str | None = None


class EngineInfoRequest(Msg):
    """``loki.engine.info``."""


class SlotSummary(Msg):
    """One slot of a pooled engine as the router sees it: ``busy`` (a lease holds it),
    ``waiting`` (requests queued for it), ``conversation`` (whose prompt it last ran; None:
    none or a side job), ``prefix`` (messages of that prompt), ``saved`` (that prompt is in a
    slot file), ``last_used`` (Unix time of the last grant; 0: never)."""

    id_slot: int
    busy: bool = False
    waiting: int = 0
    conversation: str | None = None
    prefix: int = 0
    saved: bool = False
    last_used: float = 0.0


class EngineSummary(Msg):
    """One engine of the pool (issue 44): ``id`` (its name in ``LOKI_ENGINE_URLS``, else
    ``host:port``), ``group`` (engine group a preset may name with ``ENGINE_GROUP``;
    ``default``), ``source`` (``followed``: a llama-server Loki did not launch; ``local``:
    launched by this supervisor; ``external``: an external preset's API), ``state``, ``model``,
    ``n_ctx`` (per slot, tokens), ``total_slots``, ``in_flight`` (leases held), ``waiting``,
    ``slots``, and the counters since the supervisor started: ``grants``, ``moves_in`` (grants
    of a conversation whose longest prefix was elsewhere), ``restores``, ``saves``."""

    id: str
    group: str = "default"
    source: Literal["followed", "local", "external"] = "followed"
    base_url: str = ""
    state: EngineStateName = "stopped"
    detail: str = ""
    model: str = ""
    n_ctx: int = 0
    total_slots: int = 0
    in_flight: int = 0
    waiting: int = 0
    slots: list[SlotSummary] = Field(default_factory=list)
    grants: int = 0
    moves_in: int = 0
    restores: int = 0
    saves: int = 0


class EngineInfo(Reply):
    """What the supervisor knows of the engine.

    ``base_url`` is the OpenAI-compatible root without ``/v1`` (``http://127.0.0.1:8091``).
    ``n_ctx`` is the window of one conversation (tokens, the preset's CTX, or the slot's
    ``n_ctx`` when smaller); ``slot_n_ctx`` the per-slot ``n_ctx`` read from ``/props`` /
    ``/slots``. ``api_key`` is the key of the endpoint in use (internal use only; the gateway
    never returns it). ``side_slot``: SIDE_SLOT asked and accepted (two slots of CTX each);
    ``side_slot_refusal``: why it was refused. ``notes``: launch notes and warnings for a
    person (VRAM note, NGL warning, CACHE_RAM value). ``argv``: the engine's command line
    (API key masked). ``in_flight``: leases held right now. ``preset_id``, ``sampling``,
    ``system_prompt``, ``vision``, ``features`` come from the active preset.

    When ``state`` is ``failed``: ``detail`` says why in one line (a missing or unreadable
    model file, the engine's own error line), ``stderr_tail`` holds llama-server's last output
    lines, and ``retry_in_s`` says when the supervisor launches again (a crash after a
    healthy start, restarted with backoff) or is None: the failure would happen again, so
    nothing is retried until a preset is applied (saved or switched to).

    ``slot_persist``: with SLOT_PERSIST on, the last save or restore of slot 0 (``action``,
    ``file``, ``n_saved``/``n_restored`` tokens, ``ms``, or ``error``); None when off.
    ``draft_model``: the draft model passed to the engine (speculative decoding);
    ``draft_refusal``: why a preset's draft model was not passed.
    ``template``: the chat template probe's verdicts (:class:`TemplateProbe`) once the local
    engine is ready; None for an external API or before the first probe.
    ``engines``: with several engines (``LOKI_ENGINE_URLS``), one :class:`EngineSummary` each
    (empty otherwise); the top-level fields then describe the pool (``state`` ready while one
    engine is, ``base_url`` the first ready one's). ``routing``: the pool's policy (``affine``,
    ``round_robin``, ``least_busy``; "" without a pool). ``instance``: this supervisor
    process's id; ``leader``: the instance granting leases when supervisors are replicated
    (``LOKI_SUPERVISOR_REPLICATED``; None otherwise).
    ``boot``: a token drawn when the supervisor process started (a new one after every
    restart of the supervisor: a lease waiter sees that the process holding its queued
    request is gone, see :mod:`loki_shared.lease`); "" from a supervisor that does not say.
    """

    state: EngineStateName = "stopped"
    base_url: str = ""
    model: str = ""
    model_path: str | None = None
    n_ctx: int = 0
    total_slots: int = 0
    slot_n_ctx: list[int] = Field(default_factory=list)
    build_info: str | None = None
    build_number: int | None = None
    chat_template: str | None = None
    external: bool = False
    api_key: str | None = None
    detail: str = ""
    preset_id: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    system_prompt: str = ""
    vision: bool = False
    features: dict[str, str] = Field(default_factory=dict)
    side_slot: bool = False
    side_slot_refusal: str | None = None
    notes: list[str] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list)
    in_flight: int = 0
    cache_ram_mib: int | None = None
    restarts: int = 0
    stderr_tail: list[str] = Field(default_factory=list)
    retry_in_s: float | None = None
    slot_persist: dict[str, Any] | None = None
    draft_model: str | None = None
    draft_refusal: str | None = None
    template: TemplateProbe | None = None
    boot: str = ""
    engines: list[EngineSummary] = Field(default_factory=list)
    routing: str = ""
    instance: str = ""
    leader: str | None = None


class EngineState(Msg):
    """``loki.engine.state`` event: a change of the engine's state.

    ``stderr_tail`` holds the last lines llama-server wrote when it failed; ``retry_in_s``
    when it will be launched again (None: not retried, see :class:`EngineInfo`). ``notes``
    repeat the launch notes (SIDE_SLOT refusal, VRAM note, NGL warning). ``engine``: with
    several engines (``LOKI_ENGINE_URLS``), the id of the engine whose state changed
    (``EngineSummary.id``; the pool as a whole may still be ready); "" with one engine.
    """

    state: EngineStateName
    ts: float
    detail: str = ""
    stderr_tail: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    base_url: str = ""
    external: bool = False
    retry_in_s: float | None = None
    engine: str = ""


class LeaseRequest(Msg):
    """``loki.engine.lease``: ask to send one request of ``kind`` to the engine.

    ``wait_s`` bounds how long the supervisor queues the request (FIFO per slot; the caller's
    NATS timeout must be longer). ``ttl_s``: asked lifetime of the lease before renewal
    (``None``: the supervisor's default). ``continuation``: a ``compact`` request that
    continues the conversation's cached prompt (COMPACT_CONTINUATION), routed like ``main``;
    a plain ``compact`` (summary of a transcript) goes beside it. ``holder``: an id of the
    asking process (a chat instance's); a grant it never claims (see
    ``loki_supervisor.lease_book``) drops its other waiters and leases with it.
    ``prompt_fingerprints``: :func:`loki_shared.fingerprint.fingerprints` of the messages the
    request will send (the cache-affinity key with several engines: the grant goes to the slot
    whose last prompt shares the longest prefix; empty: unknown, routed as a new prompt)."""

    kind: RequestKind
    conversation: str | None = None
    wait_s: float = 60.0
    ttl_s: float | None = None
    continuation: bool = False
    holder: str | None = None
    prompt_fingerprints: list[str] = Field(default_factory=list)


class Placement(Msg):
    """Where a pooled grant put the request and why (issue 44: several engines, cache-affine
    routing; only with ``LOKI_ENGINE_URLS``: None otherwise).

    ``engine``: the engine's id (``EngineSummary.id``); ``id_slot``: its slot; ``reason``:
    ``affine`` (the slot whose last prompt of this conversation is the longest prefix),
    ``new`` (no engine held a prefix: the least loaded), ``overloaded`` (the affine slot was
    busy past the bound: the least loaded instead), ``apart`` (a side job put on an engine the
    conversation's main slot is not on), ``side`` (a side job on the conversation's own engine:
    no other had a harmless slot), ``failover`` (the engine that held the prefix is
    gone), ``round_robin`` / ``least_busy`` (those policies, for comparison);
    ``prefix``: leading messages the chosen slot already holds (cumulative fingerprints in
    common); ``moved_from``: the engine that held the conversation's longest prefix when the
    grant went elsewhere (None: not moved); ``transfer``: what was done to the slot before the
    grant: ``restored`` (a slot file of this conversation restored with llama.cpp's
    ``POST /slots/{id}?action=restore``), ``recomputed`` (a move without a usable file), or
    None; ``restored_tokens``: ``n_restored`` of that restore; ``saved``: the previous holder's
    slot saved before this grant evicted it (``action=save``)."""

    engine: str
    id_slot: int | None = None
    reason: str = ""
    prefix: int = 0
    moved_from: str | None = None
    transfer: Literal["restored", "recomputed"] | None = None
    restored_tokens: int | None = None
    saved: bool = False


class Lease(Reply):
    """A granted lease: where to send the request and with which ``id_slot`` (None: let the
    engine choose; never set ``id_slot`` then). ``ttl_s``: the lease expires if not released
    or renewed by then. ``shares_main_slot``: the request runs in the slot that holds the
    conversation's prompt (one slot), so it may evict it; False for a slot-1 request with
    SIDE_SLOT (the "slot holds the prompt" state stays true) and for an external preset.
    ``api_key``: the key of THIS endpoint (the local engine's, or the external preset's).
    ``template``: the probe's verdicts on the engine's chat template (None: not probed, as
    for an external API: the caller then assumes what it always did).
    ``max_tokens``: the preset's cap on one completion step (tokens; None: none).
    ``vision``: the endpoint sees images (the engine's ``/props`` modalities, or the external
    preset's vision checkbox), read again at every lease.
    ``verify``: the preset's feature ``VERIFY`` (on/off; None: the preset does not say, the
    chat's ``LOKI_VERIFY`` decides)."""

    lease_id: str = ""
    kind: str = ""
    base_url: str = ""
    id_slot: int | None = None
    n_ctx: int = 0
    model: str = ""
    external: bool = False
    api_key: str | None = None
    ttl_s: float = 0.0
    shares_main_slot: bool = False
    preset_id: str | None = None
    template: TemplateProbe | None = None
    max_tokens: int | None = None
    vision: bool = False
    verify: bool | None = None
    placement: Placement | None = None


class RenewRequest(Msg):
    """``loki.engine.renew``: extend a lease by its ``ttl_s`` (reply: :class:`Lease`; error
    ``not_found`` when it already expired or was released)."""

    lease_id: str


class ReleaseRequest(Msg):
    """``loki.engine.release``.

    ``job_done``: this was the last request of a side job (verify, subagent, task, bench):
    the supervisor erases slot 0 when CACHE_ISOLATE allows it (synchronously, at most 2 s,
    before replying). ``prompt_tokens`` / ``cached_tokens``: ``usage.prompt_tokens`` and
    ``usage.prompt_tokens_details.cached_tokens`` of a ``main`` completion, when known.
    ``prompt_fingerprint``: the last cumulative fingerprint of the messages a ``main``
    request sent (:mod:`loki_shared.fingerprint`); with SLOT_PERSIST it keys the file slot 0
    is saved to.
    """

    lease_id: str
    job_done: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_fingerprint: str | None = None


class ReleaseReply(Reply):
    """``ok``: the lease was held and is now free. ``slot_erased``: slot 0 was erased after
    the side job; ``erase_skipped``: why not (when ``job_done`` was set). ``advice``: a
    one-time advice for a person (raise CACHE_RAM)."""

    ok: bool = False
    slot_erased: bool = False
    erase_skipped: str | None = None
    advice: str | None = None


class Preset(Msg):
    """A preset as the API shows it and accepts it.

    Local preset: ``model`` (GGUF path; empty: the bundled model), ``ctx`` (CTX, tokens),
    ``ngl`` (``None``/"auto", "all", 999, or a layer count), ``parallel`` (PARALLEL, ``None``:
    unset), ``ubatch`` (UBATCH, llama-server's ``--ubatch-size`` in tokens, passed only when
    the engine's help lists it; ``None``: the engine's default), ``extra_args``
    (llama-server arguments, shell-quoted), ``features`` (feature keys
    without the ``LOKI_`` prefix: ``SIDE_SLOT``, ``CACHE_RAM``, ``CACHE_ISOLATE``,
    ``SLOT_PERSIST``, ``SLOT_PERSIST_MAX_MB``, ``VERIFY`` (the chat's verifier, on/off,
    sent with every lease), ...). Speculative decoding with a draft model
    (llama.cpp ``--spec-draft-model`` and friends): ``draft_model`` (GGUF path; empty: none),
    ``draft_max`` / ``draft_min`` (tokens drafted at most / at least per step; None: the
    engine's default), ``draft_ngl`` (the draft's GPU layers, as ``ngl``).
    External preset (``external`` true): ``base_url`` (OpenAI-compatible root, with or
    without ``/v1``), ``api_model``, ``api_key`` (write-only: never returned; an empty or
    missing value on save keeps the stored key), ``vision``. ``api_key_set`` tells whether a
    key is stored. ``max_tokens``: the cap on one completion step (tokens, OpenAI's
    ``max_tokens``); None: a quarter of the window for a local engine, none for an external
    preset.
    """

    id: str = ""
    name: str = ""
    model: str = ""
    ctx: int = 8192
    ngl: str | None = None
    parallel: int | None = None
    ubatch: int | None = None
    extra_args: str = ""
    sampling: dict[str, Any] = Field(default_factory=dict)
    system_prompt: str = ""
    features: dict[str, str] = Field(default_factory=dict)
    draft_model: str = ""
    draft_max: int | None = None
    draft_min: int | None = None
    draft_ngl: str | None = None
    external: bool = False
    base_url: str = ""
    api_model: str = ""
    api_key: str | None = None
    api_key_set: bool = False
    vision: bool = False
    max_tokens: int | None = None


class PresetsRequest(Msg):
    """``loki.engine.presets``: list, get, save, delete, switch, test a preset, compute
    the CACHE_RAM auto value (``cacheram``, for ``preset`` or the active one), or list the
    GGUF files a preset may pick (``models``: under ``LOKI_MODEL_DIRS``)."""

    action: Literal["list", "get", "save", "delete", "switch", "test", "cacheram", "models"]
    preset_id: str | None = None
    preset: dict[str, Any] | None = None


class PresetsReply(Reply):
    """``presets``/``preset`` are :class:`Preset` dumps (never with a key in clear);
    ``active`` the active preset's id; ``detail`` the action's result (connection test:
    ``{"ok", "status", "message", "models"}``; cacheram: the arithmetic; save/switch: the
    launch plan's notes and SIDE_SLOT verdict; models: ``{"dirs", "bundled", "files",
    "truncated"}``, each file ``{"path", "name", "size_bytes", "architecture"}``)."""

    presets: list[dict[str, Any]] = Field(default_factory=list)
    preset: dict[str, Any] | None = None
    active: str | None = None
    detail: dict[str, Any] | None = None


# --------------------------------------------------------------------------- measuring
class BenchPoint(Msg):
    """One measured point of a benchmark: ``test`` ``pp`` (prompt processing: ``n`` new
    tokens after ``depth`` cached ones) or ``tg`` (generation: ``n`` tokens after a prompt of
    ``depth`` tokens), as llama-bench's ``pp N @ d D`` / ``tg N @ d D`` but measured through
    llama-server (``timings.prompt_per_second`` / ``predicted_per_second`` of its
    ``/completion`` responses). ``tps``: each repetition's tokens per second;
    ``median``, ``low``, ``high``: their median and spread (min, max)."""

    test: Literal["pp", "tg"]
    depth: int
    n: int
    tps: list[float] = Field(default_factory=list)
    median: float | None = None
    low: float | None = None
    high: float | None = None


class BenchRun(Msg):
    """One benchmark run of a preset: ``preset_id``, ``model`` (``/props`` model alias or
    path), ``build`` (``/props`` ``build_info``), ``settings`` (the launch settings it ran
    with: ``ubatch``, ``ngl``, ``extra_args``, draft fields), ``points``, ``started``/
    ``finished`` (Unix seconds), ``reps`` (repetitions per point), ``id_slot`` (the slot it
    ran in; None: one slot), ``slot_erased`` (CACHE_ISOLATE erased slot 0 after it),
    ``erase_skipped`` (why not)."""

    run_id: str = ""
    preset_id: str = ""
    model: str = ""
    build: str = ""
    settings: dict[str, Any] = Field(default_factory=dict)
    points: list[BenchPoint] = Field(default_factory=list)
    reps: int = 0
    started: float = 0.0
    finished: float = 0.0
    id_slot: int | None = None
    slot_erased: bool = False
    erase_skipped: str | None = None


class BenchJob(Msg):
    """A benchmark or optimiser job as it runs: ``state`` (``idle``, ``running``, ``done``,
    ``failed``, ``cancelled``), ``done``/``total`` (steps measured of those planned: the
    progress), ``step`` (what runs now, for a person), ``error`` (why it failed), ``run``
    (a finished benchmark's :class:`BenchRun`)."""

    job_id: str = ""
    kind: Literal["bench", "optimise"] = "bench"
    state: Literal["idle", "running", "done", "failed", "cancelled"] = "idle"
    done: int = 0
    total: int = 0
    step: str = ""
    error: str | None = None
    run: BenchRun | None = None


class BenchRequest(Msg):
    """``loki.engine.bench``: ``start`` a benchmark of the preset in service (``depths``:
    context depths in tokens; ``n_pp``/``n_tg``: tokens per pp/tg test; ``reps``:
    repetitions; each None: the supervisor's defaults), ``status`` (the job and the stored
    runs of the preset in service), ``cancel`` the running job, or ``latest`` (the newest run
    of every preset, model and build: what ``/metrics`` exports)."""

    action: Literal["start", "status", "cancel", "latest"]
    depths: list[int] | None = None
    n_pp: int | None = None
    n_tg: int | None = None
    reps: int | None = None


class BenchReply(Reply):
    """``job``: the benchmark job (``start``, ``status``, ``cancel``); ``runs``: stored
    runs, newest last (``status``: the preset in service's; ``latest``: one per preset,
    model and build)."""

    job: BenchJob | None = None
    runs: list[BenchRun] = Field(default_factory=list)


class OptimiseCandidate(Msg):
    """One row of the optimiser's table: ``settings`` (the preset fields it changes),
    ``verdict`` (``measured``, ``refused`` by the memory rules or the plan, ``failed`` to
    launch or measure, ``pending``), ``reason`` (why refused or failed), ``pp``/``tg``
    (median tokens per second over the benchmark's points), ``score`` (what is compared:
    the mean of the pp and tg medians' ratios to the baseline's; the baseline scores 1)."""

    settings: dict[str, Any] = Field(default_factory=dict)
    verdict: Literal["pending", "measured", "refused", "failed"] = "pending"
    reason: str | None = None
    pp: float | None = None
    tg: float | None = None
    score: float | None = None


class OptimiseResult(Msg):
    """An optimiser search: ``preset_id``, ``model``, ``build``, ``table`` (the baseline
    first, then each candidate), ``best`` (the index in ``table`` of the fastest measured
    row), ``diff`` (the preset fields to change to get it: ``{}`` when the preset as it is
    was fastest; never applied by the supervisor), ``finished`` (Unix seconds)."""

    search_id: str = ""
    preset_id: str = ""
    model: str = ""
    build: str = ""
    table: list[OptimiseCandidate] = Field(default_factory=list)
    best: int | None = None
    diff: dict[str, Any] = Field(default_factory=dict)
    finished: float = 0.0


class OptimiseRequest(Msg):
    """``loki.engine.optimise``: ``start`` a search over the preset in service (opt-in;
    ``candidates``: the settings to try, each a dict of preset fields; None: the search the
    engine's ``--help`` allows; ``depths``/``n_pp``/``n_tg``/``reps``: the benchmark of each
    candidate), ``status`` (the job and the last search), or ``cancel`` it (the preset in
    service is launched again as it was)."""

    action: Literal["start", "status", "cancel"]
    candidates: list[dict[str, Any]] | None = None
    depths: list[int] | None = None
    n_pp: int | None = None
    n_tg: int | None = None
    reps: int | None = None


class OptimiseReply(Reply):
    """``job``: the optimiser job; ``result``: the last search of the preset in service
    (its table, the best row, the diff to apply)."""

    job: BenchJob | None = None
    result: OptimiseResult | None = None
