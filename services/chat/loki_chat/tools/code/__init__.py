"""The code tools (issue 43), offered to the conversations in code mode only.

- :mod:`.target` — :class:`CodeTarget`: the workspace and code state they act on;
- :mod:`.files` — ``read``, ``write``, ``edit``, ``list``, ``glob``, ``grep``;
- :mod:`.commands` — ``run`` and ``git`` (in the sandbox);
- :mod:`.criteria` — ``criteria`` (set, check, list);
- :mod:`.preview` — ``preview`` (an HTML page rendered).

:func:`code_tools` returns them in their fixed order
(:data:`loki_chat.code.rules.CODE_TOOLS`), appended after every other tool of the
conversation (:attr:`loki_chat.actor.Actor.toolbox`).
"""

from __future__ import annotations

from ..box import ToolSpec
from .commands import command_tools, head_tail, run_result
from .criteria import criteria_tool
from .files import file_tools, numbered
from .preview import preview_tool
from .target import CodeTarget


def code_tools(target: CodeTarget) -> list[ToolSpec]:
    """The code tools over ``target``, in order: read, write, edit, list, glob, grep, run,
    git, criteria, preview."""
    return [
        *file_tools(target),
        *command_tools(target),
        criteria_tool(target),
        preview_tool(target),
    ]


__all__ = ["CodeTarget", "code_tools", "head_tail", "numbered", "run_result"]
