"""The lease book: the supervisor's side of the engine lease (its holders and waiters, by
queue): one request per slot at a time, FIFO per slot, expiry of dead holders. The client's
side is :mod:`loki_shared.lease`.

A caller asks a lease before each completion request and releases it after (see
:mod:`loki_shared.messages.engine`). Queues are keyed by where the request goes:

- ``slot0`` / ``slot1``: a routed request (two slots of CTX): one at a time per slot;
- ``any``: no ``id_slot`` (one slot, or a shared window): up to ``total_slots`` at a time;
- ``ext``: an external preset: no limit (the remote API has its own).

Waiters are served in arrival order within a queue; a waiter for a busy queue never blocks a
waiter for another queue. A lease not renewed within its TTL expires (its holder is presumed
dead) and the next waiter gets the slot.

A ``prewarm`` lease (PREWARM: the next request's prefix sent ahead, low priority) is
pre-empted by any other request for its queue: it is revoked at once (its holder's next
renewal is refused, and the holder cancels its request) and the waiter is granted the slot.

Claims: a grant is a NATS reply, and a waiter whose process died meanwhile (a chat instance
killed with turns queued for the slot) never receives it. A fresh grant therefore lives only
``claim_s`` until its first renewal (the client renews at once on receipt, see
:mod:`loki_shared.lease`); unclaimed, it expires, and when the request named its ``holder``
(a process's id), that holder's other waiters and leases go with it: one dead process costs
one claim window, not one TTL per request it had queued. A holder that renewed any lease
within the last TTL is alive (its claim was only late): nothing of it is dropped but the
unclaimed grant.

Pool mode (issue 44, ``LOKI_ENGINE_URLS``; the manager is given a :class:`PoolRouting`):
queues are per engine slot (``"<engine>/slot<k>"``, capacity 1) and every grant names its
``id_slot``. At each :meth:`LeaseManager.pump` each waiter, in arrival order, is placed by
:func:`loki_supervisor.affinity.choose` from what the slot book says each slot last ran and
what is held and waited for now: a waiter told to wait for a slot counts as waiting for it, so
a later one never overtakes it there (FIFO per slot). The grant is written into the slot book
and the :class:`~loki_shared.messages.engine.Lease` carries the engine's ``base_url`` and its
:class:`~loki_shared.messages.engine.Placement`. A slot held only by a ``prewarm`` lease is
free for any other request (the prewarm is pre-empted, as above). While the pool gives no
engine list (an external preset replaced it), the manager works as without a pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from loki_shared.fingerprint import common_prefix
from loki_shared.messages.engine import Lease, LeaseRequest, Placement, TemplateProbe

from .affinity import MAIN_KINDS, Ask, Choice, EngineLoad, Policy, SlotState, choose
from .errors import Busy, NotFound, Unavailable
from .routing import EngineView, route, shares_main_slot
from .slot_book import SlotBook, SlotEntry

log = logging.getLogger("loki_supervisor.lease")  # the name of its logs, kept across the rename


@dataclass(frozen=True)
class Target:
    """Where requests go now (a ready engine or an external preset)."""

    base_url: str
    model: str
    api_key: str | None
    view: EngineView
    preset_id: str | None = None
    n_ctx: int = 0  # the conversation window granted (0: view.ctx)
    template: TemplateProbe | None = None  # the chat template probe's verdicts
    max_tokens: int | None = None  # the preset's cap on one completion step (tokens)
    vision: bool = False  # the endpoint sees images
    verify: bool | None = None  # the preset's VERIFY feature (None: not said)


@dataclass(frozen=True)
class EngineTarget:
    """One ready engine of the pool as the lease manager sees it: its id, its position in
    ``LOKI_ENGINE_URLS`` (ties), its slot count and where its requests go (``target``: its
    ``base_url``, key, model, window, template verdicts)."""

    engine: str
    order: int
    slots: int
    target: Target


@dataclass
class PoolRouting:
    """Pool mode of the :class:`LeaseManager`.

    Attributes:
        engines: the pool's ready engines now, in order; None while the pool is not in use
            (an external preset replaced it: the manager then works as without a pool).
        book: what each pooled slot last ran (written at each grant).
        policy: ``affine`` (default), ``round_robin`` or ``least_busy``.
        queue_max: requests that may wait for a conversation's affine slot before the next
            one is moved (``LOKI_AFFINITY_QUEUE_MAX``).
        on_grant: called with each pooled grant's :class:`Held` (counters).
    """

    engines: Callable[[], list[EngineTarget] | None]
    book: SlotBook
    policy: Policy = "affine"
    queue_max: int = 1
    on_grant: Callable[[Held], None] | None = None


@dataclass
class Held:
    """A granted lease. In pool mode also: the engine and slot (``slot``), the request's
    prompt fingerprints and what the slot held before this grant (``occupant``)."""

    lease: Lease
    queue: str
    deadline: float
    conversation: str | None
    granted_at: float = field(default_factory=time.monotonic)
    claimed: bool = False  # renewed at least once (the holder received the grant)
    holder: str | None = None  # LeaseRequest.holder: the asking process
    slot: tuple[str, int] | None = None  # pool mode: (engine, id_slot)
    fingerprints: tuple[str, ...] = ()  # pool mode: LeaseRequest.prompt_fingerprints
    occupant: SlotEntry | None = None  # pool mode: the slot's entry this grant replaced


@dataclass
class _Waiter:
    request: LeaseRequest
    future: asyncio.Future[Lease]
    enqueued: float = field(default_factory=time.monotonic)


class LeaseManager:
    """Grants, renews, releases and expires leases.

    Args:
        target: returns the current :class:`Target`, or None while the engine is not ready
            (waiters then wait until :meth:`pump` is called with a ready engine).
        ttl: default lease lifetime without renewal (s).
        max_ttl: the longest TTL a caller may ask (s).
        claim_s: lifetime of a fresh grant until its first renewal (s; capped by the TTL).
        pool: pool mode (several engines, see the module docstring); None: one engine.
    """

    def __init__(
        self,
        target: Callable[[], Target | None],
        ttl: float = 30.0,
        max_ttl: float = 600.0,
        claim_s: float = 2.0,
        pool: PoolRouting | None = None,
    ) -> None:
        self._target = target
        self.pool = pool
        self._rr = 0  # round_robin: the next engine's turn
        self._slot_waits: dict[tuple[str, int], int] = {}  # pool: waiters per slot, last pump
        self.ttl = ttl
        self.max_ttl = max_ttl
        self.claim_s = claim_s
        self._seen: dict[str, float] = {}  # holder -> monotonic time of its last renewal
        self._waiting: list[_Waiter] = []
        self.held: dict[str, Held] = {}
        self._paused = 0
        #: prewarm leases revoked for a real request (ids, oldest first)
        self.preempted: list[str] = []
        self._reaper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the expiry task (call from a running event loop)."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_loop(), name="lease-reaper")

    async def close(self) -> None:
        """Stop the expiry task and fail every waiter with :class:`Unavailable`."""
        if self._reaper:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass
            self._reaper = None
        for w in self._waiting:
            if not w.future.done():
                w.future.set_exception(Unavailable("supervisor stopping"))
        self._waiting.clear()

    # ------------------------------------------------------------------ queries
    @property
    def in_flight(self) -> int:
        """Leases held right now."""
        return len(self.held)

    @property
    def waiting(self) -> int:
        """Requests queued for a lease."""
        return len(self._waiting)

    def kind_active(self, kinds: frozenset[str]) -> bool:
        """A lease of one of ``kinds`` is held or waited for (the optimiser's "a turn runs
        or waits")."""
        return any(h.lease.kind in kinds for h in self.held.values()) or any(
            w.request.kind in kinds and not w.future.done() for w in self._waiting
        )

    # ------------------------------------------------------------------ operations
    async def acquire(self, request: LeaseRequest) -> Lease:
        """Wait (at most ``request.wait_s``) for a lease for one request of ``request.kind``.

        Raises:
            Unavailable: the engine was not ready within ``wait_s``.
            Busy: the request's slot stayed taken for ``wait_s``.
        """
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, loop.create_future())
        self._waiting.append(waiter)
        self.pump()
        timeout = max(0.0, float(request.wait_s))
        try:
            done, _ = await asyncio.wait({waiter.future}, timeout=timeout)
        except asyncio.CancelledError:
            self._drop(waiter)
            raise
        if waiter.future.done():
            return waiter.future.result()
        self._drop(waiter)
        if not self._ready():
            raise Unavailable(f"engine not ready within {timeout:g} s")
        raise Busy(f"no free slot for a {request.kind} request within {timeout:g} s")

    def _drop(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
        if (
            waiter.future.done()
            and not waiter.future.cancelled()
            and waiter.future.exception() is None
        ):
            # Granted at the same instant the wait ended: give the slot back.
            self.release(waiter.future.result().lease_id)
        elif not waiter.future.done():
            waiter.future.cancel()

    def renew(self, lease_id: str) -> Lease:
        """Extend a held lease by its TTL.

        Raises:
            NotFound: unknown, released or expired lease.
        """
        held = self.held.get(lease_id)
        if held is None:
            raise NotFound(f"lease {lease_id} is not held (released or expired)")
        held.deadline = time.monotonic() + held.lease.ttl_s
        held.claimed = True
        if held.holder:
            self._seen[held.holder] = time.monotonic()
        return held.lease

    def release(self, lease_id: str, pump: bool = True) -> Held:
        """Free a held lease and serve the next waiter (unless ``pump`` is False).

        Raises:
            NotFound: unknown, released or expired lease.
        """
        held = self.held.pop(lease_id, None)
        if held is None:
            raise NotFound(f"lease {lease_id} is not held (released or expired)")
        if pump:
            self.pump()
        return held

    def pause(self) -> None:
        """Grant nothing until :meth:`resume` (slot erase in progress). Nests."""
        self._paused += 1

    def resume(self) -> None:
        """Undo one :meth:`pause` and serve waiters."""
        self._paused = max(0, self._paused - 1)
        self.pump()

    def expire(self, now: float | None = None) -> list[Held]:
        """Drop every lease past its deadline; return them. Serves waiters after."""
        now = time.monotonic() if now is None else now
        gone = [h for h in self.held.values() if h.deadline <= now]
        dead = {
            h.holder
            for h in gone
            if h.holder
            and not h.claimed
            and now - self._seen.get(h.holder, float("-inf")) > self.ttl
        }
        for holder in dead:
            self._seen.pop(holder, None)
        if dead:
            # a grant its holder never received: that process is gone, and so are its
            # other leases and waiters
            gone += [h for h in self.held.values() if h.holder in dead and h.deadline > now]
            for w in [w for w in self._waiting if w.request.holder in dead]:
                self._waiting.remove(w)
                if not w.future.done():
                    w.future.set_exception(Unavailable("the lease's holder is gone"))
        for h in gone:
            self.held.pop(h.lease.lease_id, None)
            log.warning(
                "lease %s (%s, %s) expired after %.1f s %s",
                h.lease.lease_id,
                h.lease.kind,
                h.queue,
                now - h.granted_at,
                "without release or renewal"
                if h.claimed or h.holder not in dead
                else f"(holder {h.holder} gone)",
            )
        if gone:
            self.pump()
        return gone

    def _pool_engines(self) -> list[EngineTarget] | None:
        return self.pool.engines() if self.pool is not None else None

    def _ready(self) -> bool:
        engines = self._pool_engines()
        return bool(engines) if engines is not None else self._target() is not None

    def slot_load(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Pool mode: ``(engine, id_slot) -> (leases held, requests waiting for it)`` as of
        the last :meth:`pump` (empty without a pool)."""
        load = {slot: (0, n) for slot, n in self._slot_waits.items()}
        for h in self.held.values():
            if h.slot is not None:
                held, waiting = load.get(h.slot, (0, 0))
                load[h.slot] = (held + 1, waiting)
        return load

    def extend_claim(self, lease_id: str, seconds: float) -> None:
        """Keep a fresh grant alive ``seconds`` more (the supervisor works on its slot before
        answering it: a save or restore); no-op for an unknown lease."""
        held = self.held.get(lease_id)
        if held is not None:
            held.deadline = max(held.deadline, time.monotonic() + seconds)

    def pump(self) -> None:
        """Grant leases to waiters, in arrival order per queue, while queues have room."""
        if self._paused:
            return
        engines = self._pool_engines()
        if engines is not None:
            self._pump_pool(engines)
            return
        target = self._target()
        if target is None:
            return
        busy: dict[str, int] = {}
        for h in self.held.values():
            busy[h.queue] = busy.get(h.queue, 0) + 1
        blocked: set[str] = set()
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
                continue
            req = waiter.request
            id_slot = route(req.kind, target.view, req.continuation)
            queue, capacity = self._queue_of(id_slot, target)
            if queue not in blocked and busy.get(queue, 0) >= capacity and req.kind != "prewarm":
                busy[queue] -= self._preempt(queue)
            if queue in blocked or busy.get(queue, 0) >= capacity:
                blocked.add(queue)  # FIFO: nobody overtakes an earlier waiter of this queue
                continue
            ttl = min(self.max_ttl, req.ttl_s or self.ttl)
            lease = Lease(
                lease_id=uuid.uuid4().hex,
                kind=req.kind,
                base_url=target.base_url,
                id_slot=id_slot,
                n_ctx=target.n_ctx or target.view.ctx,
                model=target.model,
                external=target.view.external,
                api_key=target.api_key,
                ttl_s=ttl,
                shares_main_slot=shares_main_slot(req.kind, id_slot, target.view),
                preset_id=target.preset_id,
                template=target.template,
                max_tokens=target.max_tokens,
                vision=target.vision,
                verify=target.verify,
            )
            self.held[lease.lease_id] = Held(
                lease=lease,
                queue=queue,
                deadline=time.monotonic() + min(ttl, self.claim_s),
                conversation=req.conversation,
                holder=req.holder,
            )
            busy[queue] = busy.get(queue, 0) + 1
            self._waiting.remove(waiter)
            waiter.future.set_result(lease)

    def _pump_pool(self, engines: list[EngineTarget]) -> None:
        """Pool mode of :meth:`pump`: each waiter, in arrival order, placed by
        :func:`~loki_supervisor.affinity.choose`."""
        assert self.pool is not None
        waits: dict[tuple[str, int], int] = {}
        self._slot_waits = waits
        if not engines:
            return
        by_id = {e.engine: e for e in engines}
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
                continue
            req = waiter.request
            ask = Ask(
                kind=req.kind,
                conversation=req.conversation,
                fingerprints=tuple(req.prompt_fingerprints),
                continuation=req.continuation,
            )
            slots, loads = self._pool_view(engines, waits, preempts=req.kind != "prewarm")
            book = self.pool.book
            choice = choose(
                ask,
                slots,
                loads,
                policy=self.pool.policy,
                queue_max=self.pool.queue_max,
                rr_next=self._rr,
                last_engine=book.last_engine(req.conversation) if req.conversation else None,
            )
            if choice.engine is None or choice.id_slot is None:
                if choice.wait_for is not None:
                    waits[choice.wait_for] = waits.get(choice.wait_for, 0) + 1
                continue
            self._grant_pooled(waiter, ask, choice, by_id[choice.engine])

    def _pool_view(
        self, engines: list[EngineTarget], waits: dict[tuple[str, int], int], preempts: bool
    ) -> tuple[list[SlotState], list[EngineLoad]]:
        """The slots and engine loads :func:`choose` reads now. With ``preempts`` (any kind
        but ``prewarm``) a slot held only by prewarm leases counts as free."""
        assert self.pool is not None
        holders: dict[tuple[str, int], list[str]] = {}
        for h in self.held.values():
            if h.slot is not None:
                holders.setdefault(h.slot, []).append(h.lease.kind)
        slots: list[SlotState] = []
        loads: list[EngineLoad] = []
        for e in engines:
            held_n = wait_n = 0
            for k in range(e.slots):
                kinds = holders.get((e.engine, k), [])
                waiting = waits.get((e.engine, k), 0)
                held_n += len(kinds)
                wait_n += waiting
                busy = bool(kinds) and not (
                    preempts and waiting == 0 and all(kind == "prewarm" for kind in kinds)
                )
                entry = self.pool.book.entry(e.engine, k)
                slots.append(
                    SlotState(
                        engine=e.engine,
                        id_slot=k,
                        busy=busy,
                        waiting=waiting,
                        conversation=entry.conversation if entry else None,
                        fingerprints=tuple(entry.fingerprints) if entry else (),
                        last_used=entry.last_used if entry else 0.0,
                        side=entry.side if entry else False,
                    )
                )
            loads.append(
                EngineLoad(
                    engine=e.engine, order=e.order, held=held_n, waiting=wait_n, slots=e.slots
                )
            )
        return slots, loads

    def _grant_pooled(
        self, waiter: _Waiter, ask: Ask, choice: Choice, engine: EngineTarget
    ) -> None:
        """Grant ``waiter`` the slot ``choice`` names on ``engine`` (pre-empting a prewarm
        lease held there) and write it into the slot book."""
        assert self.pool is not None and choice.engine is not None and choice.id_slot is not None
        req = waiter.request
        k = choice.id_slot
        queue = f"{engine.engine}/slot{k}"
        self._preempt(queue)
        now = time.monotonic()
        before = self.pool.book.entry(engine.engine, k)
        main_like = ask.kind in MAIN_KINDS or (ask.kind == "compact" and ask.continuation)
        holds_prompt = before is not None and before.conversation is not None and not before.side
        prefix = choice.prefix
        if not prefix and before is not None and before.conversation is not None:
            prefix = common_prefix(list(ask.fingerprints), list(before.fingerprints))
        target = engine.target
        ttl = min(self.max_ttl, req.ttl_s or self.ttl)
        lease = Lease(
            lease_id=uuid.uuid4().hex,
            kind=req.kind,
            base_url=target.base_url,
            id_slot=k,
            n_ctx=target.n_ctx or target.view.ctx,
            model=target.model,
            external=False,
            api_key=target.api_key,
            ttl_s=ttl,
            shares_main_slot=main_like or holds_prompt,
            preset_id=target.preset_id,
            template=target.template,
            max_tokens=target.max_tokens,
            vision=target.vision,
            verify=target.verify,
            placement=Placement(
                engine=engine.engine,
                id_slot=k,
                reason=choice.reason,
                prefix=prefix,
                moved_from=choice.moved_from,
            ),
        )
        occupant = self.pool.book.granted(
            engine.engine,
            k,
            kind=req.kind,
            conversation=req.conversation,
            fingerprints=ask.fingerprints,
            now=now,
            continuation=req.continuation,
        )
        held = Held(
            lease=lease,
            queue=queue,
            deadline=now + min(ttl, self.claim_s),
            conversation=req.conversation,
            holder=req.holder,
            slot=(engine.engine, k),
            fingerprints=ask.fingerprints,
            occupant=occupant,
        )
        self.held[lease.lease_id] = held
        if choice.reason == "round_robin":
            self._rr += 1
        self._waiting.remove(waiter)
        waiter.future.set_result(lease)
        if self.pool.on_grant is not None:
            try:
                self.pool.on_grant(held)
            except Exception:  # counters only: a grant is never undone for them
                log.exception("pool grant hook failed")

    def _preempt(self, queue: str) -> int:
        """Revoke the ``prewarm`` leases held on ``queue`` (a real request wants it); return
        how many. Their holders learn it at their next renewal (refused: ``not_found``)."""
        gone = [h for h in self.held.values() if h.queue == queue and h.lease.kind == "prewarm"]
        for h in gone:
            self.held.pop(h.lease.lease_id, None)
            self.preempted.append(h.lease.lease_id)
            log.info("prewarm lease %s pre-empted on %s", h.lease.lease_id, queue)
        return len(gone)

    @staticmethod
    def _queue_of(id_slot: int | None, target: Target) -> tuple[str, float]:
        if target.view.external:
            return "ext", float("inf")
        if id_slot is not None:
            return f"slot{id_slot}", 1
        return "any", max(1, target.view.total_slots)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.expire()
