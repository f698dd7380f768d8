"""Supervisor configuration, from ``LOKI_*`` environment variables (built in ``__main__``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from loki_shared.settings import LokiSettings


class Settings(LokiSettings):
    """The engine supervisor's settings.

    The local engine (the ``env`` preset, used until another preset is switched to):

    - ``LOKI_MODEL``: GGUF path (default: the bundled SmolLM2-135M-Instruct Q4_1).
    - ``LOKI_MODEL_DIRS``: directories whose ``*.gguf`` files the preset editor offers
      (``:`` or ``,`` separated; empty: only the bundled model is offered).
    - ``LOKI_CTX``: CTX, the window of one conversation in tokens (default 8192).
    - ``LOKI_NGL``: GPU layers: unset/``auto``, ``all``, ``999`` (all three → ``-ngl auto``
      on an engine that knows it), or a number (imposed; a warning is noted).
    - ``LOKI_PARALLEL``: ``-np`` (unset: one slot, or two with SIDE_SLOT).
    - ``LOKI_UBATCH``: ``--ubatch-size`` (tokens; unset: the engine's default; passed only when
      the engine's help lists the option).
    - ``LOKI_EXTRA_ARGS``: more llama-server arguments (shell-quoted), appended last.
    - ``LOKI_SIDE_SLOT`` (``on``/``off``, default off), ``LOKI_CACHE_RAM`` (MiB: empty/auto,
      a number, -1, 0), ``LOKI_CACHE_ISOLATE`` (default on).
    - ``LOKI_SLOT_PERSIST``: ``on``/``off`` (default off): slot 0 saved when the engine is
      idle after a turn and before a planned stop, restored after a restart.
    - ``LOKI_SLOT_PERSIST_MAX_MB``: all kept slot files together, MiB (empty: 2048).
    - ``LOKI_DRAFT_MODEL``: GGUF path of a draft model for speculative decoding (empty: none).
    - ``LOKI_DRAFT_MAX``: tokens drafted at most per step (unset: the engine's default).
    - ``LOKI_DRAFT_MIN``: tokens drafted at least per step (unset: the engine's default).
    - ``LOKI_DRAFT_NGL``: the draft model's GPU layers: a number, ``auto`` or ``all``
      (unset: the engine's default).
    - ``LOKI_CHAT_TEMPLATE_FILE``: a Jinja chat template file used instead of the GGUF's
      (``--jinja --chat-template-file``; for a GGUF without one; empty: the GGUF's).
    - ``LOKI_COMPACT_TAIL_REUSE``: ``true``/``false`` (default off; read by the chat service
      too): adds ``--cache-reuse`` when the engine's help lists it, so the tail a compaction
      moves right after the system prompt is reused (no effect on an external preset).
    - ``LOKI_CACHE_REUSE``: ``--cache-reuse``'s chunk in tokens with ``LOKI_COMPACT_TAIL_REUSE``
      on (default 256).
    - ``LOKI_ENGINE_URL``: use the llama-server already running there (nothing launched).
    - ``LOKI_ENGINE_HOST`` (default 127.0.0.1), ``LOKI_ENGINE_PORT`` (default: a free port),
      ``LOKI_ENGINE_API_KEY`` (``--api-key`` of the local engine; the key sent to it).
    - ``LOKI_ENGINE_THREADS``: ``-t`` (unset: llama-server's default).
    - ``LOKI_ENGINE_START_TIMEOUT`` (s, default 300): ``/health`` must answer 200 by then.
    - ``LOKI_ENGINE_BACKOFF_MAX`` (s, default 30): longest wait between restarts.
    - ``LOKI_LEASE_TTL`` (s, default 6): lease lifetime without renewal (renewed every
      third): how long the slot of a killed holder stays taken.
    - ``LOKI_LEASE_CLAIM_S`` (s, default 2): a fresh grant's lifetime until its first
      renewal (a grant to a dead waiter is given back after this).

    Several engines (issue 44, docs/scaling.md):

    - ``LOKI_ENGINE_URLS``: comma-separated llama-servers to follow as one pool, each
      ``[name[@group]=]url`` (``gpu0=http://10.0.0.2:8080``; name default ``host:port``, group
      default ``default``); nothing is launched then, except for one ``local`` entry
      (``local``, ``name=local``, ``name@group=local``): the llama-server this supervisor
      launches from the active local preset joins the pool (refused with replicated
      supervisors and with a followed LOKI_ENGINE_URL). Empty: one engine, as before.
    - ``LOKI_ENGINE_ROUTING``: the pool's policy: ``affine`` (default: the slot holding the
      longest prefix of the conversation's prompt), ``round_robin`` or ``least_busy`` (for
      comparison).
    - ``LOKI_AFFINITY_QUEUE_MAX``: requests that may wait ahead for a conversation's affine
      slot before it is moved to the least loaded one (default 1).
    - ``LOKI_ENGINE_SLOT_DIR``: the directory every pooled engine was given as
      ``--slot-save-path``, as this supervisor sees it (empty: no slot transfer on a move).
    - ``LOKI_SUPERVISOR_REPLICATED``: ``true`` when several supervisor instances follow the
      same pool: one leader (elected in Redis) grants, the others forward to it, and the
      leases live in Redis so a new leader keeps them (default false).
    - ``LOKI_SUPERVISOR_LEADER_TTL_S`` (s, default 3): the leader's key lifetime without
      renewal (how long leasing pauses when the leader is killed).
    """

    model: str = Field(default="", description="GGUF path; empty: bundled model.")
    model_dirs: str = Field(
        default="", description="Directories of GGUF files the preset editor offers (: or ,)."
    )
    ctx: int = Field(default=8192, ge=256)
    ngl: str | None = None
    parallel: int | None = Field(default=None, ge=1)
    ubatch: int | None = Field(default=None, ge=1)
    extra_args: str = ""
    side_slot: str = "off"
    cache_ram: str = ""
    cache_isolate: str = "on"
    slot_persist: str = "off"
    slot_persist_max_mb: str = ""
    draft_model: str = ""
    draft_max: int | None = Field(default=None, ge=0)
    draft_min: int | None = Field(default=None, ge=0)
    draft_ngl: str | None = None
    chat_template_file: str = ""
    compact_tail_reuse: bool = False
    cache_reuse: int = Field(default=256, ge=1)
    engine_url: str = ""
    engine_host: str = "127.0.0.1"
    engine_port: int | None = None
    engine_api_key: SecretStr | None = None
    engine_threads: int | None = None
    engine_start_timeout: float = 300.0
    engine_backoff_max: float = 30.0
    lease_ttl: float = Field(default=6.0, gt=0)
    lease_claim_s: float = Field(default=2.0, gt=0)
    engine_urls: str = ""
    engine_routing: Literal["affine", "round_robin", "least_busy"] = "affine"
    affinity_queue_max: int = Field(default=1, ge=0)
    engine_slot_dir: str = ""
    supervisor_replicated: bool = False
    supervisor_leader_ttl_s: float = Field(default=3.0, gt=0.5)
