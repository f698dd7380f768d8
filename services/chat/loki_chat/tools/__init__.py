"""Tools the model can call.

- :mod:`.box` — :class:`ToolBox` and the rules applied to every call (arguments, results);
- :mod:`.recall` — ``recall`` and ``recall_search`` (the recall service);
- :func:`default_toolbox` — the tools a chat instance offers, in their fixed order.

A new family of tools (memory_read / memory_write / tracker_log, subagent, see_image) is one
module here returning its :class:`ToolSpec` list, added to :func:`default_toolbox`. Which of
them a step offers (none in the no-tools fallback; later, fewer for a model whose chat
template a probe found unable to call them) is decided in one place: the turn loop's
:meth:`~loki_chat.turn.TurnRunner.offered_tools`.
"""

from __future__ import annotations

from ..bus import ChatBus
from ..settings import Settings
from .box import (
    EMPTY_PARAMETERS,
    ToolBox,
    ToolFn,
    ToolOutcome,
    ToolSpec,
    cut_for_model,
    parse_arguments,
)
from .recall import UNREACHABLE, recall_tools


def default_toolbox(bus: ChatBus, settings: Settings) -> ToolBox:
    """The tools a chat instance offers, in this order (the order is part of the request
    prefix, so it never changes between requests): ``recall``, ``recall_search``."""
    return ToolBox(recall_tools(bus.request, settings.recall_timeout_s))


__all__ = [
    "EMPTY_PARAMETERS",
    "UNREACHABLE",
    "ToolBox",
    "ToolFn",
    "ToolOutcome",
    "ToolSpec",
    "cut_for_model",
    "default_toolbox",
    "parse_arguments",
    "recall_tools",
]
