"""MCP tools as the model sees them: :class:`~loki_chat.tools.box.ToolSpec` objects, and the
results of their calls as tool results.

Rules (docs/behaviour.md (tools, MCP)):

- A tool is offered as ``<server>__<tool>`` (:mod:`.names`), with the server's description
  (or a sentence naming the server when it gives none) and its input schema passed through;
  a schema that is not a JSON object schema is replaced by an empty object schema and the
  description says so (the model then sends ``{}`` or what the description asks).
- Results: the text blocks joined by blank lines; an image block goes through the existing
  image path (shown to the model in the next message, this turn only) when the endpoint sees
  images, else it is a text note saying it was not shown; other blocks (audio, resources) are
  notes; no block but structured content: its JSON. A result the server marks ``isError`` is
  "Error: …" with its text.
- Every failure is a result that says what happened and what to do: the server unavailable
  (not run), a timeout (``LOKI_MCP_TIMEOUT_S``: the outcome is unknown), the server gone
  during the call, the server's error answer. Never an exception into the turn. The cap of
  every tool result (``LOKI_TOOL_RESULT_MAX``) applies in the model's view; the display log
  keeps the whole text (:mod:`loki_chat.calls`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp import types

from loki_shared.messages.chat import ImageAttachment

from ..tools.box import EMPTY_PARAMETERS, CallContext, ToolReturn, ToolSpec
from .connection import ServerGone, ServerUnavailable, describe

#: Said in the description of a tool whose input schema could not be passed through.
SCHEMA_FALLBACK_NOTE = (
    " (Its input schema was not a JSON object schema and is not shown: send the arguments "
    "the description asks for as one JSON object.)"
)

#: ``call(server, tool, arguments)`` -> the server's result (errors raised as
#: :mod:`.connection` says).
CallFn = Callable[[str, str, dict[str, Any]], Awaitable[types.CallToolResult]]


@dataclass(frozen=True)
class ToolInfo:
    """A tool as a server listed it (what is kept of it: persisted, and offered while the
    server is down)."""

    name: str
    description: str
    schema: Any

    @classmethod
    def of(cls, tool: types.Tool) -> ToolInfo:
        return cls(tool.name, tool.description or tool.title or "", tool.input_schema)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "schema": self.schema}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolInfo:
        return cls(str(data["name"]), str(data.get("description") or ""), data.get("schema"))


def parameters(schema: Any) -> tuple[dict[str, Any], bool]:
    """The ``parameters`` offered for ``schema`` and whether it was passed through (an object
    schema: ``type`` ``object``, or no ``type`` with ``properties``)."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
            return schema, True
    return dict(EMPTY_PARAMETERS), False


def tool_spec(
    server: str, info: ToolInfo, model_name: str, call: CallFn, timeout_s: float
) -> ToolSpec:
    """The :class:`ToolSpec` of ``info`` of ``server``, offered as ``model_name``."""
    params, passed = parameters(info.schema)
    description = (
        info.description.strip() or f"The `{info.name}` tool of the MCP server `{server}`."
    )
    if not passed:
        description += SCHEMA_FALLBACK_NOTE

    async def run_call(args: dict[str, Any], context: CallContext) -> str | ToolReturn:
        return await call_text(call, server, info.name, model_name, args, context.vision, timeout_s)

    async def run(args: dict[str, Any]) -> str | ToolReturn:
        return await call_text(call, server, info.name, model_name, args, False, timeout_s)

    return ToolSpec(
        name=model_name, description=description, parameters=params, run=run, run_call=run_call
    )


async def call_text(
    call: CallFn,
    server: str,
    tool: str,
    model_name: str,
    args: dict[str, Any],
    vision: bool,
    timeout_s: float,
) -> str | ToolReturn:
    """Call the tool and turn whatever happens into the model's result (never raises)."""
    try:
        result = await call(server, tool, args)
    except ServerUnavailable as exc:
        return (
            f"Error: the MCP server `{server}` is unavailable ({exc}); `{model_name}` was NOT "
            "run. Go on without it, or tell the user the server is down (Loki tries it again "
            "in the background)."
        )
    except TimeoutError:
        return (
            f"Error: `{model_name}` did not answer within {timeout_s:g} s (LOKI_MCP_TIMEOUT_S); "
            "its outcome is unknown (it may still be running on the server). Do not assume it "
            "ran: check, or try a smaller request."
        )
    except ServerGone as exc:
        return (
            f"Error: the MCP server `{server}` stopped during the call to `{model_name}` "
            f"({exc}); its outcome is unknown. Go on without it, or tell the user."
        )
    except Exception as exc:  # noqa: BLE001 - the server's refusal is the model's to see
        return (
            f"Error: the MCP server `{server}` refused the call to `{model_name}`: "
            f"{describe(exc)}. Check the arguments against the tool's schema and call again."
        )
    return result_text(result, model_name, vision)


def result_text(result: types.CallToolResult, model_name: str, vision: bool) -> str | ToolReturn:
    """The model's result of a call (rules in the module docstring)."""
    parts: list[str] = []
    images: list[ImageAttachment] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent):
            note = image_part(block, model_name, len(images) + 1, vision)
            if isinstance(note, ImageAttachment):
                images.append(note)
                parts.append(f"[image {note.name}: shown in the next message]")
            else:
                parts.append(note)
        elif isinstance(block, types.AudioContent):
            parts.append(f"[audio ({block.mime_type}) not shown: Loki does not pass audio on]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(res.text)
            else:
                parts.append(f"[resource {res.uri} ({res.mime_type or 'binary'}) not shown]")
        else:
            uri = getattr(block, "uri", None)
            parts.append(f"[resource link {uri}]" if uri else f"[{block.type} content not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n\n".join(parts) if parts else "(the tool returned nothing)"
    if result.is_error:
        text = f"Error: `{model_name}` reported an error: {text}"
    return ToolReturn(text=text, images=images) if images else text


def image_part(
    block: types.ImageContent, model_name: str, n: int, vision: bool
) -> ImageAttachment | str:
    """The image of a result: an attachment to show (``vision``), else the note said instead."""
    mime = block.mime_type or "image/png"
    size = len(block.data) * 3 // 4
    if not vision or not mime.startswith("image/"):
        return (
            f"[an image ({mime}, about {size} bytes) was returned and not shown: this model "
            "does not see images]"
        )
    ext = mime.split("/", 1)[1].split(";")[0] or "png"
    return ImageAttachment(
        id=uuid.uuid4().hex, name=f"{model_name}-{n}.{ext}", url=f"data:{mime};base64,{block.data}"
    )
