"""``GET /api/engine/events``: the engine's info pushed to the web UI over SSE, so its pill
follows the engine (ready, starting, failed, generating) without the page polling.

Each client's stream sends one ``event: engine`` frame (data: the ``GET /api/engine`` body)
at once, then one more each time that body changes. A change is looked for at once when the
supervisor publishes ``loki.engine.state`` (a state change: starting, ready, failed...), and
every :data:`WATCH_S` seconds otherwise, which is how the end of a generation (the lease
released, ``in_flight`` back to 0) reaches the page within about a second: the supervisor
publishes no event on a lease. The supervisor not answering sends ``{"state": "unknown"}``
once (and the stream goes on watching).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from loki_shared import subjects
from loki_shared.errors import LokiError
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest

from .bus import Bus

log = logging.getLogger("loki.gateway.engine_watch")

#: Seconds between two reads of the engine's info while a client listens (a state event
#: reads it at once).
WATCH_S = 1.0

#: What a client is sent while the supervisor does not answer.
UNKNOWN: dict[str, Any] = {"state": "unknown"}


def engine_body(info: EngineInfo) -> dict[str, Any]:
    """The ``GET /api/engine`` body of ``info``: every field but ``error`` and ``api_key``;
    with several engines (issue 44) ``engines`` (one ``EngineSummary`` each), ``routing``,
    ``instance`` and ``leader`` pass through, each engine's ``base_url`` without user
    information (a followed URL written ``http://user:secret@host``: the secret stays in
    the supervisor)."""
    body = info.model_dump(mode="json", exclude={"error", "api_key"})
    for engine in body.get("engines") or []:
        engine["base_url"] = without_userinfo(engine.get("base_url") or "")
    return body


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` removed from its authority (unchanged else)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    return f"{scheme}://{authority}{slash}{path}"


async def read_info(bus: Bus) -> dict[str, Any]:
    """The ``GET /api/engine`` body (:func:`engine_body`), or :data:`UNKNOWN` when the
    supervisor does not answer."""
    try:
        info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
    except (TimeoutError, LokiError) as exc:
        log.debug("engine info not read: %s", exc)
        return dict(UNKNOWN)
    return engine_body(info)


async def engine_frames(bus: Bus, interval: float = WATCH_S) -> AsyncIterator[dict[str, Any]]:
    """The SSE frames (``{"event": "engine", "data": <json>}``) of one client: the info at
    once, then each change of it. Runs until the client goes (the generator is closed)."""
    kick = asyncio.Event()

    async def on_state(_msg: Any) -> None:
        kick.set()

    sub = await bus.client.subscribe(subjects.ENGINE_STATE, cb=on_state)
    try:
        last = ""
        while True:
            kick.clear()
            body = json.dumps(await read_info(bus), separators=(",", ":"), sort_keys=True)
            if body != last:
                last = body
                yield {"event": "engine", "data": body}
            try:
                await asyncio.wait_for(kick.wait(), interval)
            except TimeoutError:
                pass
    finally:
        try:
            await sub.unsubscribe()
        except Exception:  # the connection closing: nothing left to unsubscribe
            log.debug("engine state unsubscribe failed", exc_info=True)
