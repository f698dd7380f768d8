"""One router per domain (``chat``, ``recall``, ``memory``, ``engine``, ``perf``, ``tasks``,
``v1``);
each module exposes ``router = fastapi.APIRouter()`` and :mod:`loki_gateway.app` imports and
includes every one of them (:data:`loki_gateway.app.ROUTERS`).
"""
