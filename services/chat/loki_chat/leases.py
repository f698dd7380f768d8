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

- ``prewarm``: :meth:`EngineLeases.prewarm_lease` (PREWARM: low priority, pre-empted by
  any real request; short wait and TTL).

All raise :class:`~loki_shared.lease.LeaseError` on entry when no lease comes.

Every request also names ``fingerprints``: :func:`loki_shared.fingerprint.fingerprints` of
the messages it will send (``LeaseRequest.prompt_fingerprints``, issue 44: with several
engines the supervisor grants the slot whose last prompt shares the longest prefix; empty:
unknown). Where the messages depend on the lease, the caller anticipates them with its
previous lease (:func:`loki_chat.step.preview`).
"""

from __future__ import annotations

import asyncio
import uuid

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
        instance: this instance's id; the leases name this process as their ``holder``
            (the id and a random part drawn at start, so a restarted instance with the same
            id is another holder): a grant it never claims lets the supervisor drop the
            dead process's other waiters at once.
    """

    def __init__(self, bus: ChatBus, settings: Settings, instance: str = "chat") -> None:
        self.bus = bus
        self.settings = settings
        self.holder = f"{instance}:{uuid.uuid4().hex[:8]}"
        #: set when the instance stops: a lease exited from then on is released in the
        #: background (the turn persists its partial reply first; the TTL covers the rest)
        self.closing = False
        #: ``main`` leases asked so far (PREWARM after a restart: a turn's step asked since
        #: the engine came back has the slot, so the prewarm is dropped)
        self.main_asked = 0

    def _wait_s(self) -> float:
        return max(1.0, self.settings.lease_timeout_s - 5)

    def lease(
        self,
        cid: str,
        kind: RequestKind = "main",
        stop: asyncio.Event | None = None,
        wait_s: float | None = None,
        fingerprints: list[str] | None = None,
    ) -> EngineLease:
        """A lease of ``kind`` for conversation ``cid``, to hold with ``async with``;
        ``stop`` set while waiting gives up (``LeaseStopped``). ``wait_s``: how long the
        supervisor may queue it (s; default ``lease_timeout_s - 5``; the NATS request then
        waits 5 s more). ``fingerprints``: of the messages the request will send (module
        docstring; None: unknown)."""
        if kind == "main":
            self.main_asked += 1
        if wait_s is None:
            wait_s, timeout = self._wait_s(), self.settings.lease_timeout_s
        else:
            timeout = wait_s + 5
        return lease(
            self.bus.broker,
            LeaseRequest(
                kind=kind,
                conversation=cid,
                wait_s=wait_s,
                holder=self.holder,
                prompt_fingerprints=list(fingerprints or ()),
            ),
            timeout=timeout,
            stop=stop,
            detach=self._closing,
        )

    def _closing(self) -> bool:
        return self.closing

    def compact_lease(
        self, cid: str, continuation: bool, fingerprints: list[str] | None = None
    ) -> EngineLease:
        """A ``compact`` lease for conversation ``cid``, to hold with ``async with``
        (``fingerprints``: of the messages the summary request sends, or of the prefix it
        continues; None: unknown)."""
        return lease(
            self.bus.broker,
            LeaseRequest(
                kind="compact",
                conversation=cid,
                wait_s=self._wait_s(),
                continuation=continuation,
                holder=self.holder,
                prompt_fingerprints=list(fingerprints or ()),
            ),
            detach=self._closing,
        )

    def prewarm_lease(
        self, cid: str, wait_s: float | None = None, fingerprints: list[str] | None = None
    ) -> EngineLease:
        """A ``prewarm`` lease for conversation ``cid`` (PREWARM, :mod:`loki_chat.prewarm`):
        a short wait (``wait_s``, :data:`PREWARM_WAIT_S` by default: a busy engine is not
        prewarmed) and a short TTL (:data:`PREWARM_TTL_S`, renewed every third), so a
        pre-emption by the supervisor is seen at the next renewal. ``fingerprints``: of the
        prefix it sends (None: unknown)."""
        wait = PREWARM_WAIT_S if wait_s is None else wait_s
        return lease(
            self.bus.broker,
            LeaseRequest(
                kind="prewarm",
                conversation=cid,
                wait_s=wait,
                ttl_s=PREWARM_TTL_S,
                holder=self.holder,
                prompt_fingerprints=list(fingerprints or ()),
            ),
            timeout=wait + 3.0,
        )


#: Seconds a prewarm waits for its lease (the supervisor's queue); past it, no prewarm.
PREWARM_WAIT_S = 2.0
#: TTL of a prewarm lease (s): renewed every 0.5 s, so a pre-emption is seen within 0.5 s.
PREWARM_TTL_S = 1.5
