"""MCP: the tools of the person's own MCP servers (issue 42), one concept a module.

- :mod:`.config` — what a server is; the stdio servers' file ``LOKI_HOME/mcp.json``;
- :mod:`.registry` — the HTTP servers' records and every server's last known tools (Redis);
- :mod:`.connection` — one server's session (Streamable HTTP or a stdio child), its calls;
- :mod:`.manager` — an instance's servers: configuration read before each turn, connections,
  the tools a project is offered in their stable order;
- :mod:`.names` — the model's names ``<server>__<tool>``;
- :mod:`.adapter` — a server's tool as a :class:`~loki_chat.tools.box.ToolSpec`, a call's
  result (or failure) as the model's result;
- :mod:`.api` — ``loki.chat.mcp`` (the gateway's ``/api/mcp/servers``).
"""

from __future__ import annotations

from .api import McpApi
from .manager import McpManager
from .registry import Registry

__all__ = ["McpApi", "McpManager", "Registry"]
