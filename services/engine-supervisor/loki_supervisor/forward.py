"""Replicated supervisors (``LOKI_SUPERVISOR_REPLICATED``): every instance serves the lease
subjects in the queue group ``engine``; the leader (:mod:`.leadership`) grants, and another
instance forwards ``lease``, ``renew`` and ``release`` to the leader's own subject
(``loki.engine.node.<leader>.<op>``, :func:`loki_shared.subjects.engine_node`) and relays its
answer.

- A lease request (it may wait a minute in the leader's queue) is not relayed but handed over:
  the non-leader publishes it to the leader's node subject with the asker's own reply subject
  (:meth:`Replicas.lease_message`), so the leader answers the asker directly and the
  non-leader dying meanwhile costs nothing; a request handed to a leader that died is asked
  again by its client once it sees the new leader's ``boot``.
- No leader known, or the known one does not answer (killed: no responders): the request waits
  for the next leader, within its own budget (``wait_s`` for a lease, :data:`CONTROL_WAIT_S`
  for a renewal or a release), then is answered ``unavailable``. The client's renew loop
  (:mod:`loki_shared.lease`) retries such an answer; only ``not_found`` loses a lease.
- ``loki.engine.presets`` is forwarded the same way (the leader applies a saved or switched
  preset to the engines it grants); an instance that becomes the leader applies the active
  preset first when it differs from the one it runs (``on_lead``). So are ``loki.engine.bench``
  and ``loki.engine.optimise`` (:meth:`Replicas.leader_op`): a measurement leases its slots
  from the lease book, which only the leader keeps, and its job's progress lives in the
  instance that runs it, so every instance answers with the leader's job.
- A forwarded renewal, release, info, presets, bench or optimise request reaching an instance
  that no longer
  leads is answered ``conflict`` ("not the leader") on the node subject, and the forwarder asks
  again; a handed-over lease request is handed on (:meth:`Replicas.lease_message`).
- ``loki.engine.info`` is answered by any instance: a non-leader asks the leader's
  (``loki.engine.node.<leader>.info``, its leases and queues; its own view when the leader does
  not answer within :data:`INFO_TIMEOUT_S`), with ``instance`` = its own id, ``leader`` and
  ``boot`` = the leader's epoch (the highest seen), so a lease waiter whose leader died sees a
  new ``boot`` once the next one leads, and asks again.

The leader: on taking over it loads the mirrored leases (:mod:`.lease_mirror`) and grants; it
syncs the mirror before answering every lease, renewal and release; stepping down it stops
granting at once; its queued waiters are kept, granted if the same term comes back (a renewal
failed while its key stayed this instance's), else left to time out unanswered (their clients
ask the new leader when they see its epoch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from loki_shared import subjects
from loki_shared.errors import Conflict, InvalidRequest, Unavailable, error_info
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    PresetsReply,
    PresetsRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)

from .leadership import Leadership, stop_task
from .lease_book import LeaseManager
from .lease_mirror import SYNC_EVERY_S, Fenced, LeaseMirror

log = logging.getLogger("loki_supervisor.forward")

#: How long a renewal or release waits for a leader before it is answered ``unavailable`` (s;
#: under the client's 5 s timeout).
CONTROL_WAIT_S = 4.0
#: Added to a forwarded lease's ``wait_s`` for its NATS timeout (s).
LEASE_MARGIN_S = 5.0
#: How long a presets request waits for a leader (s); its answer may take 6 s more (a
#: preview reads the launch facts): under the gateway's 15 s.
PRESETS_WAIT_S = 8.0
#: How long a bench or optimise request waits for a leader (s); its answer is at once (a job
#: starts in the background) but for reading the stored runs: under the gateway's 30 s.
MEASURE_WAIT_S = 8.0
_MARGIN_S = {"lease": LEASE_MARGIN_S, "presets": 6.0, "bench": 6.0, "optimise": 6.0}
#: Pause before a lease request handed to an instance that no longer leads is handed on (s).
HAND_ON_PAUSE_S = 0.05
#: How long a non-leader waits for the leader's info (s; under the lease waiters' 1 s check).
INFO_TIMEOUT_S = 0.4
#: The answer of an instance asked on its node subject while it does not lead.
NOT_LEADER = "not the leader"

R = TypeVar("R", bound=BaseModel)
Q = TypeVar("Q", bound=BaseModel)
Request = Callable[[str, bytes, float], Awaitable[bytes]]
#: ``(subject, payload, reply subject)``: one NATS publish.
Publish = Callable[[str, bytes, str], Awaitable[None]]


class Replicas:
    """This instance's side of the replicated supervisors.

    Args:
        leases: the supervisor's lease manager (paused while this instance does not lead).
        leadership: the election (its ``on_gain``/``on_loss`` are set here).
        mirror: the leases mirrored in Redis.
        request: ``(subject, payload, timeout) -> reply bytes`` over NATS (set once the
            broker is connected, :meth:`connect`).
        lease, renew, release: the supervisor's own handlers (run while leading).
        api_key: the current key of a lease's endpoint (leases loaded from the mirror).
        info: this instance's own :class:`EngineInfo` (the supervisor's view).
        presets: the supervisor's ``loki.engine.presets`` handler (run while leading).
        on_lead: awaited once this instance leads, after the mirror is loaded (the
            supervisor applies the active preset when another instance changed it).
    """

    def __init__(
        self,
        leases: LeaseManager,
        leadership: Leadership,
        mirror: LeaseMirror,
        lease: Callable[[LeaseRequest], Awaitable[Lease]],
        renew: Callable[[RenewRequest], Lease],
        release: Callable[[ReleaseRequest], Awaitable[ReleaseReply]],
        api_key: Callable[[Lease], str | None] | None = None,
        info: Callable[[], EngineInfo] = EngineInfo,
        presets: Callable[[PresetsRequest], Awaitable[PresetsReply]] | None = None,
        on_lead: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.leases = leases
        self.leadership = leadership
        self.mirror = mirror
        self.instance = leadership.instance
        self._lease = lease
        self._renew = renew
        self._release = release
        self._api_key = api_key
        self._info = info
        self._presets = presets
        self._on_lead = on_lead
        self._request: Request | None = None
        self._publish: Publish | None = None
        self._paused = False
        self._epoch: int | None = None  # the last term this instance led
        self._syncer: asyncio.Task[None] | None = None
        self.forwarded = 0
        leadership.on_gain = self._gain
        leadership.on_loss = self._loss
        self._pause()  # nothing is granted until this instance leads

    # ------------------------------------------------------------------ lifecycle
    def connect(self, request: Request, publish: Publish | None = None) -> None:
        """Use ``request`` to forward to the leader (and ``publish`` to answer and hand over
        lease requests, :meth:`lease_message`)."""
        self._request = request
        self._publish = publish

    def start(self) -> None:
        """Start the election and the periodic mirror sync (from a running event loop)."""
        self.leadership.start()
        if self._syncer is None:
            self._syncer = asyncio.create_task(self._sync_loop(), name="lease-mirror-sync")

    async def close(self) -> None:
        """Stop syncing and leave the election (a leader deletes its key)."""
        if self._syncer is not None:
            await stop_task(self._syncer)
            self._syncer = None
        await self.leadership.close()

    def _pause(self) -> None:
        if not self._paused:
            self._paused = True
            self.leases.pause()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            self.leases.resume()

    async def _gain(self, epoch: int) -> None:
        if epoch == self._epoch:
            # the same term again (its key never left this instance, so nobody else led):
            # the leases and the queue here are still the truth
            self._resume()
            return
        self._epoch = epoch
        # waiters queued in an earlier term were asked again by their clients (they saw the
        # new epoch): never granted
        stale = list(self.leases._waiting)
        self.leases._waiting.clear()
        if stale:
            log.info("%d lease request(s) of an earlier term left unanswered", len(stale))
        try:
            await self.mirror.load(self._api_key)
        finally:
            self._resume()
        await self._sync()
        if self._on_lead is not None:
            await self._on_lead()

    async def _loss(self) -> None:
        # grant nothing; the queue is kept: the same term may come back (a renewal failed
        # while the key stayed this instance's), else its clients ask the new leader
        self._pause()

    async def _sync(self) -> None:
        try:  # bounded: a Redis that hangs delays an answer by a third of the leader TTL
            await asyncio.wait_for(self.mirror.sync(), self.leadership.ttl_s / 3)
        except Fenced as exc:
            log.warning("lease mirror write refused: %s", exc)
        except Exception as exc:  # noqa: BLE001 - Redis away: the next sync writes it
            log.warning("lease mirror not written: %s", type(exc).__name__)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_EVERY_S)
            if self.leadership.granting:
                await self._sync()

    # ------------------------------------------------------------------ the handlers
    async def lease(self, req: LeaseRequest) -> Lease:
        """A lease granted here while leading, else relayed through the leader (the
        in-process form of :meth:`lease_message`, which the service serves)."""
        return await self._route("lease", req, Lease, self._lease_here, float(req.wait_s))

    async def lease_message(self, body: bytes, reply_to: str, handed: bool = False) -> None:
        """``loki.engine.lease`` (queue group) and ``loki.engine.node.<self>.lease``
        (``handed``: another instance handed it here) as a raw message: granted here while
        leading (answered on ``reply_to``), else handed to the leader's node subject with
        ``reply_to`` as its reply subject (the leader answers the asker); ``unavailable``
        when no leader appears within the request's ``wait_s``. A handed request reaching an
        instance that no longer leads is handed on after the leader key is read again.

        Raises:
            RuntimeError: :meth:`connect` was not given ``publish``.
        """
        if self._publish is None:
            raise RuntimeError("lease_message needs connect(..., publish)")
        try:
            req = LeaseRequest.model_validate_json(body)
        except ValidationError as exc:
            bad = InvalidRequest(f"invalid LeaseRequest: {exc.errors()[:1]}")
            await self._answer(reply_to, Lease(error=bad.info()))
            return
        deadline = time.monotonic() + max(0.0, float(req.wait_s))
        while True:
            if self.leadership.granting:
                try:
                    reply = await self._lease_here(req)
                except Exception as exc:  # answered as the middleware would
                    info = error_info(exc)
                    if info.type == "internal":
                        log.error("lease failed: %s", info.message, exc_info=exc)
                    reply = Lease(error=info)
                await self._answer(reply_to, reply)
                return
            if handed:  # the sender's view of the leader was stale: read the key first
                handed = False
                await asyncio.sleep(HAND_ON_PAUSE_S)
                await self.leadership.refresh(INFO_TIMEOUT_S)
                continue
            leader = self.leadership.other_leader()
            if leader is not None and reply_to:
                await self._publish(subjects.engine_node(leader.instance, "lease"), body, reply_to)
                self.forwarded += 1
                return
            left = deadline - time.monotonic()
            if left <= 0:
                none = Unavailable("no supervisor leads: the lease was not served")
                await self._answer(reply_to, Lease(error=none.info()))
                return
            await self.leadership.wait_change(min(0.25, left))

    async def _answer(self, reply_to: str, reply: Lease) -> None:
        if reply_to and self._publish is not None:
            await self._publish(reply_to, reply.model_dump_json().encode(), "")

    async def renew(self, req: RenewRequest) -> Lease:
        """``loki.engine.renew`` (queue group)."""
        return await self._route("renew", req, Lease, self._renew_here, CONTROL_WAIT_S)

    async def release(self, req: ReleaseRequest) -> ReleaseReply:
        """``loki.engine.release`` (queue group)."""
        return await self._route("release", req, ReleaseReply, self._release_here, CONTROL_WAIT_S)

    async def presets(self, req: PresetsRequest) -> PresetsReply:
        """``loki.engine.presets`` (queue group): served by the leader (see the module
        docstring)."""
        return await self._route("presets", req, PresetsReply, self._presets_here, PRESETS_WAIT_S)

    async def node_presets(self, req: PresetsRequest) -> PresetsReply:
        """``loki.engine.node.<self>.presets``."""
        self._leading()
        return await self._presets_here(req)

    async def _presets_here(self, req: PresetsRequest) -> PresetsReply:
        if self._presets is None:
            raise Unavailable("presets are not served here")
        return await self._presets(req)

    def leader_op(
        self,
        op: str,
        handler: Callable[[Q], Awaitable[R]],
        reply_type: type[R],
        wait_s: float = MEASURE_WAIT_S,
    ) -> tuple[Callable[[Q], Awaitable[R]], Callable[[Q], Awaitable[R]]]:
        """The two handlers of a request only the leader serves (``op`` one of
        :data:`loki_shared.subjects.ENGINE_NODE_OPS`): the queue group's, which runs
        ``handler`` while this instance leads and else forwards to the leader (waiting at
        most ``wait_s`` for one, then ``unavailable``), and the node subject's
        (``loki.engine.node.<self>.<op>``), which answers ``conflict`` ("not the leader")
        when this instance does not lead."""

        async def queue(req: Q) -> R:
            return await self._route(op, req, reply_type, handler, wait_s)

        async def node(req: Q) -> R:
            self._leading()
            return await handler(req)

        return queue, node

    async def node_lease(self, req: LeaseRequest) -> Lease:
        """``loki.engine.node.<self>.lease``: a lease forwarded here (``conflict`` when this
        instance does not lead)."""
        self._leading()
        return await self._lease_here(req)

    async def node_renew(self, req: RenewRequest) -> Lease:
        """``loki.engine.node.<self>.renew``."""
        self._leading()
        return await self._renew_here(req)

    async def node_release(self, req: ReleaseRequest) -> ReleaseReply:
        """``loki.engine.node.<self>.release``."""
        self._leading()
        return await self._release_here(req)

    def info(self, info: EngineInfo) -> EngineInfo:
        """``info`` with this instance's id, the leader's and ``boot`` = the highest leader
        epoch seen (a new one after every change of leader)."""
        leader = self.leadership.leader
        info.instance = self.instance
        info.leader = leader.instance if leader is not None else None
        info.boot = f"epoch-{self.leadership.epoch_seen}"
        return info

    async def fresh_info(self) -> EngineInfo:
        """``loki.engine.info`` (queue group): the leader's view (this instance's own while it
        leads, or when the leader does not answer), after reading the leader key (a
        non-leader's ``leader`` and ``boot`` are as new as Redis's), through :meth:`info`."""
        if self.leadership.granting:
            return self.info(self._info())
        await self.leadership.refresh(INFO_TIMEOUT_S)
        leader = self.leadership.other_leader()
        if leader is not None and self._request is not None:
            subject = subjects.engine_node(leader.instance, "info")
            try:
                raw = await self._request(subject, b"{}", INFO_TIMEOUT_S)
                reply = EngineInfo.model_validate_json(raw)
            except Exception as exc:  # noqa: BLE001 - the leader is slow or gone: own view
                log.debug("leader %s info not had: %s", leader.instance, type(exc).__name__)
            else:
                if reply.error is None:
                    return self.info(reply)
        return self.info(self._info())

    async def node_info(self, _: EngineInfoRequest) -> EngineInfo:
        """``loki.engine.node.<self>.info``: the leader's own view (``conflict`` when this
        instance does not lead)."""
        self._leading()
        return self.info(self._info())

    # ------------------------------------------------------------------ here
    def _leading(self) -> None:
        if not self.leadership.granting:
            raise Conflict(NOT_LEADER)

    async def _lease_here(self, req: LeaseRequest) -> Lease:
        lease = await self._lease(req)
        await self._sync()
        return lease

    async def _renew_here(self, req: RenewRequest) -> Lease:
        lease = self._renew(req)
        await self._sync()
        return lease

    async def _release_here(self, req: ReleaseRequest) -> ReleaseReply:
        try:
            return await self._release(req)
        finally:
            await self._sync()

    # ------------------------------------------------------------------ forwarding
    async def _route(
        self,
        op: str,
        req: BaseModel,
        reply_type: type[R],
        here: Callable[[Any], Awaitable[R]],
        budget_s: float,
    ) -> R:
        deadline = time.monotonic() + max(0.0, budget_s)
        body = req.model_dump_json().encode()
        while True:
            if self.leadership.granting:
                return await here(req)
            leader = self.leadership.other_leader()
            left = deadline - time.monotonic()
            if leader is not None and self._request is not None:
                subject = subjects.engine_node(leader.instance, op)
                timeout = max(0.5, left) + _MARGIN_S.get(op, 0.0)
                try:
                    raw = await self._request(subject, body, timeout)
                except TimeoutError as exc:
                    raise Unavailable(f"the leading supervisor did not answer the {op}") from exc
                except Exception as exc:  # noqa: BLE001 - no responders: the leader is gone
                    log.info("leader %s unreachable for %s (%s)", leader.instance, op, exc)
                    await self.leadership.refresh()
                else:
                    reply = reply_type.model_validate_json(raw)
                    error = getattr(reply, "error", None)
                    if error is None or not (
                        error.type == "conflict" and error.message == NOT_LEADER
                    ):
                        self.forwarded += 1
                        return reply
                    await self.leadership.refresh()
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"no supervisor leads: the {op} was not served")
            await self.leadership.wait_change(min(0.25, left))


__all__ = ["CONTROL_WAIT_S", "INFO_TIMEOUT_S", "MEASURE_WAIT_S", "NOT_LEADER", "Replicas"]
