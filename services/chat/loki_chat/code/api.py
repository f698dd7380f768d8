"""``loki.chat.code``: a conversation's code mode and acceptance criteria (get, mode,
criteria, check), served in the conversation's owner (forwarded to it like ``control``).

Rules (docs/behaviour.md (chat, code mode)):

- ``mode``: a switch is a prompt change made once (the system prompt's code-mode section and
  the code tools from the next request on), told to the user by the display event
  ``mode_changed`` (kept in the log); the same mode again changes nothing (no event). It is
  refused (``conflict``) while a turn runs: the running turn's requests keep the prompt they
  started with. Switching to code mode makes the project's workspace when it has none (a
  failure is logged: the tools then say the workspace is unavailable).
- Back in ``chat`` mode the requests are byte-identical to a conversation that never used
  code mode; the criteria stay kept for a later switch.
- ``criteria``: replaces them all (``c1``... pending), told by the display event
  ``criteria``; allowed while a turn runs (the next check uses them).
- ``check``: checks them now (no corrective round); refused while a turn runs (``conflict``)
  and when there are none (``invalid_request``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from loki_shared.errors import Conflict, InvalidRequest
from loki_shared.messages.code import ChatMode, CodeReply, CodeRequest

from .rules import new_criteria
from .workspace import WorkspaceFailure

if TYPE_CHECKING:
    from ..actor import Actor

log = logging.getLogger("loki.chat.code")

BUSY = "a turn is running: {what} after it ends (or stop it first)"


async def handle(actor: Actor, req: CodeRequest) -> CodeReply:
    """Serve ``req`` in the owner ``actor`` by the rules above.

    Raises:
        InvalidRequest: ``mode`` without ``mode``, ``criteria`` without ``criteria``,
            ``check`` with no criteria.
        Conflict: ``mode`` or ``check`` while a turn runs.
    """
    code = actor.conv.code
    if req.action in ("mode", "check") and actor.busy:
        await settled(actor)
    if req.action == "mode":
        if req.mode is None:
            raise InvalidRequest("'mode' (chat or code) is required to switch the mode")
        if actor.busy and req.mode != code.mode:
            raise Conflict(BUSY.format(what="switch the mode"))
        await switch_mode(actor, req.mode)
    elif req.action == "criteria":
        if req.criteria is None:
            raise InvalidRequest(
                "'criteria' (a list of {text, command?}; [] clears them) is required"
            )
        code.criteria = new_criteria(req.criteria)
        await actor.criteria_changed()
    elif req.action == "check":
        if not code.criteria:
            raise InvalidRequest("no criteria to check: set them first")
        if actor.busy:
            raise Conflict(BUSY.format(what="check the criteria"))
        actor.stop.clear()  # no turn runs: a stop from now on ends this check
        await actor.check_criteria(actor.stop)
    return CodeReply(state=actor.conv.code.model_copy(deep=True))


async def settled(actor: Actor) -> None:
    """When the turn's end event is out and nothing is queued, the worker is only writing the
    conversation's last state: wait for that write (as ``control`` does) rather than refuse."""
    if not actor.conv.turn_open and not actor.conv.pending:
        await actor.settle()


async def switch_mode(actor: Actor, mode: ChatMode) -> None:
    """Switch ``actor``'s conversation to ``mode`` (nothing when it is in it already)."""
    code = actor.conv.code
    if code.mode == mode:
        return
    code.mode = mode
    code.rounds = 0
    code.project = actor.conv.project if mode == "code" else None
    meta: dict[str, object] = {"event": "mode_changed", "mode": mode}
    if mode == "code":
        meta["project"] = code.project
        workspace = actor.shared.workspace
        if workspace is not None:
            try:
                info = await workspace.ensure(actor.workspace_project)
                meta["sandbox"] = info.sandbox
            except WorkspaceFailure as exc:
                log.warning("workspace of %s not ready: %s", actor.workspace_project, exc)
                meta["workspace_error"] = str(exc)
    await actor.emit({}, loki=meta)
    await actor.persist()
