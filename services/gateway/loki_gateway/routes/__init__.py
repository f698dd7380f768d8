"""One router per domain (``chat``, ``recall``, ``memory``, ``engine``, ``perf``, ``tasks``,
``mcp``, ``code`` and ``workspace`` (code mode), ``code_colours`` (the file viewer's colours),
``v1``);
each module exposes ``router = fastapi.APIRouter()`` and :mod:`loki_gateway.app` imports and
includes every one of them (:data:`loki_gateway.app.ROUTERS`).
"""
