"""Images in the model view: they arrive with a user message, are seen in that turn, and
leave the history afterwards (the ephemeral rule).

Rules:

- A queued user message is its text (``str``), or ``{"text", "images": [{"id", "name",
  "url"}]}`` when images came with it (:func:`pending_item`, :func:`unpack`).
- In the turn it arrives an image is an OpenAI ``image_url`` part (a data URL) of its user
  message, after the text part (:func:`user_content`); every step of that turn sends it.
- When the turn ends, and at the start of every turn (a turn a crash left open), every image
  part of the history is replaced by a fixed text (:func:`marker`): the image's name and
  "no longer visible". The text is the same every time it is written, so the requests of
  later turns have a stable prefix from that message on (:func:`forget_images`).
- With KEEP_TURN_IMAGES (off by default) images may stay past their turn, by reference:
  :mod:`loki_chat.kept_images`; the marker and the text a message becomes are the same.
"""

from __future__ import annotations

from typing import Any

from loki_shared.messages.chat import ChatMessage, ImageAttachment

#: A queued user message: its text, or ``{"text", "images"}``.
PendingItem = str | dict[str, Any]


def marker(name: str) -> str:
    """The text that replaces an image once its turn is over (stable: name only)."""
    return f"[image {name}: no longer visible]"


def pending_item(text: str, images: list[ImageAttachment]) -> PendingItem:
    """The queue entry of a user message (plain text when it has no image)."""
    if not images:
        return text
    return {"text": text, "images": [i.model_dump() for i in images]}


def unpack(item: PendingItem) -> tuple[str, list[ImageAttachment]]:
    """The text and images of a queue entry."""
    if isinstance(item, str):
        return item, []
    images = [ImageAttachment.model_validate(i) for i in item.get("images") or []]
    return str(item.get("text") or ""), images


def image_part(image: ImageAttachment) -> dict[str, Any]:
    """One OpenAI ``image_url`` content part; ``loki_name`` is Loki's mark (the file name,
    kept to write the marker) and is removed before sending (:func:`wire_parts`)."""
    return {"type": "image_url", "image_url": {"url": image.url}, "loki_name": image.name}


def user_content(text: str, images: list[ImageAttachment]) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or a text part then one image part per image."""
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + [image_part(i) for i in images]


def wire_parts(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content parts as the engine gets them: Loki's marks (``loki_*`` keys) left out."""
    return [{k: v for k, v in p.items() if not k.startswith("loki_")} for p in content]


def has_image(message: ChatMessage) -> bool:
    """Whether the message holds an image part."""
    content = message.content
    return isinstance(content, list) and any(p.get("type") == "image_url" for p in content)


def forget_images(messages: list[ChatMessage]) -> int:
    """Replace every image part of ``messages`` by its marker, in place: the message becomes
    text again (its text parts and markers joined by blank lines). Returns how many images
    were replaced."""
    count = 0
    for message in messages:
        if not has_image(message):
            continue
        assert isinstance(message.content, list)
        texts: list[str] = []
        for part in message.content:
            if part.get("type") == "image_url":
                count += 1
                texts.append(marker(str(part.get("loki_name") or "image")))
            elif part.get("type") == "text":
                texts.append(str(part.get("text") or ""))
        message.content = "\n\n".join(t for t in texts if t)
    return count
