"""Code mode's pure rules: the conversation's :class:`CodeState`, its criteria, the texts
the model is given (issue 43; docs/behaviour.md (chat, code mode)).

Rules:

- A conversation is in ``chat`` mode (the default) or ``code`` mode; its state is kept in
  the stored head only when it is not the default (:func:`is_default`): a conversation that
  never used code mode is stored byte-identical to before.
- The workspace a conversation works in is its project's (``CodeState.project``, set when
  it switches to code mode, else the conversation's project).
- Criteria: ``set`` replaces them all, numbered ``c1``, ``c2``... in order, every one
  ``pending`` (:func:`new_criteria`).
- The verification loop checks a main turn's final answer (``stop``, not a Continue) in
  code mode when it has criteria (:func:`should_check`); a failing one gets a corrective
  round while fewer than ``LOKI_CODE_VERIFY_ROUNDS`` were sent in the turn.
- Texts: the system prompt's code-mode section (:func:`system_prompt`), the criteria as a
  list (:func:`render_criteria`: the ``criteria`` tool, the corrective reminder, the
  summary message of a compaction) and a command's detail (:func:`run_detail`).
"""

from __future__ import annotations

import time
from typing import Any

from loki_shared.messages.code import CodeState, Criterion, CriterionSpec
from loki_shared.messages.workspace import RunReply

#: The code tools, in the fixed order they follow the other tools.
CODE_TOOLS = (
    "read",
    "write",
    "edit",
    "list",
    "glob",
    "grep",
    "run",
    "git",
    "criteria",
    "preview",
)

#: ``loki.injected`` of the verification loop's corrective reminder.
CRITERIA_KIND = "criteria"

#: Lines of a command's output kept in a criterion's detail (the last ones).
DETAIL_LINES = 15
#: Characters of a criterion's detail at most.
DETAIL_MAX = 1500

CODE_SECTION = (
    "Code mode: you work in the workspace of the project {project}, a git repository; every "
    "path is relative to its root. Use the tools read, write, edit (exact string "
    "replacement), list, glob, grep, run (a shell command in a sandbox: no network, limits "
    "on time and output), git (status, diff, commit, log) and preview (an HTML page "
    "rendered). Read a file before you edit it; run the build and the tests after a change. "
    "When the task has acceptance criteria, record them with the criteria tool (a command "
    "whose exit status 0 says a criterion holds, when one can); your final answer ends the "
    "turn only once every criterion is met: Loki checks them and tells you which fail."
)


def is_default(state: CodeState) -> bool:
    """The state a conversation has before anyone used code mode (not stored)."""
    return state.mode == "chat" and not state.criteria and state.rounds == 0 and not state.project


def workspace_of(state: CodeState, project: str) -> str:
    """The project whose workspace the conversation works in (``project``: the
    conversation's own)."""
    return state.project or project


def system_prompt(base: str, state: CodeState, project: str) -> str:
    """The system message: ``base``, plus the code-mode section in code mode (fixed text
    for a conversation: its project's id only)."""
    if state.mode != "code":
        return base
    return f"{base}\n\n{CODE_SECTION.format(project=workspace_of(state, project))}"


def new_criteria(specs: list[CriterionSpec]) -> list[Criterion]:
    """The criteria ``specs`` as kept: ids ``c1``, ``c2``... in order, all ``pending``."""
    return [Criterion(id=f"c{i}", text=s.text, command=s.command) for i, s in enumerate(specs, 1)]


def should_check(
    state: CodeState, *, kind: str, continued: bool, finish_reason: str | None
) -> bool:
    """The verification loop checks this answer: code mode, criteria kept, a main turn's
    final text answer ended by ``stop``, not a Continue."""
    return (
        state.mode == "code"
        and bool(state.criteria)
        and kind == "main"
        and not continued
        and finish_reason == "stop"
    )


def failing(state: CodeState) -> list[Criterion]:
    """The criteria whose last check failed."""
    return [c for c in state.criteria if c.state == "failed"]


def unchecked(state: CodeState) -> list[Criterion]:
    """The criteria still ``pending`` (never checked, or the check could not be made)."""
    return [c for c in state.criteria if c.state == "pending"]


def render_criteria(criteria: list[Criterion]) -> str:
    """One line per criterion: ``- c1 [met] text (command: ...) — detail``."""
    lines = []
    for c in criteria:
        line = f"- {c.id} [{c.state}] {c.text}"
        if c.command:
            line += f" (command: {c.command})"
        if c.detail:
            line += "\n  " + c.detail.replace("\n", "\n  ")
        lines.append(line)
    return "\n".join(lines) if lines else "(no criteria)"


def summary_part(state: CodeState) -> str:
    """What a compaction's summary message carries of the criteria ("" when the conversation
    is not in code mode or has none)."""
    if state.mode != "code" or not state.criteria:
        return ""
    return "\n\n[Acceptance criteria of the task, as last checked]\n" + render_criteria(
        state.criteria
    )


def corrective_reminder(failed: list[Criterion], round_no: int, rounds: int) -> str:
    """The corrective round's reminder: the failed criteria and their details."""
    return (
        f"[Loki] A check of the task's acceptance criteria found {len(failed)} not met "
        f"(corrective round {round_no} of {rounds}):\n{render_criteria(failed)}\n"
        "Fix the work in the workspace so they hold, run the checks, then answer again."
    )


def unmet_note(failed: list[Criterion], rounds: int) -> str:
    """What the turn's end says when criteria still fail after the rounds."""
    ids = ", ".join(c.id for c in failed)
    return f"criteria still failing after {rounds} corrective round(s): {ids}"


def cut_detail(text: str) -> str:
    """``text`` within :data:`DETAIL_MAX` characters (its end kept)."""
    text = text.strip()
    if len(text) <= DETAIL_MAX:
        return text
    return "…" + text[-(DETAIL_MAX - 1) :]


def run_detail(reply: RunReply) -> str:
    """A command criterion's detail: its exit status (or why it was killed) and the last
    :data:`DETAIL_LINES` lines of its output."""
    if reply.killed:
        head = f"killed ({reply.killed}) after {reply.duration_s:.1f} s"
    else:
        head = f"exit status {reply.exit_code}"
    tail = "\n".join(reply.output.rstrip().splitlines()[-DETAIL_LINES:])
    return cut_detail(f"{head}\n{tail}" if tail else head)


def mark(criterion: Criterion, state: str, detail: str, now: float | None = None) -> None:
    """Record one check of ``criterion``: its ``state``, ``detail`` and time."""
    criterion.state = state  # type: ignore[assignment]
    criterion.detail = cut_detail(detail)
    criterion.checked = time.time() if now is None else now


def criteria_event(state: CodeState) -> dict[str, Any]:
    """The ``criteria`` display event's ``loki`` fields: the list as kept."""
    return {"event": "criteria", "criteria": [c.model_dump() for c in state.criteria]}
