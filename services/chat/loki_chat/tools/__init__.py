"""Tools the model can call.

- :mod:`.box` — :class:`ToolBox` and the rules applied to every call (arguments, results);
- :mod:`.recall` — ``recall`` and ``recall_search`` (the recall service);
- :mod:`.memory` — the project memory tools (the memory service);
- :mod:`.vision` — ``see_image`` (an image of the conversation's attachments);
- :mod:`.labels` — the tool-name → main-argument table (labels, and what a tool reads);
- :func:`default_toolbox` — the tools a chat instance offers, in their fixed order.

A new family of tools (memory_read / memory_write / tracker_log, subagent, see_image) is one
module here returning its :class:`ToolSpec` list, added to :func:`default_toolbox`. Which of
them a step offers (none in the no-tools fallback; later, fewer for a model whose chat
template a probe found unable to call them) is decided in one place: the turn loop's
:meth:`~loki_chat.turn.TurnRunner.offered_tools`.
"""

from __future__ import annotations

from ..bus import ChatBus
from ..image_shelf import ImageShelf
from ..settings import Settings
from .box import (
    EMPTY_PARAMETERS,
    ToolBox,
    ToolFn,
    ToolOutcome,
    ToolReturn,
    ToolSpec,
    cut_for_model,
    parse_arguments,
)
from .labels import MAIN_ARGUMENT, label, main_argument
from .memory import MemoryCall, memory_tools
from .recall import UNREACHABLE, recall_tools
from .vision import see_image_tool


def default_toolbox(
    bus: ChatBus,
    settings: Settings,
    shelf: ImageShelf | None = None,
    memory: MemoryCall | None = None,
) -> ToolBox:
    """The tools a chat instance offers, in this order (the order is part of the request
    prefix, so it never changes between requests): ``recall``, ``recall_search``, then,
    with the memory service's calls (``memory``: the composer passes
    :func:`loki_chat.project.memory_link.memory_call` of its client), ``memory_read``,
    ``memory_write``, ``memory_search``, ``tracker_log``, ``tracker_read``, then
    ``see_image`` when ``shelf`` is given (offered only to an endpoint that sees images)."""
    box = ToolBox(recall_tools(bus.request, settings.recall_timeout_s))
    if memory is not None:
        for spec in memory_tools(memory):
            box.add(spec)
    if shelf is not None:
        box.add(see_image_tool(shelf))
    return box


__all__ = [
    "EMPTY_PARAMETERS",
    "MAIN_ARGUMENT",
    "ToolReturn",
    "label",
    "main_argument",
    "see_image_tool",
    "UNREACHABLE",
    "ToolBox",
    "ToolFn",
    "MemoryCall",
    "ToolOutcome",
    "ToolSpec",
    "cut_for_model",
    "default_toolbox",
    "memory_tools",
    "parse_arguments",
    "recall_tools",
]
