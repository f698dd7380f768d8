"""The summariser's prompt and the two shapes of summary request.

Transcript path (the default): ``[system: SUMMARISER_PROMPT, user: transcript]``, a cold
prompt the engine computes in full. Continuation path (``COMPACT_CONTINUATION``): the turn's
request exactly as it was sent, followed by one summary demand, so the engine computes only
the demand (the slot already holds the rest).

Both requests: the chat's endpoint (the lease's ``base_url``, an external preset's API
included), ``temperature: 0.2`` without the preset's sampling (no ``top_p``, ``top_k``,
``min_p``), ``stream: false``, ``max_tokens`` = :func:`~.rules.budget_tokens` of the window,
``chat_template_kwargs.enable_thinking: false`` on a local llama-server whose template knows
that switch (llama.cpp-only fields never go to an external API). ``tool_choice: "none"`` is
sent with the continuation request, which carries the turn's tools (the prompt must stay the
one the slot holds); the transcript request carries no tools at all, so nothing can be
called and no strict API refuses a ``tool_choice`` without ``tools``.
"""

from __future__ import annotations

import json
from typing import Any

from loki_shared.canonical import canonical_json
from loki_shared.messages.chat import ChatMessage

from ..project.snapshot import is_update
from ..request import join_content
from .rules import SUMMARY_KIND, excerpt, is_reminder, text_of

_KEEP = (
    "You write the memory of a conversation that is being compacted. Summarise the "
    "conversation you are given so the assistant can go on without it.\n"
    "Keep: the user's goals and requests, every decision taken, every constraint and "
    "preference stated, open questions, names, numbers and facts that matter later.\n"
)
_REST = (
    "In code work, also keep each file created or modified (path and purpose), the errors met "
    "and how they were solved, and the build and test commands.\n"
    "Write plain text, concise, in the conversation's language. Do not call any tool. Put the "
    "state of progress last: what is done, what is in progress, what comes next."
)

#: The summariser's instructions (frozen: tests compare requests to a copy, byte for byte).
SUMMARISER_PROMPT = (
    _KEEP + "Some long blocks were archived verbatim: they appear as an excerpt followed by "
    '"archived verbatim as recall:r<N>". Cite every such id exactly as recall:r<N> next to '
    "what it contains, so the assistant can bring the block back with recall(id).\n" + _REST
)

#: The instructions for a model whose template drops ``tools`` (probe: ``supports_tools``
#: False): it cannot call ``recall``, so no id is asked for (issue 16).
SUMMARISER_PROMPT_NO_TOOLS = (
    _KEEP + "Some long blocks were archived: they appear as an excerpt followed by "
    '"(archived verbatim)". Keep what their excerpt shows that matters.\n' + _REST
)

#: The user message of the transcript path: a header, then the transcript.
TRANSCRIPT_HEADER = "Conversation to summarise:\n\n"

#: The demand appended to the turn's request on the continuation path.
CONTINUATION_DEMAND = (
    "[Loki — compaction] Do not answer the last message and do not call any tool. Write the "
    "memory of this conversation from its start up to, but not including, message "
    "#{boundary} (a {role} message that starts with {start}); the last {kept} messages stay "
    "verbatim. Same rules as always: keep decisions, constraints, open questions, every "
    "recall:r<N> id next to what it holds ({archived}), in code work each file created or "
    "modified, the errors met and their fixes, the build and test commands. Plain text, "
    "concise, in the conversation's language; the state of progress at that message last."
)

#: The demand for a model whose template drops ``tools``: no recall id is asked for.
CONTINUATION_DEMAND_NO_TOOLS = (
    "[Loki — compaction] Do not answer the last message and do not call any tool. Write the "
    "memory of this conversation from its start up to, but not including, message "
    "#{boundary} (a {role} message that starts with {start}); the last {kept} messages stay "
    "verbatim. Same rules as always: keep decisions, constraints, open questions, in code "
    "work each file created or modified, the errors met and their fixes, the build and test "
    "commands. Plain text, concise, in the conversation's language; the state of progress "
    "at that message last."
)

#: Added to the demand when the request was sent tail first (COMPACT_TAIL_REUSE): the story
#: must stay chronological, the earlier summary first.
EARLIER_SUMMARY_FIRST = (
    " The earlier summary (in message #{at}) covers what came before message #1: start the "
    "memory with what it holds, then go on in order from message #1."
)


def head_of(message: ChatMessage) -> str:
    """How a transcript line names ``message``'s author: ``[tool <name>]`` for a tool
    result, ``[Loki note]`` for a reminder, ``[earlier summary]`` for a previous summary,
    else ``[<role>]``."""
    if message.loki and message.loki.injected == SUMMARY_KIND:
        return "[earlier summary]"
    if is_reminder(message):
        return "[Loki note]"
    if message.role == "tool":
        return f"[tool {message.name or 'result'}]"
    return f"[{message.role}]"


