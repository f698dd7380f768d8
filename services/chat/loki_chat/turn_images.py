"""A turn's images: the content of a message that carries them, the view the next request
sends, their measured cost, and the images a tool shows.

Rules: the ephemeral rule (:mod:`loki_chat.images`: data URLs, seen in the turn they arrive,
markers at its end); with KEEP_TURN_IMAGES (``LOKI_KEEP_TURN_IMAGES``, off by default:
:mod:`loki_chat.kept_images`) a main turn's images are references resolved before each
request and measured after the first request that sends them. Off, the requests are
byte-identical to before (frozen copy in tests/chat/test_chat_images.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from loki_shared.messages.chat import ChatMessage, ImageAttachment, LokiMeta

from .images import user_content
from .tokens import TokenCounts

if TYPE_CHECKING:
    from .turn import TurnRunner

log = logging.getLogger("loki.chat.turn")


def image_content(run: TurnRunner, text: str, images: list[ImageAttachment]) -> Any:
    """A user message's content with this turn's images: data URLs (the ephemeral rule), or
    references with KEEP_TURN_IMAGES."""
    if run.kept is not None:
        return run.kept.content(text, images)
    return user_content(text, images)


async def model_view(run: TurnRunner) -> list[ChatMessage]:
    """The messages the next request sends: the stored ones, with KEEP_TURN_IMAGES'
    references resolved for this step's lease (a kept image that cannot be sent becomes its
    marker now: the meter's measure no longer holds)."""
    conv = run.conv
    if run.kept is None:
        return conv.messages
    view, changed = await run.kept.wire_view(conv.messages, run.host.shelf_images, run.vision)
    if changed:
        log.info("[images] %s: no longer kept: %s", conv.id, run.kept.dropped)
        conv.meter.invalidate()
        await run.host.persist()
    return view


async def measure_images(run: TurnRunner, payload: dict[str, Any]) -> None:
    """KEEP_TURN_IMAGES: the cost of the images this step sent first (measured by the engine;
    :meth:`loki_chat.kept_images.KeptImages.measure`)."""
    if run.kept is None or not run.kept.new or run.result is None:
        return
    counter = run.conv.meter.counter
    count = counter.text_prompt_tokens if isinstance(counter, TokenCounts) else None
    cost = await run.kept.measure(run.conv.messages, payload, run.result.acc.usage, count)
    log.info("[images] %s: measured cost %s tokens an image", run.conv.id, cost)


async def show_images(run: TurnRunner, images: list[ImageAttachment]) -> None:
    """Images a tool gave (``see_image``): one user message after the step's results, marked
    ``injected="see_image"``; the ephemeral rule removes them at the turn's end."""
    text = f"[see_image] {', '.join(i.name for i in images)}"
    run.conv.messages.append(
        ChatMessage(
            role="user",
            content=image_content(run, text, images),
            loki=LokiMeta(injected="see_image"),
        )
    )
    await run.host.emit(
        {"role": "user", "content": text},
        loki={
            "event": "see_image",
            "injected": "see_image",
            "images": [{"id": i.id, "name": i.name} for i in images],
        },
    )
