"""Builders of chat messages for tests: ``U`` (user), ``A`` (assistant, with tool calls) and
``T`` (tool result), the shapes the compaction tests write transcripts in."""

from __future__ import annotations

from loki_shared.messages.chat import ChatMessage, LokiMeta, ToolCall, ToolCallFunction


def U(text: str, injected: str | None = None) -> ChatMessage:
    """A user message; ``injected`` marks one Loki wrote (``loki.injected``: "summary",
    "act", ...)."""
    return ChatMessage(
        role="user", content=text, loki=LokiMeta(injected=injected) if injected else None
    )


def A(text: str | None = None, calls: list[tuple[str, str, str]] | None = None) -> ChatMessage:
    """An assistant message: ``text`` and the tool calls ``calls`` as (id, name, arguments
    JSON) triples."""
    return ChatMessage(
        role="assistant",
        content=text,
        tool_calls=[
            ToolCall(id=i, function=ToolCallFunction(name=n, arguments=a)) for i, n, a in calls
        ]
        if calls
        else None,
    )


def T(call_id: str, text: str, name: str = "read") -> ChatMessage:
    """The tool ``name``'s result ``text`` for the call ``call_id``."""
    return ChatMessage(role="tool", tool_call_id=call_id, name=name, content=text)
