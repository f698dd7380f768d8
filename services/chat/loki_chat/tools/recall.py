"""The recall tools: ``recall`` and ``recall_search``, served by the recall service.

Rule: each call goes to ``loki.recall.tool`` with a short timeout (``LOKI_RECALL_TIMEOUT_S``);
unreachable, the result says so and invites a retry, and the turn goes on. Each call carries
the conversation's scope (:class:`~loki_shared.messages.recall.RecallScope`): its project, the
default project for every conversation until projects exist, so a block of another project is
"no archived block" for it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from loki_shared import subjects
from loki_shared.messages.recall import RecallScope, ToolReply, ToolRequest

from .box import ToolFn, ToolSpec

log = logging.getLogger("loki.chat.tools")

UNREACHABLE = (
    "The archive (recall service) is unreachable right now; nothing was "
    "recalled. Try the call again in a moment."
)


def recall_tools(
    request: Callable[[str, ToolRequest, type[ToolReply], float], Awaitable[ToolReply]],
    timeout_s: float,
    scope: RecallScope | None = None,
) -> list[ToolSpec]:
    """``recall`` and ``recall_search``, forwarded to ``loki.recall.tool``.

    ``request(subject, message, reply_type, timeout)`` sends the NATS request and returns
    the decoded reply; any exception from it (no responders, timeout, bad reply) becomes
    the "unreachable" result. ``scope`` is sent with every call (default: the default
    project, which holds every conversation until projects exist).
    """
    sent_scope = scope if scope is not None else RecallScope()

    def make(name: str) -> ToolFn:
        async def run(args: dict[str, Any]) -> str:
            try:
                reply = await request(
                    subjects.RECALL_TOOL,
                    ToolRequest(name=name, arguments=args, scope=sent_scope),
                    ToolReply,
                    timeout_s,
                )
            except Exception as exc:  # noqa: BLE001 - unreachable for any reason
                log.warning("recall tool %s unreachable: %r", name, exc)
                return UNREACHABLE
            if reply.error is not None:
                return f"Error: {reply.error.message}"
            return reply.text

        return run

    return [
        ToolSpec(
            name="recall",
            description=(
                "Bring back, verbatim, an archived block cited as recall:r<seq> in a summary."
            ),
            parameters={
                "type": "object",
                "properties": {"id": {"type": "string", "description": "the block id, e.g. r12"}},
                "required": ["id"],
            },
            run=make("recall"),
        ),
        ToolSpec(
            name="recall_search",
            description="Find archived blocks of earlier conversation by keywords.",
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "description": "keywords"}},
                "required": ["query"],
            },
            run=make("recall_search"),
        ),
    ]
