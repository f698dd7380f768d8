"""NATS helpers shared by the services: the broker, the JetStream streams Loki declares, a
durable publish into one of them, and how a connection is closed when the service stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from faststream.exceptions import IncorrectState
from faststream.nats import JStream, NatsBroker
from faststream.nats.security import NatsUserPassword

from . import health, subjects
from .credentials import without_userinfo
from .errors import exception_middleware
from .lifecycle import one_line
from .logsetup import bus_logger

if TYPE_CHECKING:  # pragma: no cover
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig

    from .lifecycle import Steps

#: Seconds a connection that cannot be drained gets to close.
CLOSE_TIMEOUT_S = 1.0


#: The environment variable of :func:`stream_replicas`.
REPLICAS_ENV = "LOKI_JETSTREAM_REPLICAS"


def nats_servers(url: str) -> list[str]:
    """The server URLs of ``LOKI_NATS_URL``: one URL, or several separated by commas (the
    nodes of a NATS cluster, ``nats://n1:4222,nats://n2:4222,nats://n3:4222``), in the list
    form ``nats.connect`` and FastStream take (the client connects to one and moves to
    another when it goes away; the servers also announce the rest of their cluster).

    Raises:
        ValueError: no URL at all (an empty string or only commas).
    """
    found = [one.strip() for one in url.split(",") if one.strip()]
    if not found:
        raise ValueError(
            "LOKI_NATS_URL is empty: give nats://host:4222 (or several, comma-separated)"
        )
    return found


def stream_replicas() -> int:
    """How many copies of each Loki JetStream stream a NATS cluster keeps:
    ``LOKI_JETSTREAM_REPLICAS`` (1 by default: one server; 3 on a three-node cluster, so one
    node lost loses nothing). Read when a stream is declared, not at import.

    Raises:
        ValueError: not a whole number from 1 to 5 (JetStream's bound).
    """
    import os

    raw = os.environ.get(REPLICAS_ENV, "").strip() or "1"
    if not raw.isdigit() or not 1 <= int(raw) <= 5:
        raise ValueError(f"{REPLICAS_ENV}={raw!r}: give a whole number from 1 to 5")
    return int(raw)


def make_broker(
    url: str,
    name: str,
    health_check: health.Check | None = None,
    login: dict[str, Any] | None = None,
) -> NatsBroker:
    """A FastStream NATS broker for service ``name`` that reconnects forever and answers the
    health subjects ``loki.health.<name>`` (see :mod:`loki_shared.health`; the compose
    healthchecks ask them). ``health_check``, when given, runs on each health request: a
    non-empty dict it returns (or an exception) makes the answer unhealthy. ``login``: the
    service's NATS user (``LokiSettings.nats_options()``: ``user``, ``password``,
    ``inbox_prefix``); empty or None: no login.

    What a handler raises is answered by :func:`loki_shared.errors.exception_middleware`
    (the services' one error boundary: ``{"error": {"type", "message"}}``).

    FastStream's per-message "Received" / "Processed" lines go to
    :func:`~loki_shared.logsetup.bus_logger` at DEBUG (shown with ``LOKI_LOG_LEVEL=DEBUG``);
    its warnings and errors keep their level.

    The connection is opened by ``broker.start()`` / ``FastStream(broker).run()``.
    """
    login = dict(login or {})
    extra: dict[str, Any] = {}
    servers = nats_servers(url)
    if login.get("user"):  # the explicit login wins over one in the URL (as in nats-py)
        servers = [without_userinfo(one) for one in servers]
        extra["security"] = NatsUserPassword(login["user"], login.get("password") or "")
    if login.get("inbox_prefix"):
        extra["inbox_prefix"] = login["inbox_prefix"]
    broker = NatsBroker(
        servers,
        **extra,
        name=f"loki-{name}",
        max_reconnect_attempts=-1,
        # nats-py takes seconds as a float; FastStream annotates it as int
        reconnect_time_wait=0.5,  # type: ignore[arg-type]
        logger=bus_logger(name),
        log_level=logging.DEBUG,
        middlewares=[exception_middleware(logging.getLogger(f"loki.{name}"))],
    )
    health.attach(broker, name, check=health_check)
    return broker


def connection_callbacks(
    log: logging.Logger, on_reconnected: Callable[[], Awaitable[None]] | None = None
) -> dict[str, Any]:
    """``error_cb`` and ``reconnected_cb`` for ``nats.connect`` that say what happens in one
    line each: the first error after a working connection at WARNING, the failed reconnect
    attempts after it at DEBUG, and the reconnection at INFO. (nats-py's default logs every
    failed attempt, twice a second while NATS is away, with its traceback.)
    ``on_reconnected``, when given, is awaited after each reconnection (nats-py has sent the
    connection's subscriptions again by then); what it raises is logged."""
    state = {"quiet": False}

    async def error_cb(exc: Exception) -> None:
        if state["quiet"]:
            log.debug("NATS: %s", one_line(exc))
            return
        state["quiet"] = True
        log.warning("NATS: %s (reconnecting)", one_line(exc))

    async def reconnected_cb() -> None:
        state["quiet"] = False
        log.info("NATS: reconnected")
        if on_reconnected is not None:
            try:
                await on_reconnected()
            except Exception:  # a listener's failure never breaks the client
                log.warning("NATS: after reconnection", exc_info=True)

    return {"error_cb": error_cb, "reconnected_cb": reconnected_cb}


def broker_client(broker: NatsBroker) -> Client | None:
    """The nats-py client of a started broker; None when it is not connected (never
    started, or stopped)."""
    try:
        client: Client = broker.config.connection_state.connection
    except IncorrectState:
        return None
    return client


async def close_client(nc: Client, steps: Steps, drain_s: float | None = None) -> None:
    """Close a nats-py connection within the stop budget: drained (subscriptions finish what
    they hold, publications are flushed) when the server is there, else closed at once —
    draining needs the server, and a client left reconnecting keeps the process alive."""
    if nc.is_closed:
        return
    if nc.is_connected and not nc.is_draining:
        if await steps.run("drain the NATS connection", nc.drain, drain_s):
            return
    await _close(nc, steps)


async def _close(nc: Client, steps: Steps) -> None:
    if not nc.is_closed:
        await steps.run("close the NATS connection", nc.close, CLOSE_TIMEOUT_S)


async def until_routable(
    nc: Client, subject: str, probe: bytes, log: logging.Logger, tries: int = 100
) -> None:
    """Return once the server routes ``subject`` to a subscriber (this process's or another
    instance's): a request ``probe`` is answered, so a caller right after a service's start
    is never answered "no responders". Each try waits up to 1 s, 50 ms apart; after
    ``tries`` one WARNING line, and the start goes on (never raises for the bus)."""
    await nc.flush()
    for attempt in range(tries):
        try:
            await nc.request(subject, probe, timeout=1.0)
        except Exception as exc:  # noqa: BLE001 - not routable yet
            log.debug("subscriptions not routable yet (%s)", type(exc).__name__)
            await asyncio.sleep(0.05)
            continue
        if attempt:
            log.info("subscriptions routable after %d probes", attempt + 1)
        return
    log.warning("subscriptions still not routable after %d probes", tries)


async def stop_broker(broker: NatsBroker, steps: Steps, limit_s: float | None = None) -> None:
    """Stop a FastStream broker within the stop budget (``limit_s`` at most): subscribers
    stop taking messages and the handlers running get the time left, then the connection is
    drained; with NATS gone, or past the limit, the connection is closed instead."""
    nc = broker_client(broker)
    if nc is None:
        return
    if nc.is_connected and await steps.run("stop the NATS subscribers", broker.stop, limit_s):
        return
    await _close(nc, steps)


def perf_stream() -> JStream:
    """The perf ring: ``loki.perf.record`` kept in JetStream, at most 5000 messages, in
    :func:`stream_replicas` copies."""
    return JStream(
        name=subjects.STREAM_PERF,
        subjects=[subjects.PERF_RECORD],
        max_msgs=subjects.STREAM_PERF_MAX_MSGS,
        num_replicas=stream_replicas(),
    )


def events_stream() -> JStream:
    """Audit events (compactions, archives), kept in JetStream in :func:`stream_replicas`
    copies."""
    return JStream(
        name=subjects.STREAM_EVENTS,
        subjects=[subjects.EVENTS_COMPACTION, subjects.EVENTS_ARCHIVE],
        max_msgs=100_000,
        num_replicas=stream_replicas(),
    )


#: Seconds between two tries of :func:`publish_durable` within its ``retry_s``.
RETRY_PAUSE_S = 0.25


async def publish_durable(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    stream: StreamConfig,
    *,
    what: str,
    log: logging.Logger,
    timeout: float = 2.0,
    headers: dict[str, str] | None = None,
    retry_s: float = 0.0,
) -> bool:
    """Publish ``payload`` on ``subject`` into the JetStream stream ``stream.name`` and wait
    for its acknowledgement (``timeout`` seconds). When the stream does not exist it is
    created with ``stream`` and the publish retried once (with the same ``headers``: a
    ``Nats-Msg-Id`` among them makes JetStream store a retry only once).

    ``retry_s``: for that many seconds more, a publish that got no acknowledgement (timeout,
    no responder, the stream without a leader or not reachable yet: a NATS cluster electing
    a new stream leader after losing a node, a client reconnecting) is tried again every
    :data:`RETRY_PAUSE_S`, with the same headers; 0 (the default): no such retry.

    Best effort: ``what`` names the message in the WARNING logged on ``log`` when it is not
    stored (``"<what> not published: ..."``).

    Returns:
        True when JetStream stored it; False when it could not be (no connection, timeout,
        the stream refused or still missing after its creation; logged, nothing raised).
    """
    import nats.errors
    import nats.js.errors

    # nats.errors.Error: every nats-py failure (no responders, timeout, closed or
    # reconnecting connection, the server's API errors); OSError: the socket; ValueError: an
    # acknowledgement that is not JSON
    failures = (nats.errors.Error, OSError, ValueError)
    missing = (nats.js.errors.NoStreamResponseError, nats.js.errors.NotFoundError)
    transient = (nats.errors.TimeoutError, nats.errors.NoRespondersError, *missing)
    deadline = asyncio.get_running_loop().time() + retry_s
    created = False
    while True:
        try:
            await js.publish(
                subject,
                payload,
                timeout=timeout,
                stream=stream.name,
                headers=dict(headers) if headers is not None else None,
            )
            return True
        except missing as exc:
            if not created:
                created = True
                try:
                    await js.add_stream(config=stream)
                    continue
                except failures as create_exc:
                    if asyncio.get_running_loop().time() >= deadline:
                        log.warning("%s not published: cannot create stream: %s", what, create_exc)
                        return False
            elif asyncio.get_running_loop().time() >= deadline:
                log.warning("%s not published: no %s stream", what, stream.name)
                return False
            last: Exception = exc
        except transient as exc:
            last = exc
        except failures as exc:
            log.warning("%s not published: %s", what, exc)
            return False
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("%s not published: %s", what, last)
            return False
        await asyncio.sleep(RETRY_PAUSE_S)
