"""Settings of the chat service (``LOKI_*`` environment variables)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loki_shared.settings import LokiSettings

DEFAULT_SYSTEM_PROMPT = (
    "You are Loki, a helpful assistant. Answer in the user's language. "
    "Use the tools when they help; `recall` brings back an archived block by its id "
    "(recall:r<seq>) and `recall_search` finds archived blocks by keywords."
)

DEFAULT_SUBAGENT_PROMPT = (
    "You are a sub-agent of Loki, a helpful assistant. You get one task, and the context the "
    "assistant chose to give you; you do not see its conversation. Work on the task, using "
    "the tools when they help, then answer with a complete, self-contained result: the "
    "assistant reads only your final answer."
)


class Settings(LokiSettings):
    """Chat service settings. Beyond :class:`LokiSettings`:

    - ``LOKI_SYSTEM_PROMPT`` — the system message (fixed text: no clock or other volatile
      value, so the prompt prefix stays byte-identical across turns and restarts).
    - ``LOKI_STEP_BUDGET`` — completion steps per turn (default 12); a reminder is sent
      before the last one.
    - ``LOKI_TOOL_RESULT_MAX`` — characters of a tool result in the model's view (30000).
    - ``LOKI_REASONING_ECHO`` — keep ``reasoning_content`` and send it back to the same
      model on the local engine (off by default).
    - ``LOKI_TEMPERATURE``, ``LOKI_TOP_P``, ``LOKI_TOP_K``, ``LOKI_MIN_P``, ``LOKI_MAX_TOKENS``
      — sampling of the preset (unset = not sent); ``top_k``/``min_p`` go to a local
      llama-server only.
    - ``LOKI_CHAT_TEMPLATE_KWARGS`` — JSON object sent as ``chat_template_kwargs`` to a local
      llama-server only (never to an external API).
    - ``LOKI_RETRY_DELAYS`` — pauses (s) before the retries of a request that got no byte
      back (connection failure, 429, 502, 503, 504), a JSON list: ``[0.8, 1.6, 3.2]``.
    - ``LOKI_LOCK_TTL_S`` — expiry of a conversation's ownership lock (renewed every third).
    - ``LOKI_IDLE_RELEASE_S`` — an idle conversation's lock is released after this many
      seconds without a request (300), so another instance may take it over.
    - ``LOKI_RECALL_TIMEOUT_S`` — bound of a recall tool call (s).
    - ``LOKI_LEASE_TIMEOUT_S`` — bound of a lease request to the supervisor (s).
    - ``LOKI_ENGINE_TIMEOUT_S`` — read timeout of the engine stream (s; no byte for that long
      is an error).
    - ``LOKI_INSTANCE_ID`` — this instance's name (default: random).
    - ``LOKI_COMPACT_CONTINUATION`` — summarise by continuing the turn's cached request
      (off by default; see docs/behaviour.md (compaction)).
    - ``LOKI_COMPACT_TAIL_REUSE`` — after a compaction the verbatim tail is sent right after
      the system prompt and the summary after it, joined to the next user message, so
      llama-server (``--cache-reuse``, added by the supervisor with this key) reuses the
      tail's cache (off by default, grey zone; see docs/behaviour.md (compaction)).
    - ``LOKI_PREWARM`` — after a compaction at turn end, send the next request's prefix to
      the conversation's slot while the user reads (a low-priority lease any real request
      pre-empts; never on an external preset; on by default since the headline bench measured
      it; it also makes turn end look ahead at the next message, see docs/behaviour.md
      (compaction)).
    - ``LOKI_COMPACT_THRESHOLD`` — share of the window past which the context is compacted
      (0.75).
    - ``LOKI_NUDGE_IN_TOOL`` — the budget reminder goes at the end of the last tool result
      instead of a separate user message, on a local engine whose template probe says
      ``stable_prefix`` (off by default; see docs/behaviour.md (chat)).
    - ``LOKI_TOKENIZE_TIMEOUT_S`` — bound of one batch of exact token counts by the local
      engine (``/tokenize``; 0.3 s); past it the estimate is used (logged). 0: estimates only.
    - ``LOKI_SUBAGENT_STEP_BUDGET`` — completion steps of one sub-agent run (default 6; the
      ``subagent`` tool, :mod:`loki_chat.subagent`).
    - ``LOKI_SUBAGENT_SYSTEM_PROMPT`` — the sub-agent's own system message (fixed text).
    - ``LOKI_VERIFY`` — after a turn's final answer, a verifier checks it against the
      user's request; a failing verdict adds one corrective step (off by default; a
      preset's feature ``VERIFY`` wins; :mod:`loki_chat.verify`).
    - ``LOKI_VERIFY_MAX_TOKENS`` — ``max_tokens`` of the verifier's request (512).
    - ``LOKI_TASK_TICK_S`` — how often the task scheduler looks for due times (s; 1).
    - ``LOKI_TASK_GRACE_S`` — a due time missed by more than this (every instance down) is
      recorded ``skipped``, except the latest missed one, which runs (s; 300).
    - ``LOKI_TASK_WAIT_S`` — how long a task run waits for the person's turn to end, and for
      its engine lease, before it is recorded ``skipped`` (s; 120).
    - ``LOKI_TASK_LEASE_S`` — a running task run's lease in Redis, renewed every third of it
      while it runs; a run whose lease ends unrenewed (its instance died) is recorded
      ``error`` by another instance (s; 30).
    - ``LOKI_PROJ_SNAPSHOT`` — each conversation keeps a dated copy of its project block,
      sent byte for byte, and changes arrive in ``<context_update from="loki">`` blocks
      (off by default: the block is rebuilt each turn; see docs/behaviour.md (projects)).
    - ``LOKI_PROJ_SNAPSHOT_MAX_UPDATES`` — update blocks accumulated past which the snapshot
      is retaken (8).
    - ``LOKI_KEEP_TURN_IMAGES`` — images stay in the history after their turn, by
      reference (re-read from the conversation's image shelf and checked byte-identical
      before each request), each costing what the engine measured, together at most 10% of
      the window; compaction drops them first (off by default, grey zone: images are
      ephemeral; see docs/behaviour.md (attachments and images), :mod:`loki_chat.kept_images`).
    - ``LOKI_MEMORY_TIMEOUT_S`` — bound of a request to the memory service (block, tools; s).
    - ``LOKI_MEMORY_ACTIVE_WAIT_S`` — bound of a new conversation's wait for the active
      project (0.5 s; past it, the default project), and of a block fetch while the memory
      service does not answer.
    - ``LOKI_MCP_TIMEOUT_S`` — bound of connecting to an MCP server and listing its tools, and
      of each MCP tool call (30 s; past it the call's result says it timed out;
      :mod:`loki_chat.mcp`).
    - ``LOKI_WORKSPACE_TIMEOUT_S`` — bound of a file operation of the workspace service
      (code mode's tools; 30 s; past it the tool's result says the service did not answer).
    - ``LOKI_CODE_RUN_TIMEOUT_S`` — a ``run`` command's time limit when the model names none
      (120 s; the workspace service caps it).
    - ``LOKI_CODE_CHECK_TIMEOUT_S`` — a criterion command's time limit (300 s).
    - ``LOKI_CODE_VERIFY_ROUNDS`` — corrective rounds the verification loop sends in one turn
      of code mode when criteria fail (2; 0: checked and shown, never corrected).
    - ``LOKI_CODE_ROUND_STEPS`` — completion steps a corrective round may take beyond the
      step budget when the budget is spent (6).
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    step_budget: int = Field(default=12, ge=1)
    tool_result_max: int = Field(default=30_000, ge=100)
    reasoning_echo: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    retry_delays: list[float] = Field(default_factory=lambda: [0.8, 1.6, 3.2])
    lock_ttl_s: float = Field(default=15.0, gt=0.5)
    idle_release_s: float = Field(default=300.0, gt=0)
    recall_timeout_s: float = Field(default=5.0, gt=0)
    lease_timeout_s: float = Field(default=70.0, gt=0)
    engine_timeout_s: float = Field(default=600.0, gt=0)
    instance_id: str | None = None
    compact_continuation: bool = False
    compact_tail_reuse: bool = False
    prewarm: bool = True
    compact_threshold: float = Field(default=0.75, gt=0.1, le=0.95)
    nudge_in_tool: bool = False
    tokenize_timeout_s: float = Field(default=0.3, ge=0)
    subagent_step_budget: int = Field(default=6, ge=1)
    subagent_system_prompt: str = DEFAULT_SUBAGENT_PROMPT
    verify: bool = False
    verify_max_tokens: int = Field(default=512, ge=16)
    task_tick_s: float = Field(default=1.0, gt=0)
    task_grace_s: float = Field(default=300.0, ge=0)
    task_wait_s: float = Field(default=120.0, gt=0)
    task_lease_s: float = Field(default=30.0, ge=1)
    proj_snapshot: bool = False
    proj_snapshot_max_updates: int = Field(default=8, ge=1)
    keep_turn_images: bool = False
    memory_timeout_s: float = Field(default=5.0, gt=0)
    memory_active_wait_s: float = Field(default=0.5, gt=0)
    mcp_timeout_s: float = Field(default=30.0, gt=0)
    workspace_timeout_s: float = Field(default=30.0, gt=0)
    code_run_timeout_s: float = Field(default=120.0, gt=0)
    code_check_timeout_s: float = Field(default=300.0, gt=0)
    code_verify_rounds: int = Field(default=2, ge=0)
    code_round_steps: int = Field(default=6, ge=1)
