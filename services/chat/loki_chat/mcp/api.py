"""``loki.chat.mcp``: list, add, update, delete and test the person's MCP servers.

Served by every chat instance (queue group ``chat``): the records live in Redis
(:mod:`.registry`), and every instance reads them again before its next turn.

Rules:

- ``add`` writes an HTTP server only (:class:`~loki_shared.messages.mcp.McpServerSpec` has
  no command field and refuses unknown fields): no request can make Loki start a process. A
  name already configured (in the file or through the API) is a ``conflict``.
- ``update`` changes the fields given; of a server of ``LOKI_HOME/mcp.json`` only
  ``enabled`` and ``projects_off`` (kept beside the file, winning over it): its command, args
  and env are the file's alone (``invalid_request`` saying so).
- ``delete`` removes an HTTP server and its last known tools; a file server is removed from
  the file (``invalid_request`` saying so).
- Views never carry a header or env value: their names only.
- An unknown server is ``not_found``.
"""

from __future__ import annotations

from typing import Any

from loki_shared.errors import Conflict, InvalidRequest, NotFound
from loki_shared.messages.mcp import McpReply, McpRequest, McpServerView, McpTestResult

from .config import CONFIG_FILE, ServerConfig
from .manager import McpManager


class McpApi:
    """The handler of ``loki.chat.mcp``.

    Args:
        manager: this instance's MCP manager.
    """

    def __init__(self, manager: McpManager) -> None:
        self.manager = manager

    def view(self, cfg: ServerConfig) -> McpServerView:
        state, error = self.manager.state_of(cfg.name)
        return McpServerView(
            name=cfg.name,
            transport=cfg.transport,
            source=cfg.source,
            url=cfg.url or None,
            command=cfg.command or None,
            args=list(cfg.args),
            header_names=sorted(cfg.headers),
            env_names=sorted(cfg.env),
            enabled=cfg.enabled,
            projects_off=sorted(cfg.projects_off),
            state=state,  # type: ignore[arg-type]
            error=error,
            tools=self.manager.tool_names(cfg.name),
        )

    def _server(self, name: str | None) -> ServerConfig:
        if not name:
            raise InvalidRequest("'name' (a server's name) is required")
        cfg = self.manager.configs.get(name)
        if cfg is None:
            raise NotFound(f"no MCP server named {name!r}")
        return cfg

    async def _reply(self, *names: str) -> McpReply:
        await self.manager.refresh()
        configs = self.manager.configs
        return McpReply(servers=[self.view(configs[n]) for n in names if n in configs])

    async def handle(self, req: McpRequest) -> McpReply:
        """Serve one request.

        Raises:
            InvalidRequest: a missing field, an edit of what only the file sets.
            NotFound: no server of that name.
            Conflict: ``add`` of a name already configured.
        """
        manager = self.manager
        await manager.refresh()
        if req.action == "list":
            return McpReply(servers=[self.view(c) for _, c in sorted(manager.configs.items())])
        if req.action == "add":
            spec = req.spec
            if spec is None:
                raise InvalidRequest("'spec' is required to add a server")
            if spec.name in manager.configs:
                raise Conflict(
                    f"an MCP server named {spec.name!r} exists: edit it or pick another name"
                )
            await manager.registry.put(spec.name, spec.model_dump(exclude={"name"}))
            return await self._reply(spec.name)
        cfg = self._server(req.name)
        if req.action == "test":
            ok, tools, error, ms = await manager.test(cfg)
            return McpReply(
                servers=[self.view(cfg)], test=McpTestResult(ok=ok, tools=tools, error=error, ms=ms)
            )
        if req.action == "delete":
            if cfg.source == "file":
                raise InvalidRequest(
                    f"{cfg.name!r} comes from LOKI_HOME/{CONFIG_FILE}: remove it there "
                    "(or switch it off with enabled: false)"
                )
            await manager.registry.delete(cfg.name)
            manager.forget(cfg.name)
            await manager.refresh()
            return McpReply(servers=[self.view(cfg)])
        patch = req.patch
        if patch is None:
            raise InvalidRequest("'patch' is required to update a server")
        # a field left out arrives as null (the message crossed NATS whole): null = not given
        given = {k: v for k, v in patch.model_dump().items() if v is not None}
        record: dict[str, Any] = dict(manager.records.get(cfg.name) or {})
        if cfg.source == "file":
            wrong = sorted(set(given) - {"enabled", "projects_off"})
            if wrong:
                raise InvalidRequest(
                    f"{', '.join(wrong)} of {cfg.name!r} are set in LOKI_HOME/{CONFIG_FILE} "
                    "only; the API changes its enabled and projects_off"
                )
            record = {**record, "overlay": True, **given}
        else:
            record.update(given)
        await manager.registry.put(cfg.name, record)
        return await self._reply(cfg.name)
