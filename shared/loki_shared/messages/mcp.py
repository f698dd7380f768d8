"""The person's MCP servers: ``loki.chat.mcp`` (list, add, update, delete, test).

Two kinds of server (issue 42):

- ``http`` (Streamable HTTP): added, edited and removed through this subject (the gateway's
  ``/api/mcp/servers``). Its ``headers`` (tokens) are sealed at rest and never sent back: a
  server's view lists which header NAMES are set (``header_names``), never a value.
- ``stdio`` (a child process Loki starts): ONLY from the file ``LOKI_HOME/mcp.json`` the
  person edits (see :mod:`loki_chat.mcp.config`). Nothing here can name a command: the
  request models refuse unknown fields (``extra="forbid"``), so no request can make Loki
  start one; a stdio server is listed (``source: "file"``) and tested, never written here.

Per project: a server is on for every project except those in its ``projects_off``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .base import Msg, Reply

#: A server's name: what its tools' names start with (``<server>__<tool>``).
SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$"
#: An HTTP(S) URL, nothing else (no ``file:``, no command).
HTTP_URL = r"^https?://[^\s]+$"
#: A header name (RFC 9110 token).
HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$"

#: ``up`` (connected, tools listed), ``down`` (not reachable now: its last known tools stay
#: offered and answer "unavailable"), ``off`` (disabled), ``unknown`` (not tried yet).
ServerState = Literal["up", "down", "off", "unknown"]


class _Strict(Msg):
    """A request part a person writes: an unknown field is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


class McpServerSpec(_Strict):
    """An HTTP server as written through the API: ``name``, ``url`` (``http(s)://``),
    ``headers`` (name -> value, sent with every request: a bearer token...), ``enabled``,
    ``projects_off`` (project ids for which it is off; default: on for every project)."""

    name: str = Field(pattern=SERVER_NAME)
    url: str = Field(pattern=HTTP_URL, max_length=2000)
    headers: dict[str, str] = Field(default_factory=dict, max_length=32)
    enabled: bool = True
    projects_off: list[str] = Field(default_factory=list, max_length=1000)


class McpServerPatch(_Strict):
    """An edit: only the fields given change (null is not given; ``headers`` given replaces
    them all; absent, the sealed ones stay: they are never sent back, so the UI cannot resend
    them). Of a ``file`` server only ``enabled`` and ``projects_off`` can change (kept beside
    the file)."""

    url: str | None = Field(default=None, pattern=HTTP_URL, max_length=2000)
    headers: dict[str, str] | None = Field(default=None, max_length=32)
    enabled: bool | None = None
    projects_off: list[str] | None = Field(default=None, max_length=1000)


class McpServerView(Msg):
    """A server as listed: ``transport`` (``http``/``stdio``), ``source`` (``api``: added
    through the API; ``file``: from ``LOKI_HOME/mcp.json``), ``url`` (http) or ``command``
    and ``args`` (stdio), ``header_names`` / ``env_names`` (which are set; never their
    values), ``enabled``, ``projects_off``, ``state``, ``error`` (why it is down), ``tools``
    (the names the model sees, in the order offered; the last known ones while down)."""

    name: str
    transport: Literal["http", "stdio"]
    source: Literal["api", "file"]
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    header_names: list[str] = Field(default_factory=list)
    env_names: list[str] = Field(default_factory=list)
    enabled: bool = True
    projects_off: list[str] = Field(default_factory=list)
    state: ServerState = "unknown"
    error: str = ""
    tools: list[str] = Field(default_factory=list)


class McpTestResult(Msg):
    """A connection test: ``ok``, ``tools`` (the server's own tool names), ``error`` (why
    not), ``ms`` (how long connecting and listing took)."""

    ok: bool
    tools: list[str] = Field(default_factory=list)
    error: str = ""
    ms: float = 0.0


class McpRequest(Msg):
    """``loki.chat.mcp``: ``list``; ``add`` (``spec``); ``update`` (``name``, ``patch``);
    ``delete`` (``name``); ``test`` (``name``: a configured server, tried now whether on or
    off)."""

    action: Literal["list", "add", "update", "delete", "test"]
    name: str | None = None
    spec: McpServerSpec | None = None
    patch: McpServerPatch | None = None


class McpReply(Reply):
    """``servers``: the listed or touched server(s), by name; ``test``: a test's result."""

    servers: list[McpServerView] = Field(default_factory=list)
    test: McpTestResult | None = None
