"""Reminders the turn loop injects, and their removal when left unanswered.

Rules (tests named in docs/behaviour.md (chat, reminders)):

- A reminder is persisted exactly as sent, as a user message marked by the field
  ``loki.injected`` (never a text prefix).
- Behind another user message it is sent once at the end of that message (the step plan's
  ``suffix``) and not stored: never two consecutive user messages.
- NUDGE_IN_TOOL (off by default): the budget reminder goes at the end of the last tool result
  instead (that message persisted as sent) when :func:`loki_chat.step_rules.nudge_fits`.
- One left unanswered by a stop, an error or the budget is removed before the conversation is
  persisted; an unanswered nudge leaves the tool result as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loki_shared.messages.chat import REMINDER_KINDS, ChatMessage, LokiMeta

from . import step_rules

if TYPE_CHECKING:
    from .turn import TurnRunner

BUDGET_REMINDER = (
    "[Loki] This is the last step of this turn: answer the user now with "
    "what you have, without calling a tool."
)
ACT_REMINDER = (
    "[Loki] You reasoned but neither answered nor called a tool. Act now: "
    "answer the user, or call the tool you need."
)
MAX_ACT_REMINDERS = 2


async def remind(run: TurnRunner, kind: str, text: str) -> None:
    """Inject reminder ``text`` of ``kind`` (``budget``, ``act``, ``verify``) into
    ``run``'s conversation, by the rules above; emits its ``reminder`` display event."""
    conv, host = run.conv, run.host
    if kind == "budget" and step_rules.nudge_fits(
        run.settings, run.external, run.template, conv.messages
    ):
        last = conv.messages[-1]
        run.nudged = (last, last.content)
        last.content = f"{last.content}\n\n{text}" if last.content else text
        await host.emit(
            {}, loki={"event": "reminder", "injected": kind, "stored": True, "in_tool": True}
        )
        await host.persist()
        return
    if conv.messages and conv.messages[-1].role == "user":
        run.plan.suffix = text if not run.plan.suffix else f"{run.plan.suffix}\n\n{text}"
        await host.emit({}, loki={"event": "reminder", "injected": kind, "stored": False})
        return
    conv.messages.append(ChatMessage(role="user", content=text, loki=LokiMeta(injected=kind)))
    await host.emit(
        {"role": "user", "content": text},
        loki={"event": "reminder", "injected": kind, "stored": True},
    )
    await host.persist()


def drop_unanswered(run: TurnRunner) -> None:
    """At the turn's end: an unanswered nudge leaves its tool result as it was, and trailing
    reminders leave the history."""
    messages = run.conv.messages
    if run.nudged is not None and messages and messages[-1] is run.nudged[0]:
        messages[-1].content = run.nudged[1]
    run.nudged = None
    while messages and messages[-1].loki and messages[-1].loki.injected in REMINDER_KINDS:
        messages.pop()
