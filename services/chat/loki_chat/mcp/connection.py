"""One MCP server's connection: its session, kept open by a task of its own.

The SDK's transports and :class:`~mcp.client.session.ClientSession` are async context
managers that must be entered and left by one task: :class:`Connection` runs them in its own
task (:meth:`Connection.start`) and keeps the session open until :meth:`Connection.close`;
turns call tools on the open session from their own tasks.

Rules:

- Connecting and listing tools are bounded by ``timeout_s`` (``LOKI_MCP_TIMEOUT_S``); so is
  each tool call (the SDK's read timeout, and an outer bound as a safety).
- A server that cannot be reached, refuses the session, or whose connection ends (a stdio
  process that exits, an HTTP server that goes away) is ``down`` with the reason
  (``error``); the manager keeps its last known tools offered and tries again later
  (:data:`RETRY_S`), never inside a turn's wait.
- A ``notifications/tools/list_changed`` from the server has its tools listed again.
- stdio: the child process is started with the file's ``command``, ``args`` and ``env``
  (over the SDK's safe default environment); closing the connection ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import anyio
import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .config import ServerConfig

log = logging.getLogger("loki.chat.mcp")

#: A server that is down is tried again at most this often (s).
RETRY_S = 10.0
#: Pages of a tool listing read at most (a server that never ends its cursor).
MAX_PAGES = 50
#: Largest server-sent event read from a Streamable HTTP server (one result: the SDK's
#: default, 1 MiB, would refuse a tool's 1 MB text; the model's view is cut anyway).
MAX_EVENT_BYTES = 32 * 1024 * 1024

State = Literal["unknown", "up", "down"]
#: ``on_tools(connection, tools)``: the tools the server listed (on each listing).
ToolsSink = Callable[["Connection", list[types.Tool]], Awaitable[None]]


class ServerUnavailable(Exception):
    """The server is not connected (``down`` or not yet up): the call was not sent."""


class ServerGone(Exception):
    """The connection ended while the call was running (the server stopped or crashed)."""


@contextlib.asynccontextmanager
async def open_streams(config: ServerConfig, timeout_s: float) -> AsyncIterator[Any]:
    """The transport's stream pair for ``config`` (Streamable HTTP or a stdio child)."""
    if config.transport == "stdio":
        params = StdioServerParameters(
            command=config.command, args=list(config.args), env=dict(config.env) or None
        )
        async with stdio_client(params) as streams:
            yield streams
        return
    timeout = httpx2.Timeout(timeout_s, read=max(timeout_s, 300.0))
    async with (
        create_mcp_http_client(headers=dict(config.headers), timeout=timeout) as http,
        streamable_http_client(
            config.url, http_client=http, max_sse_event_size=MAX_EVENT_BYTES
        ) as streams,
    ):
        yield streams


async def list_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool of the server (all pages)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


class Connection:
    """The connection to one server (see the module docstring).

    Args:
        config: the server.
        timeout_s: bound of connecting, listing and each call (s).
        on_tools: told each listing of the server's tools.
    """

    def __init__(self, config: ServerConfig, timeout_s: float, on_tools: ToolsSink) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.on_tools = on_tools
        self.state: State = "unknown"
        self.error = ""
        self.session: ClientSession | None = None
        self.tried = 0.0  # monotonic time of the last attempt to connect
        self.ready = asyncio.Event()  # set once an attempt ended (up or down)
        self._closing = asyncio.Event()
        self._relist = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Connect in the background (again, when down); nothing when already running."""
        if self.running:
            return
        self.tried = time.monotonic()
        self.ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"mcp:{self.config.name}")

    def due(self) -> bool:
        """Down (or never tried) and its retry time has come."""
        return not self.running and time.monotonic() - self.tried >= RETRY_S

    async def close(self) -> None:
        """End the session (and a stdio child); waits up to 5 s."""
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                task.cancel()

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            self._relist.set()

    async def _run(self) -> None:
        try:
            async with open_streams(self.config, self.timeout_s) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(
                    read,
                    write,
                    read_timeout_seconds=self.timeout_s,
                    message_handler=self._on_message,
                ) as session:
                    with anyio.fail_after(self.timeout_s):
                        await session.initialize()
                        tools = await list_tools(session)
                    self.session, self.state, self.error = session, "up", ""
                    await self.on_tools(self, tools)
                    self.ready.set()
                    await self._serve(session)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and not self._closing.is_set():
                raise
            if not self._closing.is_set():
                self.error = describe(exc)
                log.warning("MCP server %s down: %s", self.config.name, self.error)
        finally:
            self.session, self.state = None, "down"
            self.ready.set()

    async def _serve(self, session: ClientSession) -> None:
        """Hold the session until closed; list the tools again when the server says so."""
        while not self._closing.is_set():
            closing = asyncio.ensure_future(self._closing.wait())
            relist = asyncio.ensure_future(self._relist.wait())
            try:
                await asyncio.wait({closing, relist}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closing.cancel()
                relist.cancel()
            if self._relist.is_set() and not self._closing.is_set():
                self._relist.clear()
                with anyio.fail_after(self.timeout_s):
                    tools = await list_tools(session)
                await self.on_tools(self, tools)

    def lost(self, reason: str) -> None:
        """The connection is gone (seen by a call): down now, closed in the background."""
        self.state, self.error = "down", reason
        self.session = None
        self._closing.set()

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool`` with ``arguments``.

        Raises:
            ServerUnavailable: not connected; nothing was sent.
            ServerGone: the connection ended during the call.
            TimeoutError: no answer within ``timeout_s``.
            Exception: the server's own error answer (an MCP error), or anything else.
        """
        session = self.session
        if session is None or self.state != "up":
            raise ServerUnavailable(self.error or "not connected")
        try:
            result = await asyncio.wait_for(
                session.call_tool(tool, arguments, read_timeout_seconds=self.timeout_s),
                self.timeout_s + 1.0,
            )
        except Exception as exc:
            if is_timeout(exc):
                raise TimeoutError(str(exc)) from exc
            if is_closed(exc) or not self.running:  # reconnected at the next retry
                self.lost(describe(exc))
                raise ServerGone(describe(exc)) from exc
            raise
        if not isinstance(result, types.CallToolResult):
            raise RuntimeError(f"unexpected answer {type(result).__name__}")
        return result


def _code(exc: BaseException) -> int | None:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    return code if isinstance(code, int) else None


def is_timeout(exc: BaseException) -> bool:
    """``exc`` says the server did not answer in time."""
    return (
        isinstance(exc, TimeoutError | asyncio.TimeoutError) or _code(exc) == types.REQUEST_TIMEOUT
    )


def is_closed(exc: BaseException) -> bool:
    """``exc`` says the connection ended: the SDK's "connection closed", an HTTP server that
    forgot the session (restarted: "Session terminated"), or a failure of the transport itself
    (a network error, a closed stream)."""
    if isinstance(exc, _TRANSPORT_ERRORS):
        return True
    return _code(exc) == types.CONNECTION_CLOSED or "Session terminated" in str(exc)


#: Failures of the transport itself (not an answer of the server).
_TRANSPORT_ERRORS = (
    OSError,
    httpx2.TransportError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
)


def describe(exc: BaseException) -> str:
    """A short text of ``exc`` for a person (an exception group: its first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:300]
