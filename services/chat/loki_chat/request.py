"""Building the exact request sent to the engine.

Rules:

- OpenAI ``/v1/chat/completions`` body with ``stream: true`` and
  ``stream_options: {"include_usage": true}`` (llama-server then sends a final chunk with
  ``usage`` and ``timings``).
- Serialised with :func:`loki_shared.canonical.canonical_json`: the same conversation state
  always gives the same bytes (prefix stability, the basis of llama.cpp's prompt-cache reuse);
  nothing volatile (clock, ids made per request) is added anywhere.
- llama.cpp-only fields (``id_slot``, ``chat_template_kwargs``, ``top_k``, ``min_p``) go to a
  local llama-server only; a strict external OpenAI-compatible API answers 400 to unknown
  fields.
- Loki's marks (``loki``, ``reasoning_model``) never leave the service. ``reasoning_content``
  is sent back only with ``REASONING_ECHO``, to the model that wrote it, on the local engine,
  and only on a message with text or tool calls.
- ``max_tokens`` (the cap on one step): ``LOKI_MAX_TOKENS`` when set, else the lease's (the
  preset's cap: by default a quarter of the window on a local engine, none for an external
  preset). A stored conversation whose last message is an assistant message is continued
  by llama-server (assistant prefill): that is how Continue resumes a cut reply.
- What is sent never holds two consecutive ``user`` messages (strict-alternation templates
  reject them): consecutive ones are merged into one, and an ephemeral instruction is put at
  the end of the last message instead of after it.

Where later additions go: a block given once at the head of the conversation (a project
context) is joined at the head of the first user message in :func:`wire_messages`, so the
system message stays byte-identical; how one stored message is written on the wire (image
parts among its content parts) is :func:`wire_message`; a request of another kind (subagent,
verify, task, prewarm) is built by these same functions and leased with its kind
(:meth:`loki_chat.leases.EngineLeases.lease`).
"""

from __future__ import annotations

from typing import Any

from loki_shared.canonical import canonical_json
from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease

from .images import wire_parts
from .settings import Settings


def wire_messages(
    system_prompt: str,
    messages: list[ChatMessage],
    *,
    echo_model: str | None = None,
    suffix: str | None = None,
    head: str | None = None,
) -> list[dict[str, Any]]:
    """The ``messages`` array sent to the engine.

    Args:
        system_prompt: the fixed system message (first).
        messages: the model view (without the system message).
        echo_model: send ``reasoning_content`` back on messages written by this model (None:
            never).
        suffix: an ephemeral instruction appended to the last message's text (never stored).
        head: the project block, joined at the head of the first user message (never
            stored there; None or "": the request is exactly as without projects).
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
    for message in messages:
        item = wire_message(message, echo_model=echo_model)
        prev = out[-1]
        if item["role"] == "user" and prev["role"] == "user" and len(out) > 1:
            prev["content"] = join_content(prev["content"], item["content"])
            continue
        out.append(item)
    if head:
        for item in out[1:]:
            if item["role"] == "user":
                item["content"] = join_content(head, item["content"])
                break
    if suffix:
        out[-1]["content"] = join_content(out[-1].get("content") or "", suffix)
    return out


def wire_message(message: ChatMessage, *, echo_model: str | None = None) -> dict[str, Any]:
    """One stored message as the engine gets it: OpenAI fields only (``role``, ``content``
    — text or content parts as stored —, ``tool_calls``, ``tool_call_id``), Loki's marks
    left out; ``reasoning_content`` only by the echo rule (see the module docstring)."""
    item: dict[str, Any] = {"role": message.role}
    if message.role == "assistant":
        item["content"] = message.content if message.content is not None else ""
        if message.tool_calls:
            item["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
        if (
            echo_model
            and message.reasoning_content
            and message.reasoning_model == echo_model
            and (message.content or message.tool_calls)
        ):
            item["reasoning_content"] = message.reasoning_content
    elif message.role == "tool":
        item["content"] = message.content if message.content is not None else ""
        item["tool_call_id"] = message.tool_call_id or ""
    else:
        content = message.content if message.content is not None else ""
        item["content"] = wire_parts(content) if isinstance(content, list) else content
    return item


def join_content(a: Any, b: Any) -> Any:
    """Message content ``b`` put at the end of content ``a`` (one message, never two user
    messages in a row): two texts joined by a blank line (``b`` alone when ``a`` is empty);
    otherwise content parts, a text becoming one ``text`` part."""
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n\n{b}" if a else b
    parts_a = a if isinstance(a, list) else [{"type": "text", "text": a}]
    parts_b = b if isinstance(b, list) else [{"type": "text", "text": b}]
    return parts_a + parts_b


def build_payload(
    settings: Settings,
    lease: Lease,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    tool_choice: str | None = None,
) -> dict[str, Any]:
    """The request body as a dict (see the module rules). ``tools`` None or empty: no
    ``tools`` key (the no-tools fallback)."""
    payload: dict[str, Any] = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if lease.model:
        payload["model"] = lease.model
    if tools:
        payload["tools"] = tools
        if tool_choice:
            payload["tool_choice"] = tool_choice
    if settings.temperature is not None:
        payload["temperature"] = settings.temperature
    if settings.top_p is not None:
        payload["top_p"] = settings.top_p
    max_tokens = settings.max_tokens if settings.max_tokens is not None else lease.max_tokens
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    if not lease.external:
        if settings.top_k is not None:
            payload["top_k"] = settings.top_k
        if settings.min_p is not None:
            payload["min_p"] = settings.min_p
        if settings.chat_template_kwargs:
            payload["chat_template_kwargs"] = settings.chat_template_kwargs
        if lease.id_slot is not None:
            payload["id_slot"] = lease.id_slot
    return payload


def encode(payload: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of the body."""
    return canonical_json(payload)
