"""The chat service's engine leases: what it asks for, held through :mod:`loki_shared.lease`.

Every request Loki sends to the engine holds a lease from the supervisor: a turn's step
(kind ``main``) and a summary (kind ``compact``). Both are the shared client's
``async with`` leases (renewed every ``ttl_s / 3``, released once on every way out, a
cancelled holder included); this module only says what to ask for.

- ``main``: :meth:`EngineLeases.lease`; waiting for it ends with
  :class:`~loki_shared.lease.LeaseStopped` when the turn is stopped; the step reports its
  ``prompt_tokens`` and ``cached_tokens`` for the release (:meth:`EngineLease.report`).
- ``compact``: :meth:`EngineLeases.compact_lease` (``continuation``: the request continues
  the slot's cached prompt, so the supervisor routes it to that slot).

Both raise :class:`~loki_shared.lease.LeaseError` on entry when no lease comes.
"""

from __future__ import annotations

import asyncio

from loki_shared.lease import EngineLease, lease
from loki_shared.messages.base import RequestKind
from loki_shared.messages.engine import LeaseRequest

from .bus import ChatBus
from .settings import Settings


class EngineLeases:
    """Leases of one chat instance.

    Args:
        bus: the instance's NATS bus (its broker carries the requests).
        settings: ``lease_timeout_s`` bounds a lease request (seconds); the supervisor is
            asked to wait 5 s less (at least 1 s).
    """

    def __init__(self, bus: ChatBus, settings: Settings) -> None:
        self.bus = bus
        self.settings = settings

    def _wait_s(self) -> float:
        return max(1.0, self.settings.lease_timeout_s - 5)

    def lease(
        self,
        cid: str,
        kind: RequestKind = "main",
        stop: asyncio.Event | None = None,
        wait_s: float | None = None,
    ) -> EngineLease:
        """A lease of ``kind`` for conversation ``cid``, to hold with ``async with``;
        ``stop`` set while waiting gives up (``LeaseStopped``). ``wait_s``: how long the
        supervisor may queue it (s; default ``lease_timeout_s - 5``; the NATS request then
        waits 5 s more)."""
        if wait_s is None:
            wait_s, timeout = self._wait_s(), self.settings.lease_timeout_s
        else:
            timeout = wait_s + 5
        return lease(
            self.bus.broker,
            LeaseRequest(kind=kind, conversation=cid, wait_s=wait_s),
            timeout=timeout,
            stop=stop,
        )

    def compact_lease(self, cid: str, continuation: bool) -> EngineLease:
        """A ``compact`` lease for conversation ``cid``, to hold with ``async with``."""
        return lease(
            self.bus.broker,
            LeaseRequest(
                kind="compact",
                conversation=cid,
                wait_s=self._wait_s(),
                continuation=continuation,
            ),
        )
