"""The names the model sees for MCP tools: ``<server>__<tool>``, sanitised, unique, stable.

Rules:

- Every character outside ``[A-Za-z0-9_]`` becomes ``_`` and runs of them collapse to one
  (a ``__`` the server or tool name carries stays, as the separator does);
- at most :data:`MAX_NAME` (64) characters (the limit of the strictest APIs and templates);
- unique within the offered list: a name already taken (a built-in, or an earlier MCP tool
  in the stable order) gets ``_2``, ``_3``… (cut to fit the cap), in that same order, so the
  same servers and tools always get the same names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Longest tool name offered.
MAX_NAME = 64
#: Between the server's name and the tool's.
SEPARATOR = "__"

_OTHER = re.compile(r"[^A-Za-z0-9_]+")


def clean(part: str) -> str:
    """``part`` with every run of characters outside ``[A-Za-z0-9_]`` as one ``_``."""
    return _OTHER.sub("_", part)


def model_name(server: str, tool: str) -> str:
    """``<server>__<tool>`` sanitised and cut to :data:`MAX_NAME` (not yet de-duplicated)."""
    name = clean(server) + SEPARATOR + (clean(tool) or "tool")
    return name[:MAX_NAME]


def unique_names(pairs: Iterable[tuple[str, str]], taken: Iterable[str]) -> list[str]:
    """The model names of ``pairs`` (``(server, tool)``, in offered order), none equal to a
    name in ``taken`` or to an earlier one: a clash gets ``_2``, ``_3``… (cut to fit)."""
    used = set(taken)
    out: list[str] = []
    for server, tool in pairs:
        base = model_name(server, tool)
        name, n = base, 1
        while name in used:
            n += 1
            suffix = f"_{n}"
            name = base[: MAX_NAME - len(suffix)] + suffix
        used.add(name)
        out.append(name)
    return out
