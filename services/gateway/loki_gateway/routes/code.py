"""A conversation's code mode and acceptance criteria (issue 43): ``/api/chat/mode`` (GET,
POST), ``/api/chat/criteria`` (GET, PUT) and ``/api/chat/criteria/check`` (POST).

Every route is one ``loki.chat.code`` request to the chat service
(:mod:`loki_shared.messages.code`) and answers the conversation's ``CodeState``: ``{"mode":
"chat"|"code", "project", "criteria": [{"id", "text", "command", "state":
"pending"|"met"|"failed", "detail", "checked"}], "rounds"}``. Switching the mode is refused
while a turn runs (409, the chat service's word); the switch is told in the thread by the
display event ``mode_changed``. Setting the criteria replaces them all (each ``pending``);
checking runs their commands in the workspace's sandbox now, with no corrective round.
Errors are OpenAI-shaped: 400 a bad body or query (what to resend), 404 an unknown
conversation, 503 no chat service.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from loki_shared import subjects
from loki_shared.messages.code import ChatMode, CodeReply, CodeRequest, CriterionSpec

from ..bus import Bus
from ..deps import get_bus
from ..errors import UpstreamError
from .chat import CONV_PATTERN, ConvQuery

router = APIRouter(tags=["code"])

#: How long a request waits for the chat service (get, mode, criteria).
CODE_WAIT_S = 15.0
#: How long a check may take: it runs each criterion's command in the sandbox (each bounded
#: there by ``LOKI_WORKSPACE_RUN_MAX_S``).
CHECK_WAIT_S = 600.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation: str = Field(pattern=CONV_PATTERN)


class ModeBody(_Body):
    """``POST /api/chat/mode``: switch ``conversation`` to ``mode``."""

    mode: ChatMode


class CriteriaBody(_Body):
    """``PUT /api/chat/criteria``: the conversation's criteria, replaced by these (at most
    50, each ``{"text", "command"?}``; an empty list clears them)."""

    criteria: list[CriterionSpec] = Field(max_length=50)


class CheckBody(_Body):
    """``POST /api/chat/criteria/check``: check ``conversation``'s criteria now."""


async def _code(bus: Bus, timeout: float = CODE_WAIT_S, **fields: Any) -> dict[str, Any]:
    """The conversation's ``CodeState`` after the request, as JSON (raises the reply's
    error; a reply without a state is a 502)."""
    reply = await bus.request_ok(subjects.CHAT_CODE, CodeRequest(**fields), CodeReply, timeout)
    if reply.state is None:
        raise UpstreamError("the chat service answered loki.chat.code without a state")
    return reply.state.model_dump(mode="json")


@router.get("/api/chat/mode")
async def code_mode_get(conversation: ConvQuery, bus: Bus = Depends(get_bus)) -> Any:
    """The conversation's ``CodeState`` (``mode`` is ``chat`` until it is switched)."""
    return await _code(bus, conversation=conversation, action="get")


@router.post("/api/chat/mode")
async def code_mode_set(body: ModeBody, bus: Bus = Depends(get_bus)) -> Any:
    """Switch the mode (``chat`` or ``code``): the ``CodeState`` after it. Refused (409)
    while a turn runs; the same mode again changes nothing."""
    return await _code(bus, conversation=body.conversation, action="mode", mode=body.mode)


@router.get("/api/chat/criteria")
async def criteria_get(conversation: ConvQuery, bus: Bus = Depends(get_bus)) -> Any:
    """The conversation's ``CodeState``: its ``criteria`` with their states."""
    return await _code(bus, conversation=conversation, action="get")


@router.put("/api/chat/criteria")
async def criteria_set(body: CriteriaBody, bus: Bus = Depends(get_bus)) -> Any:
    """Replace the criteria (each ``pending`` again): the ``CodeState`` after it."""
    return await _code(
        bus, conversation=body.conversation, action="criteria", criteria=body.criteria
    )


@router.post("/api/chat/criteria/check")
async def criteria_check(body: CheckBody, bus: Bus = Depends(get_bus)) -> Any:
    """Check every criterion now against the workspace (commands run in the sandbox; no
    corrective round): the ``CodeState`` with each one ``met`` or ``failed`` and why."""
    return await _code(bus, CHECK_WAIT_S, conversation=body.conversation, action="check")
