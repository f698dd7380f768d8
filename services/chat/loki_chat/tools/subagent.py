"""The ``subagent`` tool: hands one task to a fresh conversation (see :mod:`loki_chat.subagent`).

Rule: ``subagent(task, context?)`` runs inside the turn (it needs the call's
:class:`~loki_chat.tools.box.CallContext`: its events nest under the call, the turn's stop
ends it); outside a turn it is refused with a result saying so. It ends itself on a stop
(``handles_stop``): its result is then the "stopped" text, so every call keeps its result.
"""

from __future__ import annotations

from typing import Any

from .box import CallContext, CallToolFn, ToolReturn, ToolSpec

SUBAGENT = "subagent"

NOT_IN_TURN = "Error: the sub-agent runs only inside a turn; nothing was done."


def subagent_tool(run: CallToolFn) -> ToolSpec:
    """The ``subagent`` tool spec; ``run(args, call)`` runs the sub-agent (arguments already
    decoded: ``task`` a string, ``context`` an optional string) and returns its result."""

    async def outside(_args: dict[str, Any]) -> str:
        return NOT_IN_TURN

    async def inside(args: dict[str, Any], call: CallContext) -> str | ToolReturn:
        task = args.get("task")
        context = args.get("context")
        if not isinstance(task, str) or not task.strip():
            return (
                'Error: `subagent` needs a non-empty string "task". Nothing was done. Send '
                'the call again as {"task": "<what to do>", "context": "<optional facts>"}.'
            )
        if context is not None and not isinstance(context, str):
            return (
                'Error: `subagent`\'s "context" must be a string when given. Nothing was '
                "done. Send the call again with it as text."
            )
        return await run(args, call)

    return ToolSpec(
        name=SUBAGENT,
        description=(
            "Hand a self-contained task to a sub-agent that works on it alone (it can search "
            "the archive) and returns only its final answer. It does not see this "
            "conversation: put what it needs in `context`."
        ),
        parameters={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "what the sub-agent must do"},
                "context": {
                    "type": "string",
                    "description": "facts from this conversation the sub-agent needs",
                },
            },
            "required": ["task"],
        },
        run=outside,
        run_call=inside,
        handles_stop=True,
    )
