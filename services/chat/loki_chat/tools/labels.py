"""The tool-name → main-argument table.

Rule: each tool Loki offers has ONE main argument, named here. The table has two uses: the
label a person sees for a call (``see_image red.png``, :func:`label`) and the value a tool
reads as its subject (``see_image`` reads ``path`` through :func:`main_argument`). A tool
missing from the table would run on an empty string, so a test checks that every tool of the
default tool box is in it and that its entry is a required parameter of its schema.
"""

from __future__ import annotations

from typing import Any

#: tool name → the name of its main argument.
MAIN_ARGUMENT: dict[str, str] = {
    "recall": "id",
    "recall_search": "query",
    "see_image": "path",
    # code mode (issue 43; :mod:`loki_chat.tools.code`)
    "read": "path",
    "write": "path",
    "edit": "path",
    "list": "path",
    "glob": "pattern",
    "grep": "pattern",
    "run": "command",
    "git": "op",
    "criteria": "action",
    "preview": "path",
}


def main_argument(name: str, args: dict[str, Any]) -> str:
    """The main argument's value of a call to ``name`` as text ("" when the tool is not in
    the table, or the argument is absent or not a string/number)."""
    key = MAIN_ARGUMENT.get(name)
    value = args.get(key) if key else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    return str(value).strip()


def label(name: str, args: dict[str, Any], limit: int = 80) -> str:
    """A call's label for a person: the tool name, then its main argument (cut at ``limit``
    characters) when it has one."""
    value = main_argument(name, args)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return f"{name} {value}" if value else name
