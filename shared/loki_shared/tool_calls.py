"""The one assembler of streamed tool calls (``choices[].delta.tool_calls[]`` fragments).

OpenAI and llama-server send each call's first fragment with ``index``, ``id``, ``type`` and
``function.name`` (and maybe the start of ``function.arguments``), then fragments with the same
``index`` carrying only argument suffixes. Other servers differ, and the rules below take them
all:

- a fragment goes to the call opened at its ``index``;
- a fragment without ``index`` continues the current call (the last one a fragment went to);
- a fragment whose ``id`` differs from the id of the call at its ``index`` opens a NEW call:
  some servers send every call at ``index`` 0 (ollama #15457), and joining their arguments
  would make one malformed call out of two good ones;
- ``function.name`` sent again replaces the name (some servers repeat it), never appends;
- ``function.arguments`` text is appended; ``arguments`` given as a JSON object (some servers
  send the parsed object) is the whole arguments: serialised once to JSON text, replacing
  what was there, never appended to it nor serialised twice.

- any other field of a fragment, or of its ``function`` (a server's own, such as a thought
  signature), is kept on the call as it came, merged fragment after fragment by
  :func:`loki_shared.stream_fields.merge` (lists appended, objects merged, a value replaced),
  and given back by :meth:`ToolCall.as_openai`: an assembled answer keeps what the stream
  carried.

Calls come out ordered by ``index``, then by the order they were opened (two calls sharing
an index keep the order they arrived in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .stream_fields import merge

_CALL_KEYS = frozenset({"index", "id", "type", "function"})
_FUNCTION_KEYS = frozenset({"name", "arguments"})


@dataclass(slots=True)
class ToolCall:
    """One call being assembled.

    Attributes:
        index: the ``index`` it was opened at (for a call opened without one: one past the
            highest index seen).
        position: the order it was opened in (0, 1, ...): distinct for every call, even
            when two share an ``index``.
        id, name, arguments: OpenAI's ``id``, ``function.name`` and ``function.arguments``
            (JSON text as the model wrote it, maybe malformed: the caller checks it).
        extra, function_extra: the other fields of the call and of its ``function``, as the
            stream carried them.
    """

    index: int
    position: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    function_extra: dict[str, Any] = field(default_factory=dict)

    def as_openai(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls[]`` item (``id`` None when the
        server sent none), with the fields the stream carried beside OpenAI's."""
        out: dict[str, Any] = {
            "id": self.id or None,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments, **self.function_extra},
        }
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


class ToolCallAssembler:
    """Assembles the fragments of one streamed message (see the module docstring)."""

    __slots__ = ("_at", "_calls", "_current")

    def __init__(self) -> None:
        self._calls: list[ToolCall] = []
        self._at: dict[int, ToolCall] = {}
        self._current: ToolCall | None = None

    def __bool__(self) -> bool:
        return bool(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, fragment: Any) -> dict[str, Any] | None:
        """Apply one ``tool_calls[]`` fragment.

        Returns the fragment as applied, for display: ``{"index": <the call's position>,
        "id"?, "type"?, "function": {"name"?, "arguments"?}}`` (the position, so two calls
        that share an ``index`` stay apart), or None when ``fragment`` is not an object.
        """
        if not isinstance(fragment, dict):
            return None
        index = fragment.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            index = None
        new_id = fragment.get("id")
        if not isinstance(new_id, str) or not new_id:
            new_id = None
        call = self._current if index is None else self._at.get(index)
        if call is None or (new_id is not None and call.id and call.id != new_id):
            if index is None:
                index = call.index if call is not None else self._next_index()
            call = ToolCall(index=index, position=len(self._calls))
            self._calls.append(call)
            self._at[index] = call
        self._current = call
        shown: dict[str, Any] = {"index": call.position}
        if new_id is not None:
            call.id = new_id
            shown["id"] = new_id
            shown["type"] = "function"
        for key, value in fragment.items():
            if key not in _CALL_KEYS:
                call.extra[key] = merge(call.extra.get(key), value, join_text=False)
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        for key, value in function.items():
            if key not in _FUNCTION_KEYS:
                call.function_extra[key] = merge(call.function_extra.get(key), value, False)
        fn_shown: dict[str, Any] = {}
        name = function.get("name")
        if isinstance(name, str) and name:
            call.name = name
            fn_shown["name"] = name
        args = function.get("arguments")
        if isinstance(args, str):
            if args:
                call.arguments += args
                fn_shown["arguments"] = args
        elif isinstance(args, (dict, list)):
            call.arguments = json.dumps(args, ensure_ascii=False)
            fn_shown["arguments"] = call.arguments
        shown["function"] = fn_shown
        return shown

    def add_all(self, fragments: Any) -> list[dict[str, Any]]:
        """Apply a delta's ``tool_calls`` list (anything else is ignored); return the
        applied fragments (see :meth:`add`)."""
        if not isinstance(fragments, list):
            return []
        out = []
        for fragment in fragments:
            shown = self.add(fragment)
            if shown is not None:
                out.append(shown)
        return out

    def _next_index(self) -> int:
        return max(self._at, default=-1) + 1

    @property
    def calls(self) -> list[ToolCall]:
        """The calls, ordered by ``index`` then by opening order."""
        return sorted(self._calls, key=lambda c: (c.index, c.position))

    def as_openai(self) -> list[dict[str, Any]]:
        """The calls as an assistant message's ``tool_calls`` (see :meth:`ToolCall.as_openai`)."""
        return [call.as_openai() for call in self.calls]


__all__ = ["ToolCall", "ToolCallAssembler"]
