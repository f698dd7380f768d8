"""The verifier's place in a turn: check the final answer, then at most one corrective step.

Rules (tests named in docs/behaviour.md (chat, the verifier)): a main turn's final text
answer is checked once (:func:`loki_chat.step_rules.should_verify`) by a ``verify`` side job
(:func:`loki_chat.verify.run_verify`); its verdict is the display event ``verify``; a failing
verdict adds ONE corrective step (a ``verify`` reminder, persisted as sent, then one more
completion, one step beyond the budget when it was spent, no budget reminder joined to it),
never a second verification; a stop during it ends the turn ``stopped``, the answer as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import reminders
from .verify import corrective_reminder, last_request, run_verify

if TYPE_CHECKING:
    from .turn import State, TurnRunner


async def verify(run: TurnRunner) -> State:
    """Verify ``run``'s last message; the next state: ``run.build`` (the corrective step) or
    ``run.finish``."""
    host, conv = run.host, run.conv
    run.verified = True
    answer = conv.messages[-1]
    request = last_request(conv.messages[:-1])
    if request is None or not isinstance(answer.content, str):
        return run.finish
    outcome = await run_verify(
        settings=run.settings,
        engine=host.engine,
        lease=lambda sent: host.lease("verify", sent),
        conversation=conv.id,
        request=request,
        answer=answer.content,
        stop=host.stop,
        publish_perf=host.publish_perf,
    )
    verdict = outcome.verdict
    if outcome.stopped or verdict is None:
        run.outcome.stopped = True
        return run.finish
    meta: dict[str, Any] = {
        "event": "verify",
        "verdict": "pass" if verdict.ok else "fail",
        "reason": verdict.reason,
    }
    if verdict.malformed:
        meta["malformed"] = True
    await host.emit({}, loki=meta)
    if verdict.ok:
        return run.finish
    steps, budget = run.outcome.steps, run.step_budget
    if steps >= budget:
        run.budget_extra += 1  # the corrective step is one more than the budget
    if steps + 1 >= budget:
        run.budget_reminded = True  # the verify reminder already asks for the answer
    run.outcome.finish_reason = None
    await reminders.remind(run, "verify", corrective_reminder(verdict))
    return run.build
