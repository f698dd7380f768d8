"""Code mode of a conversation: ``loki.chat.code`` (issue 43).

A conversation is in ``chat`` mode (the default) or ``code`` mode: in code mode the model
gets the workspace tools (``read``, ``write``, ``edit``, ``list``, ``glob``, ``grep``,
``run``, ``git``, ``criteria``, ``preview``) working in the workspace of the conversation's
project (:mod:`loki_shared.messages.workspace`). The acceptance criteria of the task live
with the conversation (not in the thread: only the ``criteria`` tool's calls are there), so
they survive compaction; a turn in code mode that has criteria ends only once they are
checked (the verification loop, docs/behaviour.md (chat, code mode)).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .base import Msg, Reply

ChatMode = Literal["chat", "code"]
#: ``pending`` (never checked, or changed since), ``met``, ``failed``.
CriterionState = Literal["pending", "met", "failed"]


class CriterionSpec(Msg):
    """A criterion as written (by the model's ``criteria`` tool or the person): ``text``
    (what must hold), ``command`` (a command whose exit status 0 says it holds, run in the
    sandbox; None: judged by the verifier against the workspace's state)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=2000)
    command: str | None = Field(default=None, min_length=1, max_length=2000)


class Criterion(CriterionSpec):
    """A criterion kept with the conversation: ``id`` (``c1``, ``c2``... in order of
    writing), its ``state``, ``detail`` (why: the command's exit status and last output
    lines, or the verifier's reason) and ``checked`` (epoch seconds of the last check, 0:
    never)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    state: CriterionState = "pending"
    detail: str = ""
    checked: float = 0.0


class CodeState(Msg):
    """A conversation's code mode: ``mode``, ``project`` (whose workspace it works in),
    ``criteria``, ``rounds`` (corrective rounds the verification loop sent in the last
    turn)."""

    mode: ChatMode = "chat"
    project: str | None = None
    criteria: list[Criterion] = Field(default_factory=list)
    rounds: int = 0


class CodeRequest(Msg):
    """``loki.chat.code``: ``get``; ``mode`` (switch to ``mode``: a prompt change made once,
    told to the user by the display event ``mode_changed``; refused while a turn runs);
    ``criteria`` (replace the criteria by ``criteria``, all ``pending``); ``check`` (check
    them now against the workspace, no corrective round)."""

    conversation: str
    action: Literal["get", "mode", "criteria", "check"]
    mode: ChatMode | None = None
    criteria: list[CriterionSpec] | None = Field(default=None, max_length=50)


class CodeReply(Reply):
    """``state``: the conversation's code mode after the request."""

    state: CodeState | None = None
