"""The supervisor's pool mode (issue 44, ``LOKI_ENGINE_URLS``): the followed engines
(:mod:`loki_supervisor.engine_pool`), the slot book (:mod:`loki_supervisor.slot_book`), the
slot transfer (:mod:`loki_supervisor.slot_transfer`) and their hooks into leasing.

- :meth:`PoolMode.routing` is the lease manager's :class:`~loki_supervisor.lease_book.PoolRouting`
  (the ready engines of the active preset's ``ENGINE_GROUP``, as
  :class:`~loki_supervisor.lease_book.EngineTarget`, the book, the policy, the queue bound);
- :meth:`PoolMode.before_reply` runs between a grant and its reply: evict-save and restore on
  the granted slot (the lease is held meanwhile), and fills ``Placement.transfer``;
- :meth:`PoolMode.released` follows a release: the idle-save of a ``main`` turn's slot;
- an engine that leaves ``ready`` loses its slots' contents in the book
  (``SlotBook.forget_engine``): waiters go elsewhere at the next pump, and its conversations'
  next grant says ``failover``;
- :meth:`PoolMode.fill_info` lays the pool over ``loki.engine.info``;
- a ``local`` entry is the engine the supervisor launches from the active local preset (its
  own :class:`~loki_supervisor.engine_process.EngineRunner`, shared with the pool): the
  supervisor tells its state changes with :meth:`PoolMode.local_event`.

Nothing here runs without ``LOKI_ENGINE_URLS``: the service then holds no :class:`PoolMode`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from loki_shared.messages.engine import (
    EngineInfo,
    EngineState,
    EngineStateName,
    Lease,
    Preset,
    ReleaseReply,
    ReleaseRequest,
)

from .engine_pool import EnginePool, PooledEngine, parse_engine_urls
from .engine_process import EngineRunner, auth_headers
from .errors import NotFound
from .lease_book import EngineTarget, Held, LeaseManager, PoolRouting, Target
from .plan import tristate
from .presets import step_cap
from .probe import ProbeCache
from .routing import EngineView
from .settings import Settings
from .slot_book import SlotBook
from .slot_transfer import (
    SAVE_TIMEOUT_S,
    EngineRef,
    GrantFacts,
    Occupant,
    SlotTransfer,
    TransferOutcome,
)

log = logging.getLogger(__name__)

#: How long a grant waits for the engine's ``/slots`` (s) when checking for an unseen restart.
SLOTS_TIMEOUT_S = 2.0

#: The preset feature naming the engine group its requests go to (empty: every engine).
GROUP_FEATURE = "ENGINE_GROUP"


def model_identity(engine: PooledEngine) -> str:
    """What makes two engines serve the same model: the file name of ``/props``
    ``model_path`` (engines on different machines keep it in different folders), else of the
    ``/v1/models`` id (llama-server's id is the model's path unless ``--alias``)."""
    path = (engine.model_path or engine.model).replace("\\", "/").rstrip("/")
    return path.rsplit("/", 1)[-1]


class PoolMode:
    """Pool mode of one supervisor.

    Args:
        settings: ``engine_urls`` (at least one entry), ``engine_routing``,
            ``affinity_queue_max``, ``engine_slot_dir``, ``engine_api_key``.
        publish_state: publishes an engine's :class:`EngineState` (``engine`` set).
        preset: returns the active preset (its ``ctx``, features, sampling cap).
        probes: the chat template probe cache shared with the supervisor's runner.
        local_runner: the supervisor's launch runner (the ``local`` entry's engine).

    Raises:
        ValueError: ``LOKI_ENGINE_URLS`` is malformed or empty (see
            :func:`~loki_supervisor.engine_pool.parse_engine_urls`), or has a ``local`` entry
            together with ``LOKI_SUPERVISOR_REPLICATED`` (a launched engine is one process's
            child) or ``LOKI_ENGINE_URL`` (that engine is followed, none is launched).
    """

    def __init__(
        self,
        settings: Settings,
        publish_state: Callable[[EngineState], Awaitable[None]],
        preset: Callable[[], Preset],
        probes: ProbeCache | None = None,
        local_runner: EngineRunner | None = None,
    ) -> None:
        specs = parse_engine_urls(settings.engine_urls)
        if not specs:
            raise ValueError("LOKI_ENGINE_URLS names no engine")
        local = next((spec for spec in specs if spec.local), None)
        if local is not None and settings.supervisor_replicated:
            raise ValueError(
                f"LOKI_ENGINE_URLS: the local engine {local.id!r} cannot be used with "
                "LOKI_SUPERVISOR_REPLICATED=true (a launched llama-server is one supervisor's "
                "child; replicated supervisors follow engines: name them by URL)"
            )
        if local is not None and settings.engine_url.strip():
            raise ValueError(
                f"LOKI_ENGINE_URLS: the local engine {local.id!r} cannot be used with "
                "LOKI_ENGINE_URL (that engine is followed, none is launched: add it to "
                "LOKI_ENGINE_URLS instead)"
            )
        key = settings.engine_api_key.get_secret_value() if settings.engine_api_key else None
        self.pool = EnginePool(
            specs, self._on_state, api_key=key, probes=probes, local_runner=local_runner
        )
        self.book = SlotBook()
        slot_dir = settings.engine_slot_dir.strip()
        self.transfer = SlotTransfer(Path(slot_dir) if slot_dir else None)
        self.policy = settings.engine_routing
        self.queue_max = settings.affinity_queue_max
        self._publish = publish_state
        self._preset = preset
        self.leases: LeaseManager | None = None  # attached once the manager exists
        #: engine id -> the model it served when last ready (:meth:`serving`)
        self._models: dict[str, str] = {}
        #: engine id -> the greatest ``/slots`` ``id_task`` at the last look (:meth:`_restarted`)
        self._tasks_seen: dict[str, int | None] = {}
        self._client = httpx.AsyncClient()

    # ------------------------------------------------------------------ wiring
    def routing(self) -> PoolRouting:
        """The lease manager's pool mode (the manager must then be given to :meth:`attach`)."""
        return PoolRouting(
            engines=self.targets,
            book=self.book,
            policy=self.policy,
            queue_max=self.queue_max,
            on_grant=self._count_grant,
        )

    def attach(self, leases: LeaseManager) -> None:
        """The lease manager this pool pumps on an engine's state change."""
        self.leases = leases

    @property
    def active(self) -> bool:
        """The pool serves now (not replaced by an external preset)."""
        return self.pool.following and not self._preset().external

    def group(self) -> str | None:
        """The active preset's ``ENGINE_GROUP`` (None: every engine)."""
        raw = (self._preset().features.get(GROUP_FEATURE) or "").strip()
        return raw or None

    def n_ctx(self, engines: list[PooledEngine]) -> int:
        """The conversation window with these engines: CTX, or the smallest slot's ``n_ctx``
        of any of them when smaller (a conversation may move between them)."""
        preset = self._preset()
        slots = [e.n_ctx for e in engines if e.n_ctx > 0]
        return min([preset.ctx, *slots])

    def serving(self) -> list[PooledEngine]:
        """The ready engines of the preset's group that serve the group's model
        (:func:`model_identity`): the model last seen on the first engine of the group, in
        ``LOKI_ENGINE_URLS`` order, whose model some ready engine serves (an engine that is
        down keeps its model's place; when no engine of that model is ready, the next one's).
        An engine of the group serving another model gets no grant: a conversation never
        moves to another model behind its back (its prompt and answers were made with one),
        and the window and slots said in ``loki.engine.info`` are those of one model."""
        ready = self.pool.ready(self.group())
        for e in ready:
            self._models[e.id] = model_identity(e)
        live = {model_identity(e) for e in ready}
        group = self.group()
        for e in self.pool.engines:
            model = self._models.get(e.id)
            if model in live and (not group or e.spec.group == group):
                return [r for r in ready if model_identity(r) == model]
        return []

    def targets(self) -> list[EngineTarget] | None:
        """The ready engines of the preset's group serving its model (:meth:`serving`) as
        the lease manager routes to them; None while the pool is not active (an external
        preset)."""
        if not self.active:
            return None
        preset = self._preset()
        ready = self.serving()
        n_ctx = self.n_ctx(ready)
        out: list[EngineTarget] = []
        for e in ready:
            view = EngineView(
                external=False,
                total_slots=e.total_slots,
                slot_n_ctx=tuple(e.slot_n_ctx),
                ctx=preset.ctx,
            )
            target = Target(
                base_url=e.runner.base_url,
                model=e.model or preset.api_model,
                api_key=e.runner.api_key,
                view=view,
                preset_id=preset.id,
                n_ctx=n_ctx,
                template=e.runner.template,
                max_tokens=step_cap(preset, n_ctx),
                vision=e.runner.props.vision,
                verify=tristate(preset.features.get("VERIFY")),
            )
            out.append(EngineTarget(e.id, e.order, e.total_slots, target))
        return out

    @property
    def local(self) -> PooledEngine | None:
        """The engine this supervisor launches (the ``local`` entry), if any."""
        return self.pool.local

    def local_event(self, event: EngineState) -> None:
        """The supervisor's runner changed state (called before the event is published):
        while it runs the local engine (not an external preset's API), the event names that
        engine (``EngineState.engine``), and one that is not ``ready`` empties its slots in
        the book (the process stopped or restarted). No-op without a ``local`` entry."""
        local = self.pool.local
        if local is None or local.runner.external:
            return
        event.engine = local.id
        if event.state != "ready":
            self.book.forget_engine(local.id)

    def _count_grant(self, held: Held) -> None:
        if held.slot is None or held.lease.placement is None:
            return
        engine = self.pool.get(held.slot[0])
        if engine is None:
            return
        engine.counters.grants += 1
        moved = held.lease.placement.moved_from
        if moved is not None and moved != engine.id:
            engine.counters.moves_in += 1

    async def _on_state(self, engine_id: str, event: EngineState) -> None:
        if event.state != "ready" and (event.state != "stopped" or self.pool.following):
            # its slots' contents are lost (or unknown); not when the pool itself stopped
            # following (an external preset for a while): the engines kept their slots, and
            # a restart meanwhile shows at the next affine grant (:meth:`_restarted`)
            self.book.forget_engine(engine_id)
        try:
            await self._publish(event)
        finally:
            if self.leases is not None:
                self.leases.pump()

    def ref(self, engine: PooledEngine, id_slot: int) -> EngineRef:
        """The transfer's view of one engine slot (model: ``/props`` ``model_path``)."""
        slots = engine.slot_n_ctx
        n_ctx = slots[id_slot] if 0 <= id_slot < len(slots) else engine.n_ctx
        return EngineRef(
            id=engine.id,
            base_url=engine.runner.base_url,
            api_key=engine.runner.api_key,
            model=engine.model_path or engine.model,
            n_ctx=n_ctx,
            total_slots=engine.total_slots,
        )

    # ------------------------------------------------------------------ leases
    async def before_reply(self, leases: LeaseManager, lease: Lease) -> Lease:
        """Prepare the granted slot before the lease is answered: evict-save the previous
        conversation's prompt and restore this conversation's file when it helps
        (:meth:`SlotTransfer.before_grant`); fill ``placement.transfer``,
        ``restored_tokens``, ``saved``. The grant is kept alive meanwhile; a cancelled
        request gives it back. Never raises for an engine or file error."""
        held = leases.held.get(lease.lease_id)
        placement = lease.placement
        if held is None or held.slot is None or placement is None:
            return lease
        engine = self.pool.get(held.slot[0])
        if engine is None:
            return lease
        k = held.slot[1]
        occ = held.occupant
        occupant = (
            Occupant(occ.conversation, tuple(occ.fingerprints), occ.saved)
            if occ is not None and occ.conversation is not None and not occ.side
            else None
        )
        if (placement.prefix > 0 or occupant is not None) and await self._restarted(engine, k):
            # the engine restarted between two /health probes: its slots are empty
            log.warning(
                "engine %s restarted unseen (slot %d shows no task): its slots are empty",
                engine.id,
                k,
            )
            self.book.forget_engine(engine.id, keep_slot=k)
            placement.prefix = 0
            occupant = None
        facts = GrantFacts(
            engine=self.ref(engine, k),
            id_slot=k,
            kind=lease.kind,
            conversation=held.conversation,
            fingerprints=held.fingerprints,
            prefix=placement.prefix,
            occupant=occupant,
            moved_from=placement.moved_from,
        )
        if not self.transfer.enabled:
            if placement.moved_from is not None:  # a move without a file: recomputed
                placement.transfer = "recomputed"
            return lease
        leases.extend_claim(lease.lease_id, 2 * SAVE_TIMEOUT_S + 5)
        try:
            outcome = await self.transfer.before_grant(facts)
        except asyncio.CancelledError:
            with contextlib.suppress(NotFound):
                leases.release(lease.lease_id)
            raise
        except Exception as exc:  # a transfer never fails the grant: recomputed instead
            log.exception("slot transfer before the grant on %s/%d failed", engine.id, k)
            outcome = TransferOutcome(error=str(exc))
        finally:
            still = leases.held.get(lease.lease_id)
            if still is not None:  # the claim window starts when the reply goes out
                still.deadline = time.monotonic() + min(lease.ttl_s, leases.claim_s)
        placement.transfer = outcome.transfer
        placement.restored_tokens = outcome.restored_tokens
        placement.saved = outcome.saved_occupant
        if outcome.transfer == "restored":
            engine.counters.restores += 1
        if outcome.saved_occupant:
            engine.counters.saves += 1
        if outcome.error:
            log.info("slot transfer on %s/%d: %s", engine.id, k, outcome.error)
        return lease

    async def _restarted(self, engine: PooledEngine, id_slot: int) -> bool:
        """The engine restarted since it last showed tasks (``GET /slots``: llama-server
        lists ``id_task`` for a slot once it ran one, from one counter that only grows; a
        restarted server's slots have none): no slot shows a task now, or the greatest task
        id is smaller than at the last look. False when ``/slots`` is off or unreadable, or
        showed no task at the last look (nothing known). ``id_slot``: the granted slot
        (every slot of a restarted engine is empty)."""
        try:
            r = await self._client.get(
                f"{engine.runner.base_url}/slots",
                headers=auth_headers(engine.runner.api_key),
                timeout=SLOTS_TIMEOUT_S,
            )
            listed = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return False
        if not isinstance(listed, list):
            return False
        tasks = [
            s["id_task"]
            for s in listed
            if isinstance(s, dict) and isinstance(s.get("id_task"), int) and s["id_task"] >= 0
        ]
        before = self._tasks_seen.get(engine.id)
        self._tasks_seen[engine.id] = max(tasks) if tasks else None
        if before is None:
            return False
        # task ids grow server-wide: none now (fresh slots), or a smaller greatest one
        return not tasks or max(tasks) < before

    def released(self, leases: LeaseManager, held: Held, req: ReleaseRequest) -> ReleaseReply:
        """After a pooled lease's release: a ``main`` turn's slot is saved once idle (with
        ``LOKI_ENGINE_SLOT_DIR``); nothing is erased (side jobs run apart)."""
        reply = ReleaseReply(ok=True)
        if req.job_done:
            reply.erase_skipped = "several engines: side jobs run apart, nothing erased"
        if held.slot is None or held.lease.kind != "main" or not held.conversation:
            return reply
        engine_id, k = held.slot
        engine = self.pool.get(engine_id)
        entry = self.book.entry(engine_id, k)
        if engine is None or not engine.ready or entry is None or not held.fingerprints:
            return reply
        if entry.conversation != held.conversation:
            return reply

        def still_idle() -> bool:
            if self.book.entry(engine_id, k) is not entry or not engine.ready:
                return False
            return not any(h.slot == (engine_id, k) for h in leases.held.values())

        def on_saved(fingerprint: str) -> None:
            self.book.mark_saved(engine_id, k, fingerprint)
            engine.counters.saves += 1

        self.transfer.after_release(
            self.ref(engine, k), k, held.conversation, held.fingerprints, still_idle, on_saved
        )
        return reply

    # ------------------------------------------------------------------ info
    def fill_info(self, info: EngineInfo) -> None:
        """Lay the pool over ``info``: ``engines``, ``routing``, and while the pool serves,
        the top-level fields describe it (``state`` ready while one engine of the group is;
        ``base_url``, model, template: the first ready engine's; ``total_slots``/
        ``slot_n_ctx``: all ready engines' slots; ``n_ctx``: the window every one of them
        allows)."""
        load = self.leases.slot_load() if self.leases is not None else {}
        info.engines = self.pool.summaries(self.book, load)
        info.routing = self.policy
        if not self.active:
            return
        ready = self.serving()
        first = ready[0] if ready else None
        info.state = "ready" if ready else self._group_state()
        info.detail = self.pool.detail
        group = self.group()
        if group and not any(e.spec.group == group for e in self.pool.engines):
            groups = sorted({e.spec.group for e in self.pool.engines})
            info.detail = (
                f"the preset's {GROUP_FEATURE} {group!r} names no engine of LOKI_ENGINE_URLS "
                f"(its groups: {', '.join(groups)}); {info.detail}"
            )
        others = [e for e in self.pool.ready(self.group()) if e not in ready]
        if first is not None and others:
            info.detail += (
                f"; not used (another model than {first.id}'s {model_identity(first)!r}): "
                + ", ".join(f"{e.id} ({model_identity(e)!r})" for e in others)
            )
        info.base_url = first.runner.base_url if first else ""
        info.model = (first.model if first else "") or self._preset().api_model
        info.model_path = first.runner.props.model_path if first else None
        info.n_ctx = self.n_ctx(ready)
        info.total_slots = sum(e.total_slots for e in ready)
        info.slot_n_ctx = [n for e in ready for n in e.slot_n_ctx]
        info.build_info = first.runner.props.build_info if first else None
        info.build_number = first.runner.build if first else None
        info.chat_template = first.runner.props.chat_template if first else None
        info.template = first.runner.template if first else None
        info.api_key = first.runner.api_key if first else None
        info.vision = bool(ready) and all(e.runner.props.vision for e in ready)
        info.notes = [
            *info.notes,
            *(note for e in self.pool.followed for note in e.runner.notes),
            *([self.transfer.off_reason] if self.transfer.off_reason else []),
        ]
        info.in_flight = sum(held for held, _ in load.values())

    def _group_state(self) -> EngineStateName:
        """The state of the active preset's group when none of its engines serves: like
        :attr:`EnginePool.state` over the group's engines only (``failed`` when the group
        has none: a request would never be granted)."""
        group = self.group()
        states = {e.runner.state for e in self.pool.engines if not group or e.spec.group == group}
        if not states:
            return "failed"
        for name in ("starting", "failed"):
            if name in states:
                return name
        return "failed" if "ready" in states else "stopped"

    async def close(self) -> None:
        """Stop following the engines and the transfer's pending saves."""
        await self.pool.close()
        await self.transfer.close()
        await self._client.aclose()
