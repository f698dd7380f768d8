"""A real MCP server for the tests, written with the SDK (``MCPServer``), run as a process.

    python tests/fakes/mcp_server.py stdio          # over stdin/stdout (Loki starts it)
    python tests/fakes/mcp_server.py http PORT      # Streamable HTTP on 127.0.0.1:PORT/mcp

Tools: ``echo(text, count)`` (its arguments back as JSON), ``fail(reason)`` (an ``isError``
result), ``slow(seconds)``, ``big(size)`` (``size`` characters), ``die()`` (the process
exits mid-call), ``picture()`` (a PNG image), ``get-weather.now(city)`` (a name to sanitise),
``grow()`` (adds ``extra()`` and sends ``notifications/tools/list_changed``: a tool list that
changes mid-conversation). With ``MCP_TOKEN`` set, an HTTP
request without ``Authorization: Bearer <token>`` gets 401.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

#: This file (the command the tests run).
SERVER = Path(__file__).resolve()
#: A generous bound for the tests' waits: on a loaded machine a Python process importing the
#: SDK takes seconds to start.
SLOW = 180.0
#: A 1×1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

server = MCPServer("loki-test", log_level="CRITICAL")


@server.tool(description="Echo the arguments back as JSON.")
def echo(text: str, count: int = 1) -> str:
    return json.dumps({"text": text, "count": count})


@server.tool(description="Always fails with the reason given.")
def fail(reason: str) -> str:
    raise ToolError(reason)


@server.tool(description="Sleep for the seconds given, then answer.")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


@server.tool(description="A text of `size` characters.")
def big(size: int = 1_000_000) -> str:
    return "y" * size


@server.tool(description="The server process exits in the middle of this call.")
def die() -> str:
    os._exit(3)


@server.tool(description="A small picture.")
def picture() -> Image:
    return Image(data=PNG, format="png")


@server.tool(name="get-weather.now", description="The weather in a city.")
def weather(city: str) -> str:
    return f"sunny in {city}"


def extra() -> str:
    return "extra"


@server.tool(description="Add the tool `extra` and tell the client the tool list changed.")
async def grow(ctx: Context) -> str:
    server.add_tool(extra, name="extra", description="A tool that appears later.")
    await ctx.session.send_tool_list_changed()
    return "grown"


def guarded(app: Any, token: str) -> Any:
    """``app`` answering 401 to a request without the bearer ``token``."""

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no token"})
                return
        await app(scope, receive, send)

    return wrapper


def main() -> None:
    if sys.argv[1] == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app: Any = server.streamable_http_app()
    token = os.environ.get("MCP_TOKEN")
    if token:
        app = guarded(app, token)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")


if __name__ == "__main__":
    main()
