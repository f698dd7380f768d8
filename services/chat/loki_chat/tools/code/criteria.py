"""The ``criteria`` tool: the acceptance criteria of the task (``set``, ``check``, ``list``).

Rules (docs/behaviour.md (chat, code mode)): ``set`` replaces every criterion (ids ``c1``,
``c2``..., all ``pending``; a criterion may name a ``command`` whose exit status 0 says it
holds); ``check`` checks them now against the workspace (no corrective round); ``list``
shows them. A change or a check is told to the user (display event ``criteria``) and kept
with the conversation (they survive compaction: rendered into the summary message).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from loki_shared.messages.code import CriterionSpec

from ...code.rules import new_criteria, render_criteria
from ..box import CallContext, ToolSpec
from .target import CodeTarget, missing, text_arg

_ACTIONS = ("set", "check", "list")


def criteria_tool(target: CodeTarget) -> ToolSpec:
    """The ``criteria`` tool over ``target``."""

    async def run_call(args: dict[str, Any], call: CallContext) -> str:
        action = text_arg(args, "action")
        if action not in _ACTIONS:
            return missing("criteria", "action", "one of set, check, list")
        state = target.state()
        if action == "set":
            raw = args.get("criteria")
            if not isinstance(raw, list):
                return missing(
                    "criteria", "criteria", 'a list of {"text": ..., "command": ...} objects'
                )
            try:
                specs = [CriterionSpec.model_validate(item) for item in raw]
            except ValidationError as exc:
                return (
                    f"Error: a criterion is not valid ({exc.error_count()} problem(s): "
                    f'{exc.errors()[0]["msg"]}). Each is {{"text": what must hold, '
                    '"command": optional shell command whose exit 0 says it holds}. '
                    "Nothing was changed: send them again."
                )
            state.criteria = new_criteria(specs)
            await target.changed()
            return f"{len(state.criteria)} criteria set (all pending):\n" + render_criteria(
                state.criteria
            )
        if action == "check":
            if not state.criteria:
                return "No criteria to check: set them first."
            if target.check is None:
                return "Error: checks are not available here. Call criteria list."
            if not await target.check(call.stop):
                return "Not checked: the turn was stopped."
            return "Criteria checked:\n" + render_criteria(state.criteria)
        return render_criteria(state.criteria)

    async def run(args: dict[str, Any]) -> str:
        return await run_call(args, CallContext(call_id="", conversation=""))

    return ToolSpec(
        name="criteria",
        description=(
            "The task's acceptance criteria: `set` replaces them (each {text, command?}: a "
            "command whose exit 0 says it holds), `check` checks them now, `list` shows them. "
            "Your final answer ends the turn only once they are met."
        ),
        parameters={
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(_ACTIONS)},
                "criteria": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "text": {"type": "string"},
                            "command": {"type": "string"},
                        },
                        "required": ["text"],
                    },
                },
            },
            "required": ["action"],
        },
        run=run,
        run_call=run_call,
    )
