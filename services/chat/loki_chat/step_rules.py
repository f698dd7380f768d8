"""The turn loop's rules for one step, as pure functions of what the lease and the turn say.

Each takes plain values (the settings, the lease's template probe, the turn's counters) and
returns a verdict; :class:`loki_chat.turn.TurnRunner` asks them before each request and at
the turn's end. Rules (tests named in docs/behaviour.md (chat)):

- Tools: none in the no-tools fallback, none to a template that drops them (the lease's
  probe says ``supports_tools`` false), ``see_image`` only to an endpoint that sees images.
- REASONING_ECHO: only with the key on, a local engine, and a template that renders
  ``reasoning_content`` (or was not probed).
- NUDGE_IN_TOOL: the budget reminder in the last tool result only with the key on, a local
  engine whose template keeps a stable prefix, and a last message that is a tool result
  with text.
- The verifier checks a main turn's final text answer ended by ``stop``, once, never a
  Continue.
- A side job's request is its last (``job_done`` on its release) when no tool call came
  back or the step budget is spent.
- PROJ_SNAPSHOT's engine key (its ``model`` retake reason): the lease's endpoint and model;
  with several engines (a lease with a ``placement``, issue 44) the model alone.
"""

from __future__ import annotations

from typing import Any

from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease, TemplateProbe

from .engine import StepResult
from .settings import Settings
from .tools.vision import NAME as SEE_IMAGE
from .verify import verify_enabled

#: Tools offered only when the lease's endpoint sees images.
VISION_TOOLS = frozenset({SEE_IMAGE})


def tools_dropped(template: TemplateProbe | None) -> bool:
    """The lease's template probe says the template ignores ``tools``."""
    return template is not None and template.supports_tools is False


def prefix_unstable(template: TemplateProbe | None) -> bool:
    """The lease's template probe says the template does not keep a stable prefix
    (``stable_prefix`` False): cache losses on it are the template's (issue 16)."""
    return template is not None and template.stable_prefix is False


def echo_reasoning(settings: Settings, external: bool, template: TemplateProbe | None) -> bool:
    """REASONING_ECHO applies to this step: the key is on, the engine is local, and its
    template renders ``reasoning_content`` (or was not probed)."""
    return (
        settings.reasoning_echo
        and not external
        and not (template is not None and template.renders_reasoning is False)
    )


def offered_tools(
    schemas: list[dict[str, Any]] | None,
    *,
    mode: str,
    template: TemplateProbe | None,
    vision: bool,
) -> list[dict[str, Any]] | None:
    """The tool schemas offered to the next step (None: no ``tools`` key): the tool box's
    ``schemas``, none in the no-tools fallback (``mode`` ``no_tools``), none to a model whose
    chat template drops them (sending them would only waste tokens the model never sees),
    ``see_image`` only when ``vision``. Every rule that takes tools away for a step or a
    model belongs here."""
    if mode == "no_tools" or tools_dropped(template):
        return None
    if schemas is not None and not vision:
        schemas = [s for s in schemas if s["function"]["name"] not in VISION_TOOLS]
    return schemas


def nudge_fits(
    settings: Settings,
    external: bool,
    template: TemplateProbe | None,
    messages: list[ChatMessage],
) -> bool:
    """NUDGE_IN_TOOL may put the budget reminder in the last tool result: the key is on,
    the engine is local, its template keeps a stable prefix (probe), and the last message
    is a tool result with text (any other shape: the separate message)."""
    last = messages[-1] if messages else None
    return bool(
        settings.nudge_in_tool
        and not external
        and template is not None
        and template.stable_prefix is True
        and last is not None
        and last.role == "tool"
        and isinstance(last.content, str)
    )


def should_verify(
    settings: Settings,
    *,
    kind: str,
    verified: bool,
    continued: bool,
    finish_reason: str | None,
    preset_verify: bool | None,
) -> bool:
    """The verifier checks this answer: a main turn's (``kind``) final text answer ended by
    ``stop`` (not a Continue), not yet ``verified``, the verifier on (the preset's VERIFY,
    ``preset_verify``, else ``LOKI_VERIFY``)."""
    return (
        kind == "main"
        and not verified
        and not continued
        and finish_reason == "stop"
        and verify_enabled(settings, preset_verify)
    )


def last_side_request(result: StepResult | None, steps: int, step_budget: int) -> bool:
    """A side job's request is its last one (``job_done`` on its release): no tool call
    came back (native or written as text), or ``steps`` reached ``step_budget``."""
    acc = result.acc if result else None
    calls = bool(acc and (acc.ordered_calls() or "<tool_call>" in acc.content))
    return not calls or steps >= step_budget


def snapshot_engine(lease: Lease) -> str:
    """What a PROJ_SNAPSHOT is taken for (:func:`loki_chat.project.snapshot.retake_reason`'s
    ``model``: a change retakes it, the engine's cache being cold anyway): ``base_url|model``;
    with several engines (the lease has a ``placement``, issue 44) ``pool|model``, so a
    conversation moved to another engine of the same model keeps its snapshot — its slot may
    come back from a slot file, whose prefix a retake would throw away."""
    if lease.placement is not None:
        return f"pool|{lease.model}"
    return f"{lease.base_url}|{lease.model}"
