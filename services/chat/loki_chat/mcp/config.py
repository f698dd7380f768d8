"""What an MCP server is, and where each kind comes from.

- Streamable HTTP servers (``http``): records written through ``loki.chat.mcp`` (the gateway's
  ``/api/mcp/servers``), kept sealed in Redis (:mod:`.registry`).
- stdio servers (``stdio``, a child process Loki starts): ONLY from ``LOKI_HOME/mcp.json``,
  the file the person edits; no API writes it or names a command (an API that starts
  commands is a remote-code-execution hole). Its shape (``mcpServers`` is accepted for
  ``servers``, the key other MCP clients use)::

      {"servers": {"files": {"command": "npx", "args": ["-y", "some-server", "/data"],
                             "env": {"TOKEN": "..."}, "enabled": true,
                             "projects_off": ["p1"]}}}

  The file is read again when its modification time changes. A bad entry is skipped (logged
  with what is wrong), never the others; a bad file gives no stdio server.

Per project (``projects_off``): a server is on for every project unless the project is named
there. The choice lives in the server's record, not in the project: a server is configured in
one place (one record to read at each turn, no request to the memory service), and a project
created later gets every server the person has, as a new project gets every built-in tool.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loki_shared.messages.mcp import SERVER_NAME

log = logging.getLogger("loki.chat.mcp")

#: The stdio servers' file, under ``LOKI_HOME``.
CONFIG_FILE = "mcp.json"

_NAME = re.compile(SERVER_NAME)


@dataclass(frozen=True)
class ServerConfig:
    """One configured server: ``http`` (``url``, ``headers``) or ``stdio`` (``command``,
    ``args``, ``env``); ``source`` says where it came from (``api`` or ``file``)."""

    name: str
    transport: Literal["http", "stdio"]
    source: Literal["api", "file"]
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    enabled: bool = True
    projects_off: frozenset[str] = frozenset()

    def on_for(self, project: str) -> bool:
        """The server's tools are offered in ``project``'s conversations."""
        return self.enabled and project not in self.projects_off

    def connection_key(self) -> tuple[Any, ...]:
        """What a connection depends on: a change of it means a new connection."""
        return (
            self.transport,
            self.url,
            tuple(sorted(self.headers.items())),
            self.command,
            self.args,
            tuple(sorted(self.env.items())),
        )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def stdio_entry(name: str, entry: Any) -> ServerConfig | str:
    """One entry of the file as a :class:`ServerConfig`, or what is wrong with it."""
    if not _NAME.match(name):
        return f"the name {name!r} must match {SERVER_NAME}"
    if not isinstance(entry, dict):
        return "an entry is an object with `command`"
    command = entry.get("command")
    if not isinstance(command, str) or not command.strip():
        return "`command` (a non-empty string) is required"
    args = entry.get("args", [])
    env = entry.get("env", {})
    off = entry.get("projects_off", [])
    enabled = entry.get("enabled", True)
    if not _strings(args):
        return "`args` must be a list of strings"
    if not _str_map(env):
        return "`env` must map names to strings"
    if not _strings(off):
        return "`projects_off` must be a list of project ids"
    if not isinstance(enabled, bool):
        return "`enabled` must be true or false"
    return ServerConfig(
        name=name,
        transport="stdio",
        source="file",
        command=command,
        args=tuple(args),
        env=dict(env),
        enabled=enabled,
        projects_off=frozenset(off),
    )


class StdioFile:
    """``LOKI_HOME/mcp.json``, read again when its modification time changes."""

    def __init__(self, home: Path) -> None:
        self.path = home / CONFIG_FILE
        self._stamp: tuple[int, int] | None = None
        self._servers: dict[str, ServerConfig] = {}

    def servers(self) -> dict[str, ServerConfig]:
        """The file's valid servers by name (none when it is absent or unreadable)."""
        try:
            st = self.path.stat()
        except OSError:
            self._stamp, self._servers = None, {}
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            self._servers = self._read()
        return self._servers

    def _read(self) -> dict[str, ServerConfig]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("%s not read (%s): no stdio MCP server", self.path, exc)
            return {}
        entries = data.get("servers", data.get("mcpServers")) if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            log.warning('%s: expected {"servers": {name: {...}}}', self.path)
            return {}
        out: dict[str, ServerConfig] = {}
        for name, entry in entries.items():
            got = stdio_entry(str(name), entry)
            if isinstance(got, str):
                log.warning("%s: server %r skipped: %s", self.path, name, got)
            else:
                out[got.name] = got
        return out
