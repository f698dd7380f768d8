"""The chat service's side of the workspace service (``loki.workspace.*``, issue 43).

:class:`WorkspaceClient` sends the typed requests of :mod:`loki_shared.messages.workspace`
through the chat's bus (:meth:`loki_chat.bus.ChatBus.request`) and turns every way a call
can fail into one exception, :class:`WorkspaceFailure`, whose text says why and what to do:
the tools make it their result (never a failed turn), the criteria checker a detail.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from loki_shared import subjects
from loki_shared.messages.base import Reply
from loki_shared.messages.workspace import (
    CreateRequest,
    InfoRequest,
    RunReply,
    RunRequest,
    WorkspaceInfo,
    WorkspaceReply,
)

log = logging.getLogger("loki.chat.code")

R = TypeVar("R", bound=BaseModel)
#: ``request(subject, message, reply_type, timeout) -> reply`` (:meth:`ChatBus.request`).
RequestFn = Callable[[str, BaseModel, type[Any], float], Awaitable[Any]]

#: Seconds a command's request waits beyond the command's own limit (the sandbox's start
#: and the reply's way back).
RUN_SLACK_S = 15.0
#: Seconds a turn's start waits for the workspace's ``AGENTS.md`` (the project block).
AGENTS_WAIT_S = 2.0

#: What to do, by the workspace's error type.
_ADVICE = {
    "invalid_request": "Correct the arguments and call again.",
    "forbidden": "Use a path relative to the workspace's root, inside it (no '..', no "
    "absolute path, no link leading out).",
    "not_found": "Check the path (list or glob show what exists); if the workspace itself "
    "is missing, tell the user to create it.",
    "conflict": "Read the file again and resend with a text that occurs exactly once.",
    "unavailable": "The sandbox cannot run here: tell the user; file tools still work.",
    "unreachable": "Try again in a moment, or tell the user the workspace service is down.",
}


class WorkspaceFailure(Exception):
    """A workspace call failed: ``kind`` (the reply's error type, or ``unreachable``) and a
    text for the model (why, then what to do)."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        advice = _ADVICE.get(kind, "Try again once; if it fails again, tell the user.")
        super().__init__(f"{message} {advice}".strip())


class WorkspaceClient:
    """Typed calls to the workspace service.

    Args:
        request: the bus's typed request (:meth:`loki_chat.bus.ChatBus.request`).
        timeout_s: bound of a file operation (``LOKI_WORKSPACE_TIMEOUT_S``).
    """

    def __init__(self, request: RequestFn, timeout_s: float) -> None:
        self.request = request
        self.timeout_s = timeout_s

    async def call(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float | None = None
    ) -> R:
        """Send ``message`` on ``subject``; the reply, or :class:`WorkspaceFailure` (the
        reply's error, or no answer within ``timeout`` seconds: ``unreachable``)."""
        try:
            reply = await self.request(subject, message, reply_type, timeout or self.timeout_s)
        except Exception as exc:
            if type(exc).__name__ == "MaxPayloadError":  # nats-py's: never sent, not "down"
                raise WorkspaceFailure(
                    "invalid_request",
                    "The request is larger than the bus carries (NATS max_payload): send less "
                    "at once — a large file in parts (write the first part, then add the rest "
                    "with edit), or produce it with run.",
                ) from exc
            log.warning("workspace %s: no answer (%r)", subject, exc)
            raise WorkspaceFailure(
                "unreachable", f"The workspace service did not answer ({type(exc).__name__})."
            ) from exc
        if isinstance(reply, Reply) and reply.error is not None:
            raise WorkspaceFailure(reply.error.type, reply.error.message)
        return reply

    async def info(self, project: str, timeout: float | None = None) -> WorkspaceInfo:
        """The workspace of ``project`` (``exists`` false when it has none)."""
        reply = await self.call(
            subjects.WORKSPACE_INFO, InfoRequest(project=project), WorkspaceReply, timeout
        )
        return reply.info or WorkspaceInfo(project=project)

    async def agents_md(self, project: str) -> str | None:
        """The ``AGENTS.md`` at the root of ``project``'s workspace (None: none, no
        workspace, or no answer within :data:`AGENTS_WAIT_S`: a turn never waits longer)."""
        try:
            info = await self.info(project, AGENTS_WAIT_S)
        except WorkspaceFailure:
            return None
        return info.agents_md if info.exists else None

    async def ensure(self, project: str) -> WorkspaceInfo:
        """The workspace of ``project``, created empty when it has none."""
        info = await self.info(project)
        if info.exists:
            return info
        try:
            reply = await self.call(
                subjects.WORKSPACE_CREATE, CreateRequest(project=project), WorkspaceReply
            )
        except WorkspaceFailure as exc:
            if exc.kind != "conflict":  # created meanwhile by another caller: fine
                raise
            return await self.info(project)
        return reply.info or WorkspaceInfo(project=project, exists=True)

    async def run(self, project: str, command: str, timeout_s: float) -> RunReply:
        """Run ``command`` in ``project``'s sandbox, stopped after ``timeout_s`` seconds."""
        return await self.call(
            subjects.WORKSPACE_RUN,
            RunRequest(project=project, command=command, timeout_s=timeout_s),
            RunReply,
            timeout_s + RUN_SLACK_S,
        )
