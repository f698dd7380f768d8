"""The person's MCP servers: ``/api/mcp/servers`` (list, add), ``/api/mcp/servers/{name}``
(edit with PUT or PATCH, delete), ``/api/mcp/servers/{name}/test`` (connect now, list its
tools).

Every route is a ``loki.chat.mcp`` request to the chat service
(:mod:`loki_shared.messages.mcp`). Only Streamable HTTP servers are added here: the body has
no command field and an unknown field is refused (400), so no request can make Loki start a
process; stdio servers come from ``LOKI_HOME/mcp.json`` alone (listed with ``source:
"file"``; only their ``enabled`` and ``projects_off`` can be changed here). Header values
(tokens) are sealed by the chat service and never sent back: a server lists its
``header_names``. Errors are OpenAI-shaped: 400 a bad body (what to resend), 404 an unknown
server, 409 a name taken.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from loki_shared import subjects
from loki_shared.messages.mcp import (
    SERVER_NAME,
    McpReply,
    McpRequest,
    McpServerPatch,
    McpServerSpec,
)

from ..bus import Bus
from ..deps import get_bus

router = APIRouter(tags=["mcp"])

#: How long a request waits for the chat service: a new server is connected and its tools
#: listed before the answer (bounded there by ``LOKI_MCP_TIMEOUT_S``, 30 s by default).
MCP_WAIT_S = 75.0

ServerPath = Annotated[str, Path(pattern=SERVER_NAME, description="The server's name.")]


async def _mcp(bus: Bus, **fields: Any) -> list[dict[str, Any]]:
    """The servers the chat service's answer names, as JSON (raises its error)."""
    reply = await bus.request_ok(subjects.CHAT_MCP, McpRequest(**fields), McpReply, MCP_WAIT_S)
    return [s.model_dump(mode="json") for s in reply.servers]


@router.get("/api/mcp/servers")
async def mcp_list(bus: Bus = Depends(get_bus)) -> Any:
    """``{"servers": [McpServerView]}`` by name (``tools``: the names the model sees)."""
    return {"servers": await _mcp(bus, action="list")}


@router.post("/api/mcp/servers", status_code=201)
async def mcp_add(body: McpServerSpec, bus: Bus = Depends(get_bus)) -> Any:
    """Add a Streamable HTTP server (``name``, ``url``, ``headers``, ``enabled``,
    ``projects_off``): 201 ``{"server": McpServerView}``, connected and listed when it
    answered in time."""
    (server,) = await _mcp(bus, action="add", spec=body)
    return JSONResponse({"server": server}, status_code=201)


async def _edit(name: str, body: McpServerPatch, bus: Bus) -> Any:
    (server,) = await _mcp(bus, action="update", name=name, patch=body)
    return {"server": server}


@router.put("/api/mcp/servers/{name}")
async def mcp_replace(name: ServerPath, body: McpServerPatch, bus: Bus = Depends(get_bus)) -> Any:
    """Edit a server: the fields given change (``headers`` given replaces them all; absent,
    the sealed ones stay). ``{"server": McpServerView}``."""
    return await _edit(name, body, bus)


@router.patch("/api/mcp/servers/{name}")
async def mcp_patch(name: ServerPath, body: McpServerPatch, bus: Bus = Depends(get_bus)) -> Any:
    """As PUT: e.g. ``{"enabled": false}`` switches a server off, ``{"projects_off": [...]}``
    sets the projects it is off for."""
    return await _edit(name, body, bus)


@router.delete("/api/mcp/servers/{name}")
async def mcp_delete(name: ServerPath, bus: Bus = Depends(get_bus)) -> Any:
    """Delete an HTTP server and its last known tools (a file server: 400, edit the file)."""
    (gone,) = await _mcp(bus, action="delete", name=name)
    return {"ok": True, "deleted": gone["name"]}


@router.post("/api/mcp/servers/{name}/test")
async def mcp_test(name: ServerPath, bus: Bus = Depends(get_bus)) -> Any:
    """Connect to the server now and list its tools: ``{"server": McpServerView, "test":
    {"ok", "tools", "error", "ms"}}`` (200 either way: ``ok`` says)."""
    reply = await bus.request_ok(
        subjects.CHAT_MCP, McpRequest(action="test", name=name), McpReply, MCP_WAIT_S
    )
    test = reply.test.model_dump(mode="json") if reply.test else None
    return {"server": reply.servers[0].model_dump(mode="json"), "test": test}
