"""The chat service's NATS connection: typed request/reply, publishing, background work.

One :class:`ChatBus` per chat instance wraps its FastStream ``NatsBroker``; everything in
``loki_chat`` that talks to another service goes through it, checked against the subject table
(:data:`loki_shared.subjects.EXCHANGES`) (the subscribers themselves are
declared on the broker by :mod:`loki_chat.handlers`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from faststream.exceptions import IncorrectState
from pydantic import BaseModel

from loki_shared import subjects
from loki_shared.messages.perf import PerfRecord
from loki_shared.perf_publish import jetstream_of, publish_record

log = logging.getLogger("loki.chat.bus")

R = TypeVar("R", bound=BaseModel)


class ChatBus:
    """Typed access to NATS for the chat service.

    Args:
        broker: a FastStream ``NatsBroker`` (started before the first request).
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._bg: set[asyncio.Task[Any]] = set()

    async def request(
        self, subject: str, message: BaseModel, reply_type: type[R], timeout: float
    ) -> R:
        """Send ``message`` on ``subject``; return the reply decoded as ``reply_type``.

        Raises:
            TypeError: ``message`` or ``reply_type`` is not what
                :data:`loki_shared.subjects.EXCHANGES` says ``subject`` carries.
            Exception: whatever the broker raises on no responders or timeout (callers map
                it: a lease error, "unreachable" tool results, a forward retried later), and
                ``pydantic.ValidationError`` for a reply that is not a ``reply_type``.
        """
        subjects.check(subject, message, reply_type)
        msg = await self.broker.request(message, subject, timeout=timeout)
        return reply_type.model_validate_json(msg.body)

    async def publish(self, message: BaseModel, subject: str) -> None:
        """Publish ``message`` on ``subject`` (core NATS; raises on a broken connection, and
        TypeError when the subject table names another message type)."""
        subjects.check(subject, message)
        await self.broker.publish(message, subject)

    def publish_perf(self, record: PerfRecord) -> None:
        """Publish a perf record in the background (never fails the caller; see
        :func:`loki_shared.perf_publish.publish_record`)."""
        self.spawn(publish_record(self.broker, record))

    def jetstream(self) -> Any:
        """The nats-py JetStream context of the connection.

        Raises:
            faststream.exceptions.IncorrectState: the broker is not connected.
        """
        return jetstream_of(self.broker)

    @property
    def connection(self) -> Any:
        """The nats-py ``Client`` behind the broker, or None before it is connected."""
        state = getattr(getattr(self.broker, "config", None), "connection_state", None)
        try:
            return getattr(state, "connection", None)
        except IncorrectState:  # FastStream's state before connecting
            return None

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; :meth:`drain` waits for what is still running."""
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def drain(self, timeout: float = 3.0) -> None:
        """Wait at most ``timeout`` seconds for the background work still running."""
        if self._bg:
            await asyncio.wait(self._bg, timeout=timeout)
