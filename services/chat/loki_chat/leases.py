"""The chat service's engine leases (``loki.engine.lease`` / ``renew`` / ``release``).

Every request Loki sends to the engine holds a lease from the supervisor: a turn's step
(kind ``main``) and a summary (kind ``compact``). All of the chat service's lease handling is
here, in one place, so that a shared lease mechanism replaces it as a unit.

- ``main``: :meth:`EngineLeases.lease` raises :class:`~loki_chat.errors.LeaseError` when no
  lease comes; the lease is renewed every half of its TTL until :meth:`EngineLeases.release`,
  which tells the supervisor the completion's ``prompt_tokens`` and ``cached_tokens``.
- ``compact``: :meth:`EngineLeases.compact_lease` returns None instead of raising (a summary
  without a lease falls back); :meth:`EngineLeases.compact_renewer` renews it every third of
  its TTL while the summary request runs; :meth:`EngineLeases.compact_release` never raises.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from loki_shared import subjects
from loki_shared.messages.base import RequestKind
from loki_shared.messages.engine import (
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)

from .bus import ChatBus
from .errors import LeaseError
from .settings import Settings

log = logging.getLogger("loki.chat.leases")


class EngineLeases:
    """Leases of one chat instance.

    Args:
        bus: the instance's NATS bus.
        settings: ``lease_timeout_s`` bounds a lease request (seconds); the supervisor is
            asked to wait 5 s less (at least 1 s).
    """

    def __init__(self, bus: ChatBus, settings: Settings) -> None:
        self.bus = bus
        self.settings = settings
        self._renewers: dict[str, asyncio.Task[None]] = {}

    # -- a turn's step ----------------------------------------------------------------------
    async def lease(self, cid: str, kind: RequestKind = "main") -> Lease:
        """A lease of ``kind`` for conversation ``cid``, renewed until :meth:`release`.

        Raises:
            LeaseError: no answer, an error reply, or no base URL.
        """
        wait = max(1.0, self.settings.lease_timeout_s - 5)
        try:
            lease = await self.bus.request(
                subjects.ENGINE_LEASE,
                LeaseRequest(kind=kind, conversation=cid, wait_s=wait),
                Lease,
                self.settings.lease_timeout_s,
            )
        except Exception as exc:
            raise LeaseError(f"no lease from the engine supervisor ({type(exc).__name__})") from exc
        if lease.error is not None:
            raise LeaseError(lease.error.message)
        if not lease.base_url:
            raise LeaseError("lease without base_url")
        if lease.ttl_s and lease.lease_id:
            self._renewers[lease.lease_id] = asyncio.create_task(self._renew(lease))
        return lease

    async def _renew(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(max(0.5, lease.ttl_s / 2))
            try:
                await self.bus.request(
                    subjects.ENGINE_RENEW, RenewRequest(lease_id=lease.lease_id), Lease, 5.0
                )
            except Exception:  # noqa: BLE001 - the release or the stream will tell
                log.warning("lease %s renewal failed", lease.lease_id)

    async def release(self, lease: Lease, usage: dict[str, Any] | None = None) -> None:
        """Stop renewing and give the lease back; ``usage`` (decoded, of a ``main``
        completion) tells the supervisor ``prompt_tokens`` and ``cached_tokens`` when known.
        Never raises (a lease not released expires by itself)."""
        task = self._renewers.pop(lease.lease_id, None)
        if task:
            task.cancel()
        if not lease.lease_id:
            return
        usage = usage or {}
        req = ReleaseRequest(
            lease_id=lease.lease_id,
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=usage.get("cached_tokens"),
        )
        try:
            await self.bus.request(subjects.ENGINE_RELEASE, req, ReleaseReply, 5.0)
        except Exception:  # noqa: BLE001 - the lease expires by itself
            log.warning("lease %s not released", lease.lease_id)

    # -- a summary --------------------------------------------------------------------------
    async def compact_lease(self, cid: str, continuation: bool) -> Lease | None:
        """A ``compact`` lease for conversation ``cid`` (``continuation``: the request
        continues the slot's cached prompt, so the supervisor routes it to that slot), or
        None (logged) when none came."""
        wait = max(1.0, self.settings.lease_timeout_s - 5)
        try:
            lease = await self.bus.request(
                subjects.ENGINE_LEASE,
                LeaseRequest(
                    kind="compact", conversation=cid, wait_s=wait, continuation=continuation
                ),
                Lease,
                wait + 5,
            )
        except Exception as exc:  # noqa: BLE001 - no lease: the caller falls back
            log.warning("[compact] no lease (%s)", type(exc).__name__)
            return None
        if lease.error is not None or not lease.base_url:
            log.warning("[compact] lease refused: %s", lease.error)
            return None
        return lease

    async def compact_release(self, lease: Lease) -> None:
        """Give a ``compact`` lease back (never raises: it expires by itself)."""
        if not lease.lease_id:
            return
        try:
            await self.bus.request(
                subjects.ENGINE_RELEASE, ReleaseRequest(lease_id=lease.lease_id), ReleaseReply, 5.0
            )
        except Exception:  # noqa: BLE001 - it expires by itself
            log.warning("[compact] lease %s not released", lease.lease_id)

    def compact_renewer(self, lease: Lease) -> asyncio.Task[None] | None:
        """A task renewing ``lease`` every third of its TTL (the caller cancels it), or None
        when the lease has no TTL."""
        if not lease.ttl_s or not lease.lease_id:
            return None

        async def loop() -> None:
            while True:
                await asyncio.sleep(max(0.5, lease.ttl_s / 3))
                try:
                    await self.bus.request(
                        subjects.ENGINE_RENEW, RenewRequest(lease_id=lease.lease_id), Lease, 5.0
                    )
                except Exception:  # noqa: BLE001 - the request's own outcome will tell
                    pass

        return asyncio.create_task(loop())
