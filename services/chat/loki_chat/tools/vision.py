"""``see_image(path)``: show the model an image the conversation was given.

Rules:

- ``path`` names an image of this conversation's attachments (its file name, its id, or a
  path ending in its file name: :meth:`~loki_chat.image_shelf.ImageShelf.find`).
- Found: the result says the image follows, and the turn loop adds a user message holding it
  (an ``image_url`` part) after the step's tool results. The ephemeral rule applies: when
  the turn ends the image is replaced by its stable marker (:mod:`loki_chat.images`).
- Missing ``path``, or a name that is no image of the conversation (a text file, a file never
  attached, one pruned 24 h after its last use): the result says so, lists the images it
  has, and says what to do (call again with one of them, or ask the user to attach it again).
- Offered only when the lease says the endpoint sees images and the template takes tools
  (:meth:`~loki_chat.turn.TurnRunner.offered_tools`).
"""

from __future__ import annotations

from typing import Any

from ..image_shelf import ImageShelf
from .box import ToolReturn, ToolSpec
from .labels import main_argument

NAME = "see_image"


def see_image_tool(shelf: ImageShelf) -> ToolSpec:
    """The ``see_image`` tool over ``shelf`` (conversational: it gets the conversation id)."""

    async def run(args: dict[str, Any], conversation: str) -> str | ToolReturn:
        path = main_argument(NAME, args)
        names = await shelf.names(conversation) if conversation else []
        have = (
            "Images attached to this conversation: " + ", ".join(names) + "."
            if names
            else "No image is attached to this conversation."
        )
        if not path:
            return (
                f"Error: see_image needs `path`, the file name of an image attached to this "
                f"conversation. {have}"
            )
        image = await shelf.find(conversation, path) if conversation else None
        if image is None:
            return (
                f"Error: `{path}` is not an image attached to this conversation (not attached, "
                f"not an image, or pruned 24 h after its last use). {have} Call see_image with "
                "one of them, or ask the user to attach the image again."
            )
        return ToolReturn(
            text=f"The image {image.name} is in the next message (visible in this turn only).",
            images=[image],
        )

    return ToolSpec(
        name=NAME,
        description=(
            "Look at an image the user attached to this conversation (earlier images are no "
            "longer visible to you): give its file name."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "the image's file name, e.g. photo.png"}
            },
            "required": ["path"],
        },
        run=run,
        conversational=True,
    )
