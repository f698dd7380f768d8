"""One router per domain; :mod:`loki_gateway.app` includes every module listed in ROUTERS.

Each module exposes ``router = fastapi.APIRouter()``.
"""

ROUTERS = ["chat", "recall", "memory", "engine", "perf", "v1"]
