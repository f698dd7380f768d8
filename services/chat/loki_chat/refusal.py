"""What the turn does when the engine refuses a request before streaming (an HTTP error or
no answer): classify the refusal, then replay, compact or give up.

Rules (tests named in docs/behaviour.md (chat, refusals)):

- Context overflow only from llama.cpp's ``exceed_context_size_error`` / "exceeds the
  available context size", OpenAI's ``context_length_exceeded``, or, with no label, a 400/500
  while the conversation is already at 90% of the window: reasoning echo dropped first, then
  the context policy (trigger ``reactive``, at most :data:`MAX_COMPACTIONS_PER_STEP` a step)
  and replay.
- llama.cpp's "Context size has been exceeded." without a token count while two slots serve
  (a shared KV pool full) is replayed as is, once, never compacted.
- HTTP 500 from the local engine: replay once with ``tool_choice: "none"`` and
  :data:`NO_TOOL_INSTRUCTION` at the end of the last message (never persisted); refused
  again: once more without tools. Any other refusal ends the turn with its error.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

from .context import OverflowInfo
from .errors import StepError

if TYPE_CHECKING:
    from .turn import State, TurnRunner

log = logging.getLogger("loki.chat.turn")

NO_TOOL_INSTRUCTION = (
    "(Answer the user directly now, in the user's language, with text only: do not call any tool.)"
)
MAX_COMPACTIONS_PER_STEP = 2

_TOKENS_IN_TEXT = re.compile(r"\d+\s*tokens", re.IGNORECASE)


async def recover(run: TurnRunner, error: StepError) -> State:
    """The next state after ``error``: a replay (``run.complete``, the plan changed), or
    ``run.finish`` with ``run.outcome.error`` set."""
    plan = run.plan
    kind, info = classify_refusal(error, run.ctx_used(), run.lease_n_ctx)
    if kind == "pool":
        slots = await run.host.total_slots()
        if slots is not None and slots >= 2 and plan.pool_replays < 1:
            plan.pool_replays += 1
            log.warning("shared KV pool full with two slots; replaying as is")
            return run.complete
        kind, info = classify_refusal(error, run.ctx_used(), run.lease_n_ctx, pool=False)
    if kind == "overflow":
        if run.sent_echo and plan.echo:
            plan.echo = False
            return run.complete
        if plan.compactions < MAX_COMPACTIONS_PER_STEP and await run.compact("reactive", info):
            plan.compactions += 1
            await run.host.persist()
            return run.complete
        run.outcome.error = f"the conversation no longer fits the context window: {error}"
        return run.finish
    if error.status == 500 and not run.external:
        if plan.mode == "normal" and run.sent_tools:
            plan.mode = "none"
            plan.suffix = NO_TOOL_INSTRUCTION
            log.warning("engine answered 500; replaying with tool_choice none")
            return run.complete
        if plan.mode == "none":
            plan.mode = "no_tools"
            log.warning("replay with tool_choice none refused; falling back to no tools")
            return run.complete
    run.outcome.error = str(error)
    return run.finish


def classify_refusal(
    error: StepError, ctx_used: int, n_ctx: int, pool: bool = True
) -> tuple[str, OverflowInfo | None]:
    """Classify an engine refusal: ``"overflow"`` (with its info), ``"pool"`` (llama.cpp's
    "Context size has been exceeded." without a token count: a shared KV pool full, which
    the caller replays as is when two slots serve) or ``"other"``.

    Overflow only from llama.cpp's ``exceed_context_size_error`` / "exceeds the available
    context size", OpenAI's ``context_length_exceeded``, or — with no label at all — a
    400/500 refusal while the conversation (``ctx_used`` tokens) is already at 90% of the
    window (``n_ctx`` tokens).
    """
    body = error.body or ""
    low = body.lower()
    n_prompt = n_window = None
    try:
        obj = json.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict):
            n_prompt = (
                err.get("n_prompt_tokens") if isinstance(err.get("n_prompt_tokens"), int) else None
            )
            n_window = err.get("n_ctx") if isinstance(err.get("n_ctx"), int) else None
    except ValueError:
        pass
    info = OverflowInfo(status=error.status, body=body, n_prompt_tokens=n_prompt, n_ctx=n_window)
    if (
        "exceed_context_size_error" in low
        or "exceeds the available context size" in low
        or "context_length_exceeded" in low
    ):
        return "overflow", info
    if pool and "context size has been exceeded" in low and not _TOKENS_IN_TEXT.search(body):
        return "pool", info
    if error.status in (400, 500) and n_ctx > 0 and ctx_used >= 0.9 * n_ctx:
        return "overflow", info
    return "other", None
