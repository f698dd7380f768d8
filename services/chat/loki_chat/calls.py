"""A step's tool calls: stored with the message that carries them, then run in index order.

Rules (tests named in docs/behaviour.md (chat, tools)): text written before a tool call is
stored once, in the message that carries the calls; invalid JSON arguments are stored as
``{}`` and not executed (:mod:`loki_chat.tools`); every call gets a result, even when the
turn is stopped ("Not executed: …"), so calls and results stay paired; a tool that ends
itself on a stop (``ToolBox.handles_stop``) keeps its own result; a tool's ``display`` fields
(:class:`~loki_chat.tools.box.ToolReturn`) join its ``tool_result`` event (the UI's), never
the model's view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from loki_shared.messages.chat import ChatMessage, ImageAttachment, ToolCall, ToolCallFunction

from .replies import accept_message
from .tools import ToolOutcome, cut_for_model, label, parse_arguments
from .tools.box import CallContext

if TYPE_CHECKING:
    from .turn import TurnRunner

STOPPED_TEXT = "Not executed: the user stopped the turn."


async def accept_calls(run: TurnRunner, content: str, calls: list[tuple[str, str, str]]) -> None:
    """Store the assistant message with ``content`` and ``calls`` (``(id, name, arguments)``;
    a missing id is made from the message count) and keep them for :func:`run_calls`."""
    stored: list[ToolCall] = []
    for n, (call_id, name, args) in enumerate(calls):
        call_id = call_id or f"call_{len(run.conv.messages)}_{n}"
        parsed, _ = parse_arguments(args)
        stored.append(
            ToolCall(
                id=call_id,
                function=ToolCallFunction(
                    name=name, arguments=args if parsed is not None else "{}"
                ),
            )
        )
    run.pending_calls = stored
    run.pending_raw = {c.id: a for c, (_, _, a) in zip(stored, calls, strict=True)}
    accept_message(run, ChatMessage(role="assistant", content=content or None, tool_calls=stored))
    await run.host.persist()


async def run_calls(run: TurnRunner) -> list[ImageAttachment]:
    """Run the pending calls in order, append one ``tool`` message each and emit its
    ``tool_result`` event; sets ``run.outcome.stopped`` on a stop. Returns the images the
    tools gave (``see_image``)."""
    host = run.host
    seen: list[ImageAttachment] = []
    for call in run.pending_calls:
        text = STOPPED_TEXT
        display: dict[str, Any] = {}
        raw_args = run.pending_raw.get(call.id, call.function.arguments)
        if not host.stop.is_set():
            name = call.function.name
            context = CallContext(call.id, run.conv.id, host.stop, host.emit, run.vision)
            running = host.toolbox.execute(name, raw_args, context)
            if host.toolbox.handles_stop(name):  # it ends itself: its result is kept
                outcome: ToolOutcome | None = await running
            else:
                outcome = await wait_or_stop(running, host.stop)
            if outcome is not None:
                text = outcome.text
                seen += outcome.images
                display = outcome.display
        if text is STOPPED_TEXT or host.stop.is_set():
            run.outcome.stopped = True
        model_text = cut_for_model(text, run.settings.tool_result_max)
        run.conv.messages.append(
            ChatMessage(
                role="tool", tool_call_id=call.id, name=call.function.name, content=model_text
            )
        )
        await host.emit(
            {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": text},
            loki={
                "event": "tool_result",
                "label": label(call.function.name, parse_arguments(raw_args)[0] or {}),
                **display,
            },
        )
    run.pending_calls = []
    return seen


async def wait_or_stop(coro: Awaitable[Any], stop: asyncio.Event) -> Any:
    """Await ``coro`` unless ``stop`` fires first (then cancel it and return None)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - cancelled on purpose: its outcome is not wanted
        pass
    return None
