"""The gateway application: FastAPI with the routers of :mod:`loki_gateway.routes` (imported
here directly: a router that fails to import stops the start-up), the auth and body-limit
middleware, OpenAI-shaped errors (:func:`loki_gateway.errors.install`), the SSE hub and the
static web UI.

Build it with :func:`create_app` (``__main__`` does, with the settings read from the
environment); the NATS connection and the HTTP client towards the engine are opened in the
lifespan, or may be injected (tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import httpx
from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from loki_shared.lifecycle import Steps
from loki_shared.nats import close_client
from loki_shared.redis_client import redis_client

from . import errors
from .auth import ApiKeyMiddleware, BodyLimitMiddleware
from .bus import Bus
from .e2e import routes as e2e_routes
from .event_hub import EventHub
from .json_text import JsonTextMiddleware
from .memory_state import MemoryState
from .routes import (
    attachments,
    chat,
    code,
    code_colours,
    engine,
    engine_measure,
    mcp,
    memory,
    perf,
    project_memory,
    projects,
    recall,
    tasks,
    v1,
    workspace,
)
from .settings import Settings

log = logging.getLogger("loki.gateway")
STATIC = Path(__file__).parent / "static"


#: The routers, in the order they are included (one module per domain, each ``router``).
ROUTERS: dict[str, APIRouter] = {
    "chat": chat.router,
    "attachments": attachments.router,
    "recall": recall.router,
    "memory": memory.router,
    "projects": projects.router,
    "project_memory": project_memory.router,
    "engine": engine.router,
    "engine_measure": engine_measure.router,
    "perf": perf.router,
    "tasks": tasks.router,
    "mcp": mcp.router,
    "code": code.router,
    "workspace": workspace.router,
    "code_colours": code_colours.router,
    "v1": v1.router,
    "e2e": e2e_routes.router,  # issue 45: pairing and the sealed chat (loki_gateway.e2e)
}


async def _start_memory(app: FastAPI, settings: Settings) -> None:
    """Wire the user's memory key (:class:`loki_gateway.memory_state.MemoryState`, Redis +
    NATS) into ``app.state.memory``; retried every 5 s while Redis cannot be reached, so the
    rest of the gateway serves meanwhile."""
    while True:
        redis = redis_client(settings)
        memory = MemoryState(redis, app.state.bus.client)
        try:
            await memory.start()
        except Exception as exc:  # noqa: BLE001 - Redis/NATS not ready: retried below
            log.warning("memory state not started (%s): retrying in 5 s", exc)
            with suppress(Exception):  # half started: undone as far as it goes, then retried
                await memory.stop()
                await redis.aclose()
            await asyncio.sleep(5)
            continue
        app.state.memory = memory
        return


def create_app(settings: Settings, bus: Bus | None = None) -> FastAPI:
    """The gateway app. ``bus`` injected: used as is and not closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_bus = bus is None
        if bus is None:
            app.state.bus = await Bus.connect(settings.nats_url, settings.nats_options())
        else:
            app.state.bus = bus
        app.state.background = set()  # tasks that must outlive a request (perf records)
        app.state.hub = EventHub(app.state.bus.client, settings.sse_client_buffer)
        if isinstance(app.state.bus, Bus):
            app.state.bus.on_reconnect(app.state.hub.resync)
        app.state.http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout_s, connect=10.0, pool=60.0),
            # llama-server closes idle keep-alive connections after 5 s (cpp-httplib's
            # keep-alive timeout): drop ours a second sooner so a request never goes out on a
            # connection the engine is closing, but keep them long enough that a client
            # pausing between requests does not pay a reconnect.
            limits=httpx.Limits(
                max_connections=256, max_keepalive_connections=32, keepalive_expiry=4.0
            ),
            trust_env=False,
        )
        memory_task = asyncio.create_task(_start_memory(app, settings))
        log.info("gateway ready (routers: %s)", ", ".join(ROUTERS))
        try:
            yield
        finally:
            # Each step bounded, within what is left of LOKI_STOP_TIMEOUT_S after uvicorn
            # closed the open requests (loki_shared.lifecycle).
            stop = getattr(app.state, "stop", None)
            steps = stop.steps() if stop is not None else Steps(settings.stop_timeout_s, log)
            memory_task.cancel()
            if app.state.background:  # perf records still on their way: let them land
                await steps.run(
                    "publish the last perf records", asyncio.wait(set(app.state.background)), 3.0
                )
            memory = getattr(app.state, "memory", None)
            if memory is not None:
                await steps.run("stop the memory state", memory.stop, 1.0)
            await steps.run("close the engine connections", app.state.http.aclose, 1.0)
            if own_bus:
                await close_client(app.state.bus.client, steps)

    app = FastAPI(
        title="Loki gateway",
        version="0.1.0",
        description="Web UI, Loki's /api and an OpenAI-compatible /v1.",
        lifespan=lifespan,
        # The schema stays at /openapi.json (behind the key when one is set, auth.py); the
        # Swagger and ReDoc pages are off: FastAPI's load their scripts from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.image_policy = settings.image_policy()
    errors.install(app)
    for router in ROUTERS.values():
        app.include_router(router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """Liveness for containers: no auth, no secrets."""
        connected = bool(getattr(app.state, "bus", None) and app.state.bus.client.is_connected)
        return JSONResponse(
            {"ok": connected, "nats": connected}, status_code=200 if connected else 503
        )

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        """The chat page."""
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        """The tab icon, asked for at this path by browsers (an SVG, which they accept)."""
        return FileResponse(
            STATIC / "favicon.svg",
            media_type="image/svg+xml",
            headers={"Cache-Control": "max-age=86400"},
        )

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    # The e2e PWA (issue 45) under its own path: its service worker's scope is /e2e/.
    app.mount("/e2e", e2e_routes.PwaFiles(directory=STATIC / "e2e", html=True), name="e2e")

    # Outermost first: CORS, size limit, auth, then the JSON text rule (middleware added last
    # runs first).
    app.add_middleware(JsonTextMiddleware)
    app.add_middleware(ApiKeyMiddleware, key=settings.key())
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    origins = settings.cors()
    if origins:
        # Starlette's CORS middleware answers a preflight (OPTIONS with
        # Access-Control-Request-Method) itself, before the key check: a browser never
        # sends the key on a preflight. Real answers (401s included) get
        # Access-Control-Allow-Origin. The key is a header, not a cookie: no credentials.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["*"],
            max_age=600,
        )
    return app
