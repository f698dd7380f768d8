"""The MCP servers of one chat instance: their configuration, connections and tools.

:class:`McpManager` is what the rest of chat meets:

- :meth:`~McpManager.refresh` (before each turn): the configuration is read again (the file's
  stdio servers, the API's HTTP servers from Redis: a change made through any instance is
  seen by every one at its next turn); connections follow it (new, changed, removed,
  disabled); a server down is tried again in the background (:data:`.connection.RETRY_S`);
  a server never listed yet is waited for, at most ``LOKI_MCP_TIMEOUT_S``.
- :meth:`~McpManager.box`: the tools a project's conversation is offered: the built-ins
  first in their own order, then the servers on for the project, by name, each one's tools by
  name (:mod:`.names` for the model's names). With no server for the project it returns the
  built-in box itself: the request is byte-identical to one without MCP.
- A server keeps its LAST KNOWN tools offered while it is down (and after a restart: the
  listing is kept in Redis, :mod:`.registry`); calls then answer "unavailable". Its tools
  change only when it lists different ones (a prompt change: the perf service names its
  cause ``tools`` and the conversation's next turn tells the user once, ``tools_changed``),
  or when the person changes the configuration.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from mcp import types

from ..tools.box import ToolBox
from .adapter import ToolInfo, tool_spec
from .config import ServerConfig, StdioFile
from .connection import Connection, ServerUnavailable
from .names import unique_names
from .registry import Registry

log = logging.getLogger("loki.chat.mcp")


def http_config(name: str, record: dict[str, Any]) -> ServerConfig | None:
    """An API record as a :class:`ServerConfig` (None: not an HTTP record)."""
    if record.get("overlay") or not isinstance(record.get("url"), str):
        return None
    return ServerConfig(
        name=name,
        transport="http",
        source="api",
        url=record["url"],
        headers=dict(record.get("headers") or {}),
        enabled=bool(record.get("enabled", True)),
        projects_off=frozenset(record.get("projects_off") or ()),
    )


def merge(
    file: dict[str, ServerConfig], records: dict[str, dict[str, Any]]
) -> dict[str, ServerConfig]:
    """Every server: the file's (with the API's switches over them) and the API's HTTP ones
    (a name in the file wins: the API refuses to add one)."""
    out: dict[str, ServerConfig] = {}
    for name, cfg in file.items():
        over = records.get(name) or {}
        if over.get("overlay"):
            enabled = over.get("enabled")
            off = over.get("projects_off")
            cfg = replace(
                cfg,
                enabled=cfg.enabled if enabled is None else bool(enabled),
                projects_off=cfg.projects_off if off is None else frozenset(off),
            )
        out[name] = cfg
    for name, record in records.items():
        if name not in out and (cfg_http := http_config(name, record)) is not None:
            out[name] = cfg_http
    return out


class McpManager:
    """The MCP side of one chat instance (see the module docstring).

    Args:
        registry: the records and last known tools in Redis.
        home: ``LOKI_HOME`` (its ``mcp.json``: the stdio servers).
        timeout_s: ``LOKI_MCP_TIMEOUT_S``.
    """

    def __init__(self, registry: Registry, home: Path, timeout_s: float) -> None:
        self.registry = registry
        self.file = StdioFile(home)
        self.timeout_s = timeout_s
        self.configs: dict[str, ServerConfig] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.connections: dict[str, Connection] = {}
        self.known: dict[str, list[ToolInfo]] = {}
        self._loaded = False
        self._lock = asyncio.Lock()

    # -- configuration and connections ---------------------------------------------------
    async def refresh(self) -> None:
        """Read the configuration again and bring the connections in line (never raises:
        Redis away keeps the last configuration)."""
        async with self._lock:
            try:
                self.records = await self.registry.records()
                if not self._loaded:
                    self.known = await self.registry.tools()
                    self._loaded = True
            except Exception:
                log.warning("MCP configuration not read: the last one stays", exc_info=True)
            self.configs = merge(self.file.servers(), self.records)
            fresh = await self._reconcile()
        waits = [c.ready.wait() for c in fresh if c.config.name not in self.known]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), self.timeout_s)
            except TimeoutError:
                pass

    async def _reconcile(self) -> list[Connection]:
        for name, conn in list(self.connections.items()):
            cfg = self.configs.get(name)
            if (
                cfg is None
                or not cfg.enabled
                or cfg.connection_key() != conn.config.connection_key()
            ):
                del self.connections[name]
                await conn.close()
        fresh: list[Connection] = []
        for name, cfg in sorted(self.configs.items()):
            if not cfg.enabled:
                continue
            known = self.connections.get(name)
            if known is None:
                new = self.connections[name] = Connection(cfg, self.timeout_s, self._listed)
                new.start()
                fresh.append(new)
            else:
                known.config = cfg
                if known.due():
                    known.start()
        return fresh

    async def _listed(self, conn: Connection, tools: list[types.Tool]) -> None:
        """A server listed its tools: kept (and persisted) when they differ from the last."""
        name = conn.config.name
        if self.connections.get(name) is not conn:
            return  # a connection replaced meanwhile: its listing is not the server's now
        infos = sorted((ToolInfo.of(t) for t in tools), key=lambda t: t.name)
        if self.known.get(name) == infos:
            return
        if name in self.known:
            log.info("MCP server %s: its tool list changed (a prompt change)", name)
        self.known[name] = infos
        try:
            await self.registry.put_tools(name, infos)
        except Exception:  # noqa: BLE001 - kept in memory; written at the next change
            log.warning("MCP server %s: tool list not persisted", name)

    async def close(self) -> None:
        """Close every connection (stdio children end)."""
        conns = list(self.connections.values())
        self.connections.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # -- what the model is offered -------------------------------------------------------
    def servers_for(self, project: str) -> list[str]:
        """The servers whose tools ``project``'s conversations are offered, by name."""
        return sorted(n for n, c in self.configs.items() if c.on_for(project) and self.known.get(n))

    def box(self, base: ToolBox, project: str) -> ToolBox:
        """``base`` followed by the MCP tools ``project`` is offered (``base`` itself when
        there are none)."""
        servers = self.servers_for(project)
        if not servers:
            return base
        pairs = [(s, t) for s in servers for t in self.known[s]]
        names = unique_names(((s, t.name) for s, t in pairs), base.specs)
        box = ToolBox(list(base.specs.values()))
        for (server, info), name in zip(pairs, names, strict=True):
            box.add(tool_spec(server, info, name, self.call, self.timeout_s))
        return box

    def signature(self, project: str, base: ToolBox) -> dict[str, str]:
        """The MCP tools ``project`` is offered: model name -> digest of its schema (what a
        ``tools_changed`` notice compares)."""
        box = self.box(base, project)
        out: dict[str, str] = {}
        for name, spec in box.specs.items():
            if name in base.specs:
                continue
            text = json.dumps(spec.schema(), sort_keys=True, ensure_ascii=False)
            out[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
        return out

    async def call(self, server: str, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool`` of ``server`` (errors as :meth:`.connection.Connection.call` raises);
        a server down whose retry time has come is tried once first, within the timeout."""
        conn = self.connections.get(server)
        cfg = self.configs.get(server)
        if conn is None or cfg is None or not cfg.enabled:
            raise ServerUnavailable("it is switched off or no longer configured")
        if conn.state != "up" and conn.due():
            conn.start()
            try:
                await asyncio.wait_for(conn.ready.wait(), self.timeout_s)
            except TimeoutError:
                pass
        return await conn.call(tool, arguments)

    # -- for the API ---------------------------------------------------------------------
    def state_of(self, name: str) -> tuple[str, str]:
        """``(state, error)`` of a configured server."""
        cfg = self.configs.get(name)
        if cfg is not None and not cfg.enabled:
            return "off", ""
        conn = self.connections.get(name)
        if conn is None:
            return "unknown", ""
        return conn.state, conn.error

    def tool_names(self, name: str) -> list[str]:
        """The names the model sees for ``name``'s last known tools (in any project)."""
        servers = sorted(n for n, c in self.configs.items() if self.known.get(n))
        if name not in servers:
            return []
        pairs = [(s, t.name) for s in servers for t in self.known[s]]
        names = unique_names(pairs, ())
        return [n for (s, _), n in zip(pairs, names, strict=True) if s == name]

    async def test(self, cfg: ServerConfig) -> tuple[bool, list[str], str, float]:
        """Connect to ``cfg`` now (a connection of its own, closed after): ``(ok, tool names,
        error, ms)``; its listing is kept as the server's last known tools when it works."""
        got: list[types.Tool] = []

        async def sink(_conn: Connection, tools: list[types.Tool]) -> None:
            got.extend(tools)

        t0 = time.monotonic()
        conn = Connection(cfg, self.timeout_s, sink)
        conn.start()
        try:
            await asyncio.wait_for(conn.ready.wait(), self.timeout_s + 1.0)
        except TimeoutError:
            conn.error = conn.error or f"no answer within {self.timeout_s:g} s"
        ok = conn.state == "up"
        error = conn.error
        await conn.close()
        ms = (time.monotonic() - t0) * 1000.0
        if not ok:
            return False, [], error or "not connected", ms
        return True, sorted(t.name for t in got), "", ms

    def forget(self, name: str) -> None:
        """A server deleted: its tools go (the registry deleted their copy)."""
        self.known.pop(name, None)
