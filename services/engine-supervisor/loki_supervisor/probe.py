"""The chat template probe: what the engine's template really does with tools, reasoning,
prefixes and consecutive user messages, found by rendering small conversations through
llama-server's ``POST /apply-template`` (llama.cpp server: ``{"messages", "tools", ...}`` →
``{"prompt": <the rendered text>}``; nothing is generated, no slot is used).

Why: Loki's cache discipline and its tools assume things that differ from template to
template. SmolLM2's template, for one, drops the ``tools`` list without a word (llama.cpp
issue #27129 reports the same kind), so the model never sees ``recall``. The verdicts
(:class:`~loki_shared.messages.engine.TemplateProbe`) are computed once per template text
(:class:`ProbeCache`, keyed by its sha256) when the engine becomes ready.

The probe conversations use fixed, unlikely marker strings, so a verdict is a plain
substring or prefix test on the rendered text.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import httpx

from loki_shared.messages.engine import TemplateProbe

log = logging.getLogger(__name__)

#: The probe's markers: unlikely enough never to be written by a template itself.
TOOL_NAME = "loki_probe_tool"
TOOL_DESCRIPTION = "Loki probe marker 7f3a tool description."
REASONING = "Loki probe marker 9c1e reasoning."
SYSTEM = "Loki probe system."
USER_1 = "Loki probe first user message."
ASSISTANT_1 = "Loki probe first answer."
USER_2 = "Loki probe second user message."
TOOL_RESULT = "Loki probe tool result."

PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {"type": "object", "properties": {}},
        },
    }
]

_S = {"role": "system", "content": SYSTEM}
_U1 = {"role": "user", "content": USER_1}
_A1 = {"role": "assistant", "content": ASSISTANT_1}
_U2 = {"role": "user", "content": USER_2}
_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_probe0",
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": "{}"},
        }
    ],
}
_RESULT = {"role": "tool", "tool_call_id": "call_probe0", "content": TOOL_RESULT}

#: What a person reads in the engine panel for each verdict that changes Loki's behaviour.
NOTE_NO_TOOLS = "this model's template ignores tools: recall is off for it"
NOTE_NO_REASONING = (
    "this model's template does not render reasoning_content: REASONING_ECHO sends none"
)
NOTE_UNSTABLE = (
    "this model's template re-renders earlier turns: the prompt cache is lost between "
    "requests (cause: template)"
)
NOTE_STRICT = "this model's template refuses two user messages in a row"
NOTE_CAPS = "/props chat_template_caps says supports_tools={caps}, the rendering says {seen}"


def template_hash(template: str | None) -> str:
    """sha256 (hex) of the template text (``""`` hashes the missing template)."""
    return hashlib.sha256((template or "").encode("utf-8")).hexdigest()


class RenderError(Exception):
    """``/apply-template`` refused a conversation (the template raised, or the server
    answered non-200); ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def render(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str | None,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt llama-server would build for ``messages`` (``POST /apply-template``).

    Raises:
        RenderError: a non-200 answer (a template that raises answers 4xx/5xx with the
            exception's text) or no ``prompt`` string in the body.
        httpx.HTTPError: the engine is unreachable.
    """
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools:
        body["tools"] = tools
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = await client.post(f"{base_url}/apply-template", json=body, headers=headers)
    if r.status_code != 200:
        raise RenderError(r.status_code, r.text[:300])
    try:
        prompt = r.json().get("prompt")
    except (ValueError, AttributeError) as exc:
        raise RenderError(r.status_code, f"unreadable answer: {exc}") from exc
    if not isinstance(prompt, str):
        raise RenderError(r.status_code, "no prompt in the answer")
    return prompt


async def probe_template(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str | None,
    *,
    template: str | None,
    model: str = "",
    caps: dict[str, Any] | None = None,
) -> TemplateProbe:
    """Render the probe conversations and return the verdicts (see
    :class:`~loki_shared.messages.engine.TemplateProbe` for what each one means).

    Args:
        client: an HTTP client (its timeout bounds each rendering).
        base_url: the engine's root (``http://127.0.0.1:8091``, no ``/v1``).
        api_key: the engine's key, or None.
        template: ``/props`` ``chat_template`` (hashed into ``template_hash``).
        model: the model id, recorded with the verdicts.
        caps: ``/props`` ``chat_template_caps`` when the build reports it.

    Never raises for a template's behaviour; an engine that does not answer
    ``/apply-template`` at all (an older build, a proxy) gives a probe with ``error`` set
    and every verdict None.
    """
    out = TemplateProbe(template_hash=template_hash(template), model=model)
    caps_tools = (caps or {}).get("supports_tools")
    out.caps_supports_tools = caps_tools if isinstance(caps_tools, bool) else None

    async def r(messages: list[dict[str, Any]], **kw: Any) -> str | None:
        try:
            return await render(client, base_url, api_key, messages, **kw)
        except RenderError:
            return None

    try:
        base = await render(client, base_url, api_key, [_S, _U1])
    except RenderError as exc:
        out.error = f"/apply-template refused a plain conversation ({exc.status}): {exc}"
        return out
    except httpx.HTTPError as exc:
        out.error = f"/apply-template unreachable: {exc.__class__.__name__}"
        return out

    # supports_tools: the tool's name and description are rendered
    with_tools = await r([_S, _U1], tools=PROBE_TOOLS)
    if with_tools is not None:
        out.supports_tools = TOOL_NAME in with_tools and TOOL_DESCRIPTION in with_tools
    if out.supports_tools is False:
        out.notes.append(NOTE_NO_TOOLS)
    if out.caps_supports_tools is not None and out.supports_tools is not None:
        if out.caps_supports_tools != out.supports_tools:
            out.notes.append(
                NOTE_CAPS.format(caps=out.caps_supports_tools, seen=out.supports_tools)
            )

    # renders_reasoning: an earlier assistant message's reasoning_content in a later request
    later = await r([_S, _U1, {**_A1, "reasoning_content": REASONING}, _U2])
    if later is not None:
        out.renders_reasoning = REASONING in later
        if not out.renders_reasoning:
            out.notes.append(NOTE_NO_REASONING)

    # stable_prefix: every rendering starts with the rendering of the shorter conversation
    out.stable_prefix = await _stable_prefix(r, base, out.supports_tools)
    if out.stable_prefix is False:
        out.notes.append(NOTE_UNSTABLE)

    # strict_alternation: two user messages in a row raise
    try:
        await render(client, base_url, api_key, [_S, _U1, _U2])
        out.strict_alternation = False
    except RenderError:
        out.strict_alternation = True
        out.notes.append(NOTE_STRICT)
    except httpx.HTTPError:
        out.strict_alternation = None
    return out


async def _stable_prefix(r: Any, base: str, supports_tools: bool | None) -> bool | None:
    """The prefix checks (see :func:`probe_template`); None when a rendering failed.

    ``base`` is [S, U1] with its generation prompt: what the engine cached before the
    answer. llama-server renders a conversation that ends with an assistant message as a
    prefill (the generation prompt, then that message's text, no end of turn), which is
    what the engine holds once it has answered; so [S, U1, A1] must start with ``base``,
    and the next request [S, U1, A1, U2] with [S, U1, A1]. With tools rendered, an
    assistant's tool call followed by its result must start with the call alone.
    """
    closed = await r([_S, _U1, _A1], add_generation_prompt=False)
    follow = await r([_S, _U1, _A1, _U2])
    if closed is None or follow is None:
        return None
    if not (closed.startswith(base) and follow.startswith(base) and follow.startswith(closed)):
        return False
    if not supports_tools:
        return True  # no tool is ever sent: a tool result never happens on this template
    call = await r([_S, _U1, _CALL], tools=PROBE_TOOLS, add_generation_prompt=False)
    result = await r([_S, _U1, _CALL, _RESULT], tools=PROBE_TOOLS)
    if call is None or result is None:
        return None
    return result.startswith(call)


class ProbeCache:
    """Probe verdicts by template hash (and model), kept for the supervisor's lifetime: a
    restarted engine with the same template is not probed again."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], TemplateProbe] = {}

    async def get(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        api_key: str | None,
        *,
        template: str | None,
        model: str,
        caps: dict[str, Any] | None,
    ) -> TemplateProbe:
        """The cached verdicts for (template, model), probing once on a miss; a probe that
        could not run (``error`` set) is not cached, so the next ready engine tries again."""
        key = (template_hash(template), model)
        hit = self._by_key.get(key)
        if hit is not None:
            return hit
        found = await probe_template(
            client, base_url, api_key, template=template, model=model, caps=caps
        )
        if found.error is None:
            self._by_key[key] = found
            log.info(
                "chat template %s of %s: supports_tools=%s renders_reasoning=%s "
                "stable_prefix=%s strict_alternation=%s%s",
                found.template_hash[:12],
                model or "the model",
                found.supports_tools,
                found.renders_reasoning,
                found.stable_prefix,
                found.strict_alternation,
                "".join(f"; {n}" for n in found.notes),
            )
        else:
            log.warning("chat template probe failed: %s", found.error)
        return found
