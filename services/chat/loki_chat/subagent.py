"""A sub-agent run: a fresh conversation driven by the same turn loop (:mod:`loki_chat.turn`).

Rules (docs/behaviour.md (chat, sub-agents)):

- Its own conversation (in memory, never stored), its own system prompt
  (``LOKI_SUBAGENT_SYSTEM_PROMPT``) and step budget (``LOKI_SUBAGENT_STEP_BUDGET``), the
  recall tools (never ``subagent``: it cannot start another) and the MCP tools the main
  conversation's project allows, no compaction.
- Its requests hold leases of kind ``subagent`` (for the main conversation's id, so perf
  names it in between two turns); the last one is released with ``job_done``.
- Nothing streams to the main model: its events go to the main conversation's display log as
  ``loki={"event": "subagent", "tool_call_id", "inner": {...}}`` (``delta`` empty), which
  the web UI nests under the call; the main model gets only the final answer as the result.
- It shares the turn's stop: a stop ends it and the result is :data:`STOPPED`.
- Hook: a project update block of the main conversation is never given to it (its first
  message is built by :func:`first_message` from the task and context alone).
"""

from __future__ import annotations

import asyncio
from typing import Any

from loki_shared.lease import EngineLease
from loki_shared.messages.base import RequestKind
from loki_shared.messages.chat import ChatEvent, ImageAttachment
from loki_shared.messages.perf import PerfRecord

from .context import ContextPolicy, NoCompaction
from .conversation import Conversation
from .engine import EngineClient
from .prewarm import PrewarmJob
from .project.head import ProjectHead
from .settings import Settings
from .tools import ToolBox
from .tools.box import CallContext
from .tools.memory import CURRENT_PROJECT

#: The tools a sub-agent gets from the main tool box (when present), in the box's order.
SUBAGENT_TOOLS = ("recall", "recall_search", "memory_read")

STOPPED = "Stopped: the user stopped the turn before the sub-agent finished; no answer."


def first_message(task: str, context: str | None) -> str:
    """The sub-agent's user message: the task, then the context the model gave (never a
    project block of the main conversation)."""
    if context and context.strip():
        return f"{task}\n\nContext:\n{context}"
    return task


class SubagentHost:
    """The turn loop's host for one sub-agent run (:class:`loki_chat.turn.TurnHost`)."""

    def __init__(self, shared: Any, call: CallContext) -> None:
        self.shared = shared
        self.call = call
        self.conv = Conversation(id=f"{call.conversation}.{call.call_id}")
        self.conv.meter.counter = shared.tokens
        self.settings: Settings = shared.settings.model_copy(
            update={
                "system_prompt": shared.settings.subagent_system_prompt,
                "step_budget": shared.settings.subagent_step_budget,
            }
        )
        base: ToolBox = shared.toolbox.only(SUBAGENT_TOOLS)
        mcp = getattr(shared, "mcp", None)  # the MCP tools the main conversation's project has
        self.toolbox = mcp.box(base, CURRENT_PROJECT.get()) if mcp is not None else base
        self.engine: EngineClient = shared.engine
        self.policy: ContextPolicy = NoCompaction()
        self.stop: asyncio.Event = call.stop
        # no project block (a sub-agent never sees the main conversation's block or its
        # update blocks); memory_read acts on the main conversation's project
        self.project = ProjectHead(fetch=None)
        self.conv.project = CURRENT_PROJECT.get()

    async def emit(self, delta: dict[str, Any] | None = None, **fields: Any) -> ChatEvent:
        inner: dict[str, Any] = {"delta": delta or {}}
        inner.update({k: v for k, v in fields.items() if v is not None})
        event: ChatEvent = await self.call.emit(
            {}, loki={"event": "subagent", "tool_call_id": self.call.call_id, "inner": inner}
        )
        return event

    async def persist(self) -> None:
        """Nothing: the run lives in memory; its events are in the main log."""

    def lease(
        self, kind: RequestKind = "subagent", fingerprints: list[str] | None = None
    ) -> EngineLease:
        """A ``subagent`` lease for the main conversation (a sub-agent is never verified:
        ``kind`` is always its own); ``fingerprints``: of the messages it will send."""
        return self.shared.leases.lease(
            self.call.conversation, kind="subagent", stop=self.stop, fingerprints=fingerprints
        )

    def publish_perf(self, record: PerfRecord) -> None:
        self.shared.bus.publish_perf(record)

    async def total_slots(self) -> int | None:
        return None

    async def keep_images(self, images: list[ImageAttachment]) -> None:
        """Nothing: a sub-agent's task is text; it has no attachments of its own."""

    async def shelf_images(self) -> dict[str, ImageAttachment]:
        """None: a sub-agent keeps no image (KEEP_TURN_IMAGES is the main turn's)."""
        return {}

    def prewarm(self, job: PrewarmJob) -> None:
        """Nothing: a sub-agent never compacts, and its run ends with its answer."""

    async def check_criteria(self, stop: asyncio.Event, answer: str = "") -> bool:
        """A sub-agent has no criteria (its turns are never checked)."""
        return True

    def tools_withheld(self, unavailable: dict[str, Any] | None) -> None:
        """Nothing: the main turn tells the user."""


async def run_subagent(shared: Any, args: dict[str, Any], call: CallContext) -> str:
    """Run one sub-agent for the call ``call`` with ``args`` (``task``, ``context``); return
    its final answer, :data:`STOPPED`, or an error text (never raises for engine trouble)."""
    from .turn import TurnRunner  # the turn loop imports the tools package

    host = SubagentHost(shared, call)
    runner = TurnRunner(
        host, first_message(str(args["task"]), args.get("context")), kind="subagent"
    )
    outcome = await runner.run()
    if outcome.stopped:
        return STOPPED
    if outcome.error is not None:
        return f"Error: the sub-agent failed: {outcome.error}"
    last = host.conv.messages[-1] if host.conv.messages else None
    if last is not None and last.role == "assistant" and isinstance(last.content, str):
        if last.content.strip():
            return last.content
    return "The sub-agent ended without an answer (its step budget ran out)."
