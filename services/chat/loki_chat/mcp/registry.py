"""The MCP servers' records and their last known tools, in Redis (sealed).

Keys (values sealed with :mod:`loki_shared.sealing`; AAD = ``<key>:<field>``):

- ``loki:chat:mcp:servers`` — hash ``name -> record`` (JSON): an HTTP server added through
  the API (``url``, ``headers``: the tokens, sealed with the rest, ``enabled``,
  ``projects_off``), or, for a server of ``LOKI_HOME/mcp.json``, the switches the API set
  (``overlay``: ``enabled`` and/or ``projects_off``, which win over the file's);
- ``loki:chat:mcp:tools`` — hash ``name -> {"tools": [...]}``: the server's last tool listing
  (:class:`~.adapter.ToolInfo` JSON), so a server that is down, after a restart too, keeps
  its tools offered (the prompt prefix does not change when a server flaps).
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from loki_shared.sealing import Sealer, SealError

from .adapter import ToolInfo

SERVERS = "loki:chat:mcp:servers"
TOOLS = "loki:chat:mcp:tools"


class Registry:
    """Reads and writes the two hashes above."""

    def __init__(self, r: aioredis.Redis, sealer: Sealer) -> None:
        self.r = r
        self.sealer = sealer

    def _seal(self, key: str, name: str, value: Any) -> bytes:
        return self.sealer.seal(json.dumps(value).encode(), f"{key}:{name}".encode())

    def _open(self, key: str, name: str, blob: bytes) -> Any:
        return json.loads(self.sealer.open(blob, f"{key}:{name}".encode()))

    async def _all(self, key: str) -> dict[str, Any]:
        raw: dict[bytes, bytes] = await self.r.hgetall(key)
        out: dict[str, Any] = {}
        for field, blob in raw.items():
            name = field.decode()
            try:
                out[name] = self._open(key, name, blob)
            except (SealError, ValueError):  # another key's blob: as if absent
                continue
        return out

    async def records(self) -> dict[str, dict[str, Any]]:
        """Every record by server name."""
        return {k: v for k, v in (await self._all(SERVERS)).items() if isinstance(v, dict)}

    async def put(self, name: str, record: dict[str, Any]) -> None:
        await self.r.hset(SERVERS, name, self._seal(SERVERS, name, record))

    async def delete(self, name: str) -> None:
        """The record and the server's last known tools."""
        await self.r.hdel(SERVERS, name)
        await self.r.hdel(TOOLS, name)

    async def tools(self) -> dict[str, list[ToolInfo]]:
        """Every server's last known tools."""
        out: dict[str, list[ToolInfo]] = {}
        for name, value in (await self._all(TOOLS)).items():
            try:
                out[name] = [ToolInfo.from_json(t) for t in value["tools"]]
            except (KeyError, TypeError):
                continue
        return out

    async def put_tools(self, name: str, tools: list[ToolInfo]) -> None:
        value = {"tools": [t.to_json() for t in tools]}
        await self.r.hset(TOOLS, name, self._seal(TOOLS, name, value))
