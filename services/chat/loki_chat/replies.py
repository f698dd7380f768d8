"""What the turn keeps of a step's answer: the accepted message (its reasoning when echoed,
the meter's measure), a Continue's text appended to the cut reply, a stopped or broken
step's partial text, and the turn end's ``loki`` fields.

Rules (tests named in docs/behaviour.md (chat)): a stop or a broken stream keeps the partial
text, marked ``loki.stopped`` / ``loki.error``, and nothing half-assembled (tool calls); a
Continue's text goes to the same stored message, its stop/error marks dropped; a turn cut at
the request's ``max_tokens`` says ``cut_at`` (the cap; a ``length`` below it — the window
filled — does not).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from loki_shared.messages.chat import ChatMessage, LokiMeta

from . import step_rules

if TYPE_CHECKING:
    from .turn import TurnRunner

log = logging.getLogger("loki.chat.turn")

#: Relative gap between the estimate at send and the measured prompt worth a log line.
ESTIMATE_GAP = 0.02


def accept_message(run: TurnRunner, message: ChatMessage) -> None:
    """Append ``message`` (the step's answer) to the conversation, with the step's reasoning
    when REASONING_ECHO applies, and give the meter the step's usage."""
    conv = run.conv
    acc = run.result.acc if run.result else None
    echo = run.echo_reasoning()
    if acc is not None and echo and acc.reasoning:
        message.reasoning_content = acc.reasoning
        message.reasoning_model = run.model
    conv.messages.append(message)
    prompt = (acc.usage or {}).get("prompt_tokens") if acc is not None else None
    if isinstance(prompt, int) and prompt and run.estimate_at_send:
        gap = abs(run.estimate_at_send - prompt) / prompt
        if gap > ESTIMATE_GAP:
            log.info(
                "[ctx] %s: estimate %d vs measured prompt %d (%.0f%%)",
                conv.id,
                run.estimate_at_send,
                prompt,
                gap * 100,
            )
    if acc is not None:
        # only the local server's separated reasoning is subtracted; an external API's
        # count is kept whole (its reasoning is not separated piece by piece)
        sent_back = run.external or bool(
            echo and message.reasoning_content and (message.content or message.tool_calls)
        )
        conv.meter.record(
            acc.usage,
            acc.reasoning_pieces,
            reasoning_sent_back=sent_back,
            count=len(conv.messages),
        )


def extend_last(run: TurnRunner, content: str) -> None:
    """Continue: append ``content`` to the last (assistant) message, which the engine
    continued; its stop/error marks go (the reply is resumed), the meter takes the step's
    measure."""
    last = run.conv.messages.pop()
    text = last.content if isinstance(last.content, str) else ""
    accept_message(run, last.model_copy(update={"content": text + content, "loki": None}))


async def keep_partial(run: TurnRunner, *, stopped: bool = False, error: str | None = None) -> None:
    """Keep the partial text of a stopped or broken step, marked; drop partial calls; emit
    the ``stopped`` / ``error`` display event."""
    acc = run.result.acc if run.result else None
    text = acc.content if acc else ""
    if text.strip():
        accept_message(
            run,
            ChatMessage(
                role="assistant", content=text, loki=LokiMeta(stopped=stopped, error=error)
            ),
        )
    await run.host.emit(
        {},
        loki={"event": "stopped" if stopped else "error", **({"message": error} if error else {})},
    )


def turn_end_meta(run: TurnRunner, finish: str) -> dict[str, Any]:
    """The ``loki`` fields of the turn end event: ``steps``, ``stopped``, ``error``,
    ``cut_at`` (cut at the request's cap), ``prefix_unstable``, ``criteria_failed`` and
    ``criteria_unchecked`` (code mode: the ids still failing, or not checked, at the end),
    ``ctx_used``."""
    outcome = run.outcome
    meta: dict[str, Any] = {"event": "turn_end", "steps": outcome.steps}
    if outcome.stopped:
        meta["stopped"] = True
    if outcome.error is not None:
        meta["error"] = outcome.error
    if finish == "length" and run.max_tokens_sent:
        generated = (outcome.usage or {}).get("completion_tokens")
        if not isinstance(generated, int) or generated >= run.max_tokens_sent:
            meta["cut_at"] = run.max_tokens_sent  # cut at the cap (not by the window)
    if step_rules.prefix_unstable(run.template):
        meta["prefix_unstable"] = True  # the UI's prefill badge says why the cache is lost
    if run.criteria_failed:  # code mode: still failing after the corrective rounds
        meta["criteria_failed"] = list(run.criteria_failed)
    if run.criteria_unchecked:
        meta["criteria_unchecked"] = list(run.criteria_unchecked)
    meta["ctx_used"] = run.conv.meter.used(run.settings.system_prompt, run.conv.messages)
    return meta
