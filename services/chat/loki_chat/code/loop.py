"""The verification loop's place in a turn of code mode (issue 43).

Rules (docs/behaviour.md (chat, code mode)): a main turn in code mode that has criteria does
not end on the model's final answer (:func:`loki_chat.code.rules.should_check`): every
criterion is checked against the workspace (:meth:`loki_chat.actor.Actor.check_criteria`:
the display event ``criteria`` shows the result, the conversation keeps it); when one fails
and fewer than ``LOKI_CODE_VERIFY_ROUNDS`` corrective rounds were sent in this turn, ONE
more round: a reminder listing the failed criteria and their details (persisted as sent,
``loki.injected="criteria"``), then the turn goes on (up to ``LOKI_CODE_ROUND_STEPS`` steps
beyond a spent budget). After the last round, the turn ends and its end says which criteria
still fail (``criteria_failed``) or could not be checked (``criteria_unchecked``). This
replaces the generic answer verifier for that turn. A stop during it ends the turn
``stopped``, the answer as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import reminders
from .rules import CRITERIA_KIND, corrective_reminder, failing, unchecked

if TYPE_CHECKING:
    from ..turn import State, TurnRunner


async def verify_criteria(run: TurnRunner) -> State:
    """Check the criteria after ``run``'s final answer; the next state: ``run.build`` (a
    corrective round) or ``run.finish``."""
    conv, host = run.conv, run.host
    run.verified = True  # the generic verifier does not run in this turn
    if run.code_rounds == 0:
        conv.code.rounds = 0
    answer = conv.messages[-1].content if conv.messages else ""
    if not await host.check_criteria(host.stop, answer if isinstance(answer, str) else ""):
        run.outcome.stopped = True
        return run.finish
    failed = failing(conv.code)
    run.criteria_failed = [c.id for c in failed]
    run.criteria_unchecked = [c.id for c in unchecked(conv.code)]
    rounds = run.settings.code_verify_rounds
    if not failed or run.code_rounds >= rounds:
        return run.finish
    run.code_rounds += 1
    conv.code.rounds = run.code_rounds
    steps, budget = run.outcome.steps, run.step_budget
    room = run.settings.code_round_steps
    if steps + room > budget:
        run.budget_extra += steps + room - budget  # the round's own steps
    run.budget_reminded = False
    run.outcome.finish_reason = None
    await reminders.remind(run, CRITERIA_KIND, corrective_reminder(failed, run.code_rounds, rounds))
    return run.build
