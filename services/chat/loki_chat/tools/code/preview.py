"""The ``preview`` tool: an HTML file of the workspace rendered by headless chromium in the
sandbox.

Rules (docs/behaviour.md (chat, code mode)): when the step's endpoint sees images
(:attr:`~loki_chat.tools.box.CallContext.vision`) and a screenshot was made, the result says
it follows and the turn loop shows it in a user message (this turn only, the ephemeral rule
of images); otherwise the result is the page's title and visible text. A failure is a result
that says why.
"""

from __future__ import annotations

import posixpath
from typing import Any

from loki_shared import subjects
from loki_shared.messages.chat import ImageAttachment
from loki_shared.messages.workspace import PreviewReply, PreviewRequest

from ..box import CallContext, ToolReturn, ToolSpec
from .target import CodeTarget, failure_text, missing, text_arg

#: Seconds the preview's request may take (the browser starts in the sandbox).
PREVIEW_TIMEOUT_S = 60.0


def page_text(reply: PreviewReply, path: str) -> str:
    """The page as text: its title and visible text."""
    title = reply.title or "(no title)"
    note = f"(Not rendered: {reply.note}.)\n" if reply.note else ""
    return f"Page {path}: {title}\n{note}{reply.text or '(no visible text)'}"


def preview_tool(target: CodeTarget) -> ToolSpec:
    """The ``preview`` tool over ``target``."""

    async def run_call(args: dict[str, Any], call: CallContext) -> str | ToolReturn:
        path = text_arg(args, "path")
        if not path:
            return missing("preview", "path", "an HTML file of the workspace")
        try:
            reply = await target.workspace.call(
                subjects.WORKSPACE_PREVIEW,
                PreviewRequest(project=target.project(), path=path),
                PreviewReply,
                PREVIEW_TIMEOUT_S,
            )
        except Exception as exc:  # noqa: BLE001 - said to the model
            return failure_text("preview", exc)
        text = page_text(reply, path)
        if not (call.vision and reply.png):
            return text
        name = posixpath.basename(path) + ".png"
        image = ImageAttachment(
            id=f"preview-{call.call_id or 'x'}",
            name=name,
            url=f"data:image/png;base64,{reply.png}",
        )
        return ToolReturn(
            text=f"The screenshot of {path} is in the next message (this turn only).\n{text}",
            images=[image],
        )

    async def run(args: dict[str, Any]) -> str | ToolReturn:
        return await run_call(args, CallContext(call_id="", conversation=""))

    return ToolSpec(
        name="preview",
        description=(
            "Render an HTML file of the workspace in a headless browser: its screenshot "
            "when you can see images, else its title and text."
        ),
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "the HTML file"}},
            "required": ["path"],
        },
        run=run,
        run_call=run_call,
    )
