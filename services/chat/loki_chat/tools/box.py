"""The tool box: the tools offered to the model, and the rules applied to every call.

Rules:

- Schemas: ``{"type": "function", "function": {"name", "description", "parameters"}}``; a
  tool without ``parameters`` gets ``{"type": "object", "properties": {}}``.
- Arguments that are not valid JSON (or not an object): the call is NOT executed; the
  history keeps ``{}`` as its arguments (templates re-parse them at every request) and the
  result tells the model exactly what to resend. Empty arguments are valid (``{}``).
- A result longer than ``tool_result_max`` characters (30,000) is cut in the model's view,
  with a note inviting a targeted call; the display log keeps the whole result.
- A tool's own failure (an exception) is a result the model sees, never a failed turn.
- A tool may return images with its text (:class:`ToolReturn`, ``see_image``): the turn
  loop shows them to the model in a user message after the step's results (this turn only).
- A ``conversational`` tool is called with the conversation id (the call's
  :class:`CallContext` ``conversation``; "" outside a turn) as a second argument.
- A tool that runs inside the turn (``run_call``, the ``subagent`` tool) gets the call's
  :class:`CallContext` (its id, the conversation, the turn's stop, the turn's event sink) and
  ends itself on a stop (``handles_stop``): the turn loop waits for its result instead of
  cancelling it, so the call still gets a result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loki_shared.messages.chat import ImageAttachment

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class ToolReturn:
    """A result with images: ``text`` for the tool message, ``images`` for the model to see
    in this turn, ``display`` fields added to the ``tool_result`` display event's ``loki``
    for the UI (never sent to the model: e.g. ``run``'s exit code and output)."""

    text: str
    images: list[ImageAttachment] = field(default_factory=list)
    display: dict[str, Any] = field(default_factory=dict)


ToolFn = Callable[..., Awaitable[str | ToolReturn]]


async def _no_emit(*args: Any, **kwargs: Any) -> None:
    """The event sink of a call made outside a turn: events go nowhere."""


@dataclass
class CallContext:
    """The turn a call runs in: ``call_id`` (the tool call's id), ``conversation`` (its id),
    ``stop`` (the turn's stop event), ``emit`` (the turn host's display-event sink,
    :meth:`loki_chat.actor.Actor.emit`) and ``vision`` (the step's endpoint sees images: a
    tool may then show some, :class:`ToolReturn`)."""

    call_id: str
    conversation: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    emit: Callable[..., Awaitable[Any]] = field(default=_no_emit)
    vision: bool = False


CallToolFn = Callable[[dict[str, Any], CallContext], Awaitable[str | ToolReturn]]


@dataclass
class ToolSpec:
    """One tool: ``run`` gets the decoded argument object (and the conversation id when
    ``conversational``) and returns the result text or a :class:`ToolReturn`;
    ``run_call``, when set, is used instead inside a turn and also gets the
    :class:`CallContext`; ``handles_stop``: the tool ends itself when the turn's stop fires
    (its result is awaited, not cancelled)."""

    name: str
    description: str
    run: ToolFn
    parameters: dict[str, Any] | None = None
    conversational: bool = False
    run_call: CallToolFn | None = None
    handles_stop: bool = False

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters or EMPTY_PARAMETERS,
            },
        }


@dataclass
class ToolOutcome:
    """``text``: the full result; ``executed``: whether the tool ran; ``arguments``: the
    arguments text to keep in the history (``{}`` when the model's were not valid JSON);
    ``images``: images the tool gives the model to see (:class:`ToolReturn`); ``display``:
    fields for the ``tool_result`` display event (:class:`ToolReturn`)."""

    text: str
    executed: bool
    arguments: str
    images: list[ImageAttachment] = field(default_factory=list)
    display: dict[str, Any] = field(default_factory=dict)


def parse_arguments(text: str) -> tuple[dict[str, Any] | None, str]:
    """Decode a call's arguments. Returns (object or None, error reason). Empty or blank
    text is ``{}`` (a tool without parameters)."""
    if not text.strip():
        return {}, ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"JSON error: {exc.msg} at character {exc.pos}"
    except ValueError as exc:  # valid syntax the decoder still refuses (a huge integer)
        return None, f"JSON error: {exc}"
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    return value, ""


def _example(spec: ToolSpec | None) -> str:
    if spec is None or not spec.parameters:
        return "{}"
    props = spec.parameters.get("properties") or {}
    sample = {k: f"<{(v or {}).get('type', 'value')}>" for k, v in props.items()}
    return json.dumps(sample, ensure_ascii=False)


class ToolBox:
    """The tools offered to the model, in a fixed order (the order of registration)."""

    def __init__(self, specs: list[ToolSpec] | None = None) -> None:
        self.specs: dict[str, ToolSpec] = {}
        for spec in specs or []:
            self.add(spec)

    def add(self, spec: ToolSpec) -> None:
        self.specs[spec.name] = spec

    def schemas(self) -> list[dict[str, Any]]:
        return [spec.schema() for spec in self.specs.values()]

    def without(self, *names: str) -> ToolBox:
        """A box of the same tools, in the same order, less ``names``."""
        return ToolBox([s for n, s in self.specs.items() if n not in names])

    def only(self, names: tuple[str, ...]) -> ToolBox:
        """A box of those of ``names`` this box holds, in this box's order."""
        return ToolBox([s for n, s in self.specs.items() if n in names])

    def handles_stop(self, name: str) -> bool:
        """Whether the tool ``name`` ends itself on a stop (see :class:`ToolSpec`)."""
        spec = self.specs.get(name)
        return spec is not None and spec.handles_stop

    async def execute(
        self, name: str, arguments: str, call: CallContext | None = None
    ) -> ToolOutcome:
        """Run one call by the rules above (``call``: the turn it runs in, given to a
        ``run_call`` tool; its ``conversation`` is what a conversational tool gets). Never
        raises for a tool's own failure."""
        spec = self.specs.get(name)
        args, reason = parse_arguments(arguments)
        if args is None:
            return ToolOutcome(
                text=(
                    f"Error: the arguments of this call to `{name}` are not valid JSON "
                    f"({reason}). The call was NOT executed. Send the call again with "
                    f"its arguments as one JSON object, for example {_example(spec)}."
                ),
                executed=False,
                arguments="{}",
            )
        if spec is None:
            known = ", ".join(self.specs) or "none"
            return ToolOutcome(
                text=f"Error: there is no tool named `{name}`. Tools: {known}.",
                executed=False,
                arguments=arguments,
            )
        images: list[ImageAttachment] = []
        display: dict[str, Any] = {}
        try:
            if spec.run_call is not None and call is not None:
                got = await spec.run_call(args, call)
            elif spec.conversational:
                got = await spec.run(args, call.conversation if call else "")
            else:
                got = await spec.run(args)
            if isinstance(got, ToolReturn):
                text, images, display = got.text, got.images, got.display
            else:
                text = got
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to see
            text = f"Error: the tool `{name}` failed: {exc}"
        return ToolOutcome(
            text=text, executed=True, arguments=arguments, images=images, display=display
        )


def cut_for_model(text: str, limit: int) -> str:
    """The model's view of a result: at most ``limit`` characters plus a note when cut."""
    if len(text) <= limit:
        return text
    return (
        text[:limit] + f"\n\n[Result cut at {limit} of {len(text)} characters. "
        "Make a more targeted call (a narrower query, a range or a part) to see the rest.]"
    )
