"""What the code tools act on: one conversation's workspace and code state.

A :class:`CodeTarget` is built by the conversation's owner (:class:`loki_chat.actor.Actor`)
for the conversations in code mode; the tools read the project whose workspace they work in
(:func:`loki_chat.code.rules.workspace_of`) at each call, so a conversation's tools follow
its state.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loki_shared.messages.code import CodeState

from ...code.workspace import WorkspaceClient, WorkspaceFailure


@dataclass
class CodeTarget:
    """One conversation's side of the code tools.

    Attributes:
        workspace: the workspace service's client.
        project: ``project()`` → the project id whose workspace the tools work in.
        state: ``state()`` → the conversation's :class:`CodeState` (the ``criteria`` tool
            changes its criteria in place).
        changed: ``await changed()`` after the criteria changed or were checked (the
            ``criteria`` display event, then the conversation written).
        check: ``await check(stop)`` checks every criterion now (no corrective round);
            None: checks are not available here.
        run_timeout_s: a command's limit when the model names none (seconds).
        result_max: characters of a result the model sees (``LOKI_TOOL_RESULT_MAX``): a
            command's output keeps its head and tail within it.
    """

    workspace: WorkspaceClient
    project: Callable[[], str]
    state: Callable[[], CodeState]
    changed: Callable[[], Awaitable[None]]
    check: Callable[[asyncio.Event], Awaitable[bool]] | None = None
    run_timeout_s: float = 120.0
    result_max: int = 30_000


def failure_text(tool: str, exc: Exception) -> str:
    """The result of a call that failed: why, and what to do."""
    if isinstance(exc, WorkspaceFailure):
        return f"Error: `{tool}` failed: {exc}"
    if isinstance(exc, ValueError):  # pydantic's ValidationError is one
        first = str(exc).strip().splitlines()
        reason = " ".join(line.strip() for line in first[:4])
        return (
            f"Error: the arguments of `{tool}` are not valid ({reason}). "
            "Correct them and call again."
        )
    raise exc


def text_arg(args: dict[str, Any], name: str) -> str | None:
    """The argument ``name`` as text (None when absent or not a string)."""
    value = args.get(name)
    return value if isinstance(value, str) else None


def number_arg(args: dict[str, Any], name: str) -> float | None:
    """The argument ``name`` as a finite number: a JSON number, or a string holding one (a
    model often writes ``"200"``); None when absent, not a number, infinite or NaN."""
    value = args.get(name)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def int_arg(args: dict[str, Any], name: str) -> int | None:
    """The argument ``name`` as an integer (see :func:`number_arg`; None when it is none)."""
    value = number_arg(args, name)
    return None if value is None else int(value)


#: Strings a model writes for a boolean.
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", "", "none", "null"})


def bool_arg(args: dict[str, Any], name: str, default: bool = False) -> bool:
    """The argument ``name`` as a boolean: a JSON boolean, a number (0 is false) or a string
    (``"false"``, ``"0"``, ``"no"`` are false — never true for being a non-empty string);
    ``default`` when absent or unreadable."""
    value = args.get(name)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return default


def missing(tool: str, name: str, what: str) -> str:
    """The result of a call without its required argument ``name``."""
    return f"Error: `{tool}` needs `{name}` ({what}). Call it again with it."
