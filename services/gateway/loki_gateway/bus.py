"""The gateway's NATS connection: typed request/reply and subscriptions (nats-py); every
request is checked against the subject table (:data:`loki_shared.subjects.EXCHANGES`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, ValidationError

from loki_shared import subjects
from loki_shared.errors import from_info
from loki_shared.messages.base import Reply
from loki_shared.nats import connection_callbacks, nats_servers

from .errors import ServiceUnavailable, UpstreamError

R = TypeVar("R", bound=BaseModel)
#: Seconds between two asks of a request that found no responders (see :meth:`Bus.request`).
PATIENCE_EVERY_S = 0.25
#: The patience of what a page opens with (a stream's first page, a history page, the state,
#: the conversation list): a chat instance reconnecting after its NATS node died.
READ_PATIENCE_S = 5.0


class Bus:
    """Wraps one nats-py connection for the gateway's routes.

    ``request`` sends a pydantic message and decodes the reply into ``reply_type``.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        #: awaited after each reconnection to NATS (see :meth:`on_reconnect`)
        self.reconnect_listeners: list[Callable[[], Awaitable[None]]] = []

    def on_reconnect(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Await ``listener`` after each reconnection to NATS (the subscriptions are back on
        the server by then): what was published while the connection was away is gone for
        this client, and the listener makes up for it (the SSE hub replays)."""
        self.reconnect_listeners.append(listener)

    async def _reconnected(self) -> None:
        for listener in list(self.reconnect_listeners):
            await listener()

    @classmethod
    async def connect(cls, url: str, login: dict[str, Any] | None = None) -> Bus:
        """Connect to ``url``, logged in with ``login`` (``Settings.nats_options()``: the
        gateway's NATS user and reply-inbox prefix; empty: no login)."""
        listeners: list[Bus] = []

        async def reconnected() -> None:
            if listeners:
                await listeners[0]._reconnected()

        client = await nats.connect(
            nats_servers(url),
            **(login or {}),
            name="loki-gateway",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **connection_callbacks(logging.getLogger("loki.gateway.nats"), reconnected),
        )
        bus = cls(client)
        listeners.append(bus)
        return bus

    async def request(
        self,
        subject: str,
        message: BaseModel,
        reply_type: type[R],
        timeout: float = 5.0,
        patience_s: float = 0.0,
    ) -> R:
        """Send ``message`` on ``subject`` and return the reply decoded as ``reply_type``.

        ``patience_s``: "no responders" is asked again every :data:`PATIENCE_EVERY_S` for up
        to that long — a service whose NATS node died is back on another node within a second
        or two (its subscriptions with it). NATS says "no responders" only when no subscriber
        received the request, so asking again never doubles it; a timeout (it may have been
        received) is not asked again. Given to what a page opens with (:data:`READ_PATIENCE_S`),
        so that elsewhere a service really down is still said at once.

        Raises:
            TypeError: ``message`` or ``reply_type`` is not what
                :data:`loki_shared.subjects.EXCHANGES` says ``subject`` carries.
            ServiceUnavailable: no service answers ``subject`` (no responders or timeout).
            UpstreamError: the reply is not a valid ``reply_type``.
        """
        subjects.check(subject, message, reply_type)
        payload = message.model_dump_json().encode()
        give_up = time.monotonic() + patience_s
        while True:
            try:
                msg = await self.client.request(subject, payload, timeout=timeout)
                break
            except NoRespondersError as exc:
                if time.monotonic() + PATIENCE_EVERY_S > give_up:
                    raise ServiceUnavailable(f"no answer on {subject}") from exc
                await asyncio.sleep(PATIENCE_EVERY_S)
            except NatsTimeout as exc:
                raise ServiceUnavailable(f"no answer on {subject}") from exc
        try:
            return reply_type.model_validate_json(msg.data)
        except ValidationError as exc:
            raise UpstreamError(f"bad reply on {subject}: {exc.errors()[:1]}") from exc

    async def request_ok(
        self,
        subject: str,
        message: BaseModel,
        reply_type: type[R],
        timeout: float = 5.0,
        patience_s: float = 0.0,
    ) -> R:
        """Like :meth:`request`, and raise the reply's own error when it carries one.

        Raises:
            ServiceUnavailable, UpstreamError: see :meth:`request`.
            LokiError: the reply's ``error`` is set: the :mod:`loki_shared.errors` class of
                its ``type`` (the exception handlers give its HTTP status).
        """
        reply = await self.request(subject, message, reply_type, timeout, patience_s)
        if isinstance(reply, Reply) and reply.error is not None:
            raise from_info(reply.error)
        return reply

    async def close(self) -> None:
        await self.client.drain()
