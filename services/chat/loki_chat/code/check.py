"""The criteria checker: each criterion of a conversation checked against its workspace.

Rules (docs/behaviour.md (chat, code mode)):

- A criterion with a ``command`` runs it in the sandbox: exit status 0 is ``met``, any other
  end ``failed``; its detail is the exit status (or why it was killed) and the last lines of
  its output.
- A criterion without one is judged by the verifier side job (:func:`judge_message`: the
  criterion, the assistant's final answer and the workspace's ``git status`` and
  ``git diff --stat``): ``pass`` is ``met``, ``fail`` ``failed``, the verifier's reason the
  detail; no verdict (malformed, engine failure) leaves it ``pending`` (said in the detail).
- A check that cannot be made (the workspace service unreachable, the sandbox unavailable)
  leaves the criterion ``pending``, its detail saying why: no corrective round is sent for
  it (the turn's end says it is unchecked).
- A stop ends the check at once (the criteria not reached keep their state).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loki_shared.messages.code import CodeState, Criterion

from ..verify import Verdict
from .rules import mark, run_detail
from .workspace import WorkspaceClient, WorkspaceFailure

log = logging.getLogger("loki.chat.code")

#: The verifier's instructions for one criterion.
CRITERION_PROMPT = (
    "You check whether one acceptance criterion of a coding task holds, from the assistant's "
    "final answer and the state of its workspace (git status and diff stat). Judge only this "
    "criterion. Reply with one line of JSON and nothing else: "
    '{"verdict": "pass", "reason": "<why>"} or {"verdict": "fail", "reason": "<what is '
    'missing>"}.'
)

#: The command giving the judge the workspace's state.
WORKSPACE_STATE_COMMAND = "git status --short; git diff --stat"

#: ``judge(system prompt, user message) -> Verdict`` (None: stopped).
Judge = Callable[[str, str], Awaitable[Verdict | None]]


def judge_message(criterion: Criterion, answer: str, workspace: str) -> str:
    """The verifier's user message for ``criterion``: the criterion, the answer and the
    workspace's state, delimited."""
    return (
        f"The criterion:\n<criterion>\n{criterion.text}\n</criterion>\n\n"
        f"The assistant's final answer:\n<answer>\n{answer}\n</answer>\n\n"
        f"The workspace (git status --short; git diff --stat):\n<workspace>\n{workspace}\n"
        "</workspace>\n\nYour verdict, as one line of JSON:"
    )


@dataclass
class CheckOutcome:
    """A check of every criterion: ``stopped`` (a stop ended it)."""

    stopped: bool = False


async def check_all(
    state: CodeState,
    *,
    workspace: WorkspaceClient,
    project: str,
    judge: Judge | None,
    answer: str,
    stop: asyncio.Event,
    timeout_s: float,
) -> CheckOutcome:
    """Check every criterion of ``state`` in order (updated in place) by the rules above.

    Args:
        workspace: the workspace service's client; ``project``: whose workspace.
        judge: the verifier for the criteria without a command (None: they stay pending).
        answer: the assistant's final answer ("" outside a turn).
        stop: the turn's stop event.
        timeout_s: a criterion command's time limit (seconds).
    """
    snapshot: str | None = None
    for criterion in state.criteria:
        if stop.is_set():
            return CheckOutcome(stopped=True)
        if criterion.command:
            try:
                reply = await workspace.run(project, criterion.command, timeout_s)
            except WorkspaceFailure as exc:
                mark(criterion, "pending", f"not checked: {exc}")
                continue
            met = reply.exit_code == 0 and not reply.killed
            mark(criterion, "met" if met else "failed", run_detail(reply))
            continue
        if judge is None:
            mark(criterion, "pending", "not checked: no verifier here")
            continue
        if snapshot is None:
            snapshot = await workspace_state(workspace, project)
        verdict = await judge(CRITERION_PROMPT, judge_message(criterion, answer, snapshot))
        if verdict is None:
            return CheckOutcome(stopped=True)
        if verdict.malformed:
            mark(criterion, "pending", f"not checked: {verdict.reason}")
        else:
            mark(criterion, "met" if verdict.ok else "failed", f"verifier: {verdict.reason}")
    return CheckOutcome()


async def workspace_state(workspace: WorkspaceClient, project: str) -> str:
    """``git status --short`` and ``git diff --stat`` of the workspace (or why not)."""
    try:
        reply = await workspace.run(project, WORKSPACE_STATE_COMMAND, 30.0)
    except WorkspaceFailure as exc:
        return f"(unknown: {exc})"
    text = reply.output.strip()[:4000]
    return text or "(clean: nothing changed since the last commit)"