def render_transcript(
    torso: list[ChatMessage],
    ids: dict[tuple[int, str], str | None],
    big: set[tuple[int, str]],
    cite: bool = True,
) -> str:
    """The torso as text for the transcript path.

    Each message is ``[<role>]: <text>`` (``[tool <name>]`` for a tool result, ``[Loki
    note]`` for a reminder, ``[earlier summary]`` for a previous summary); a tool call is
    ``[assistant calls <name>]: <arguments>``. A big part (``(index, text)`` in ``big``) is
    replaced by its excerpt and id (``ids``; None when archiving failed; no id when ``cite``
    is False: :func:`~.rules.cites_ids`).
    """
    lines: list[str] = []
    for i, message in enumerate(torso):
        if is_update(message):  # PROJ_SNAPSHOT's update blocks: never the summariser's input
            continue
        text = text_of(message)
        if (i, text) in big:
            text = excerpt(text, ids.get((i, text)), cite)
        if text:
            lines.append(f"{head_of(message)}: {text}")
        for call in message.tool_calls or []:
            args = call.function.arguments
            if (i, args) in big:
                args = excerpt(args, ids.get((i, args)), cite)
            lines.append(f"[assistant calls {call.function.name}]: {args}")
    return "\n\n".join(lines)


def archived_line(ids: list[str]) -> str:
    """The demand's words listing the blocks archived from the summarised part (the demand is
    kept short: it is all the engine computes on this path)."""
    if not ids:
        return "none archived"
    return "archived: " + ", ".join(ids)


def thinking_kwargs(
    base: dict[str, Any] | None, local: bool, template_knows: bool
) -> dict[str, Any] | None:
    """``chat_template_kwargs`` of a summary request: the turn's, plus
    ``enable_thinking: false`` when the local template knows the switch; None for an
    external API (llama.cpp-only field)."""
    if not local:
        return None
    out = dict(base or {})
    if template_knows:
        out["enable_thinking"] = False
    return out or None


def transcript_messages(transcript: str, cite: bool = True) -> list[dict[str, Any]]:
    """The transcript path's ``messages``: the summariser's system prompt (``cite`` False:
    :data:`SUMMARISER_PROMPT_NO_TOOLS`) and the transcript as one user message."""
    prompt = SUMMARISER_PROMPT if cite else SUMMARISER_PROMPT_NO_TOOLS
    return [
        {"role": "system", "content": prompt},
        {"role": "user", "content": TRANSCRIPT_HEADER + transcript},
    ]


def transcript_request(
    *,
    transcript: str,
    model: str,
    budget: int,
    local: bool,
    id_slot: int | None,
    template_kwargs: dict[str, Any] | None,
    cite: bool = True,
) -> dict[str, Any]:
    """The transcript path's body (see the module docstring); ``cite`` False (the model's
    template drops ``tools``): :data:`SUMMARISER_PROMPT_NO_TOOLS`, which asks for no id."""
    body: dict[str, Any] = {
        "messages": transcript_messages(transcript, cite),
        "stream": False,
        "temperature": 0.2,
        "max_tokens": budget,
    }
    if model:
        body["model"] = model
    return _with_llama_fields(body, local, id_slot, template_kwargs)


_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "stream",
    "stream_options",
    "tool_choice",
    "chat_template_kwargs",
    "id_slot",
)


def continuation_request(
    sent: dict[str, Any],
    after: list[dict[str, Any]],
    demand: str,
    *,
    budget: int,
    local: bool,
    id_slot: int | None,
    template_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """The continuation path's body: ``sent`` (the turn's request as it was sent) with its
    messages followed by ``after`` (the model-view messages accepted since, as wire dicts)
    and the summary demand as one user message — joined to the last message when that is a
    user message, text or content parts (never two consecutive user messages). Sampling,
    streaming and ``tool_choice`` are replaced as for every summary request; ``tools`` stay
    (the prompt is the one the slot holds)."""
    body = {k: v for k, v in sent.items() if k not in _SAMPLING}
    messages = [dict(m) for m in sent["messages"]] + [dict(m) for m in after]
    if messages and messages[-1].get("role") == "user":
        # text or content parts (an image turn): the demand goes at its end either way
        messages[-1]["content"] = join_content(messages[-1].get("content") or "", demand)
    else:
        messages.append({"role": "user", "content": demand})
    body["messages"] = messages
    body["stream"] = False
    body["temperature"] = 0.2
    body["max_tokens"] = budget
    if body.get("tools"):
        body["tool_choice"] = "none"
    return _with_llama_fields(body, local, id_slot, template_kwargs)


def _with_llama_fields(
    body: dict[str, Any], local: bool, id_slot: int | None, template_kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    """``body`` with llama.cpp's own fields (``chat_template_kwargs``, ``id_slot``) when the
    engine is a local llama-server; never for an external API (it refuses unknown fields)."""
    if local:
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if id_slot is not None:
            body["id_slot"] = id_slot
    return body


def encode(body: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of a summary request (stable: same state, same bytes)."""
    return canonical_json(body)


def quote_start(text: str, n: int = 60) -> str:
    """The first ``n`` characters of a message, JSON-quoted (how the demand names it)."""
    return json.dumps(" ".join(text.split())[:n], ensure_ascii=False)
