"""The supervisor service: the active preset, the engine runner, the lease manager, and
their NATS handlers (``loki.engine.info``, ``.lease``, ``.renew``, ``.release``,
``.presets``, ``.bench``, ``.optimise``; events on ``loki.engine.state``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from pydantic import BaseModel
from redis.asyncio import Redis

from loki_shared import servers, subjects
from loki_shared.lease import requester
from loki_shared.messages.engine import (
    BenchReply,
    BenchRequest,
    EngineInfo,
    EngineInfoRequest,
    EngineState,
    Lease,
    LeaseRequest,
    OptimiseReply,
    OptimiseRequest,
    Preset,
    PresetsReply,
    PresetsRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.sealing import Sealer
from loki_shared.serve import serve

from . import facts as facts_mod
from . import model_files, slot_files
from .bench_job import BenchRunner
from .bench_store import BenchStore
from .cache_reuse import chunk_tokens
from .draft import DraftRequest
from .engine_process import EngineRunner, LaunchSpec
from .errors import InvalidRequest, SupervisorError
from .forward import Replicas
from .leadership import Leadership
from .lease_book import LeaseManager, Target
from .lease_mirror import LeaseMirror
from .optimise import Optimiser
from .plan import Facts, LaunchPlan, LocalConfig, plan_launch, tristate, truthy
from .pool_mode import PoolMode
from .preflight import check_model_file
from .presets import PresetStore, env_preset, model_source, public, step_cap, test_connection
from .routing import SIDE_KINDS, EngineView, cache_ram_advice, erase_decision
from .settings import Settings
from .slot_persist import SAVE_TIMEOUT_S, PersistConfig, SlotPersister

log = logging.getLogger(__name__)

ERASE_TIMEOUT_S = 2.0


def collect_facts(model: Path | None, binary: Path | None, draft: Path | None = None) -> Facts:
    """Read every fact the launch rules need (blocking: GGUF headers, NVML, ``--help``);
    with a draft model, its GGUF facts and how its vocabulary differs from the model's."""
    return Facts(
        draft_gguf=facts_mod.try_read_gguf(draft) if draft else None,
        draft_vocab=facts_mod.try_vocab_difference(model, draft) if draft and model else None,
        gguf=facts_mod.try_read_gguf(model),
        gpu=facts_mod.read_gpus(),
        host=facts_mod.read_host_memory(),
        help=facts_mod.read_engine_help(binary) if binary else facts_mod.EngineHelp(),
        env=dict(os.environ),
        engine_devices=facts_mod.read_engine_devices(binary) if binary else None,
    )


class Supervisor:
    """Owns the active preset, the engine and the leases.

    Args:
        settings: the service settings.
        redis: asyncio Redis client (presets).
        sealer: seals external preset keys.
        publish_state: publishes an :class:`EngineState` event.
    """

    def __init__(
        self,
        settings: Settings,
        redis: Redis,
        sealer: Sealer,
        publish_state: Callable[[EngineState], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.publish_state = publish_state
        #: this process's start token (``EngineInfo.boot``): lease waiters see a restart
        self.boot = uuid.uuid4().hex
        self.runner = EngineRunner(
            self._on_state, settings.engine_start_timeout, settings.engine_backoff_max
        )
        #: pool mode (``LOKI_ENGINE_URLS``: several engines, the followed ones and, with a
        #: ``local`` entry, the one ``self.runner`` launches); None with one engine
        self.pool: PoolMode | None = (
            PoolMode(
                settings,
                self._publish_pool_state,
                lambda: self.preset,
                self.runner.probes,
                local_runner=self.runner,
            )
            if settings.engine_urls.strip()
            else None
        )
        self.leases = LeaseManager(
            self.target,
            ttl=settings.lease_ttl,
            claim_s=settings.lease_claim_s,
            pool=self.pool.routing() if self.pool is not None else None,
        )
        if self.pool is not None:
            self.pool.attach(self.leases)
        self.persist = SlotPersister(self.leases)
        self.store = PresetStore(redis, sealer, env_preset(settings))
        self.preset: Preset = env_preset(settings)
        self.plan: LaunchPlan | None = None
        self.plan_error: str | None = None
        self._port = settings.engine_port or servers.free_port()
        self._apply_lock = asyncio.Lock()
        self._apply_task: asyncio.Task[None] | None = None
        self._side_counter = 0
        self._side_seen: OrderedDict[str, int] = OrderedDict()
        self._advised = False
        self._reuse_logged = False  # COMPACT_TAIL_REUSE on an external preset, said once
        self._advice_notes: list[str] = []
        self.bench_store = BenchStore(redis, sealer)
        self.bench = BenchRunner(self)
        self.optimiser = Optimiser(self)
        self.closing = False
        #: this process's id (``EngineInfo.instance``, a NATS subject token)
        self.instance = uuid.uuid4().hex[:12]
        #: LOKI_SUPERVISOR_REPLICATED: the election, the lease mirror, forwarding to the leader
        self.replicas: Replicas | None = (
            self._replicas(redis) if settings.supervisor_replicated else None
        )

    def _replicas(self, redis: Redis) -> Replicas:
        """The replicated supervisors' parts (see :mod:`.forward`)."""
        ttl = self.settings.supervisor_leader_ttl_s
        leadership = Leadership(redis, self.instance, ttl)

        def on_book(book: Any) -> None:  # the pool keeps the book in two places
            if self.pool is not None:
                self.pool.book = book
            if self.leases.pool is not None:
                self.leases.pool.book = book

        pool = self.pool.pool if self.pool is not None else None
        mirror = LeaseMirror(
            redis,
            self.leases,
            lambda: leadership.term,
            grace_s=2 * ttl + 2.0,
            on_book=on_book,
            counters=pool.counter_values if pool is not None else None,
            on_counters=pool.set_counters if pool is not None else None,
        )
        return Replicas(
            self.leases,
            leadership,
            mirror,
            self.lease,
            self.renew,
            self.release,
            api_key=self._lease_api_key,
            info=self.info,
            presets=self.presets,
            on_lead=self._lead_active_preset,
        )

    async def _lead_active_preset(self) -> None:
        """Replicated, on becoming the leader: apply the active preset when another instance
        changed it (saved or switched while this one did not lead)."""
        try:
            preset = await self.store.get(await self.store.active_id())
        except SupervisorError as exc:
            log.warning("active preset not read on taking over: %s", exc)
            return
        if preset.model_dump() != self.preset.model_dump():
            log.info(
                "applying the active preset %s (changed while another instance led)", preset.id
            )
            self.apply_in_background(preset)

    def _lease_api_key(self, lease: Lease) -> str | None:
        """The key of a lease's endpoint now (a lease loaded from the mirror has none)."""
        if self.pool is not None:
            for engine in self.pool.targets() or []:
                if engine.target.base_url == lease.base_url:
                    return engine.target.api_key
        target = self.target()
        return target.api_key if target is not None else None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Apply the active preset (launch the engine) and start lease expiry (and the
        election, with replicated supervisors)."""
        self.leases.start()
        if self.replicas is not None:
            self.replicas.start()
        active = await self.store.active_id()
        self.preset = await self.store.get(active)
        await self.apply(self.preset)

    async def close(self) -> None:
        """Save slot 0 when SLOT_PERSIST asks it (a planned stop), stop the engine (SIGTERM)
        and fail waiting lease requests."""
        self.closing = True
        if self.replicas is not None:  # another instance takes over at once
            await self.replicas.close()
        await self.bench.cancel()
        await self.optimiser.cancel()
        if self._apply_task:
            self._apply_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._apply_task
        await self._save_before_stop()
        await self.leases.close()
        await self.runner.close()
        if self.pool is not None:
            await self.pool.close()
        await self.persist.close()

    async def _save_before_stop(self) -> None:
        """SLOT_PERSIST: save slot 0 before a planned stop of a ready engine (bounded)."""
        if not self.persist.enabled or self.runner.state != "ready" or self.runner.external:
            return
        try:
            why = await asyncio.wait_for(self.persist.save("stop"), SAVE_TIMEOUT_S + 5)
        except TimeoutError:
            why = "save timed out"
        if why is not None:
            log.info("slot 0 not saved before the stop: %s", why)

    async def _publish_pool_state(self, event: EngineState) -> None:
        """A followed engine's state event; with replicated supervisors only the leader's
        (every instance follows the same engines: one event per change, not one per
        instance)."""
        if self.replicas is not None and not self.replicas.leadership.granting:
            return
        await self.publish_state(event)

    async def _on_state(self, event: EngineState) -> None:
        if self.pool is not None:  # the local pooled engine's event names it
            self.pool.local_event(event)
        restore = (
            event.state == "ready"
            and self.persist.enabled
            and not self.runner.external
            and not self.settings.engine_url
        )
        if restore:
            self.leases.pause()  # before anything can be granted: the restore comes first
        try:
            if event.state == "ready":
                self.persist.engine_ready(
                    self.runner.base_url, self.runner.api_key, self._slot0_n_ctx()
                )
            else:
                self.persist.engine_ready("", None, 0)
            await self.publish_state(event)
            if restore:
                try:
                    why = await asyncio.wait_for(self.persist.restore(), SAVE_TIMEOUT_S + 5)
                except TimeoutError:
                    why = "restore timed out"
                if why is not None:
                    log.info("slot 0 not restored: %s", why)
        finally:
            if restore:
                self.leases.resume()
        self.leases.pump()

    def _slot0_n_ctx(self) -> int:
        slots = self.runner.props.slot_n_ctx
        return slots[0] if slots else 0

    def persist_config(
        self, preset: Preset, plan: LaunchPlan, cfg: LocalConfig
    ) -> PersistConfig | None:
        """SLOT_PERSIST for a launch: None when the key is off, or (with a note in the
        plan's notes) when the engine has no slot directory or the conversation's slot is not
        slot 0 (several slots without SIDE_SLOT)."""
        if not truthy(preset.features.get("SLOT_PERSIST")):
            return None
        if self.pool is not None:
            plan.notes.append(
                "SLOT_PERSIST off: several engines (LOKI_ENGINE_URLS): slots move with "
                "LOKI_ENGINE_SLOT_DIR instead"
            )
            return None
        if plan.slot_save_path is None:
            plan.notes.append("SLOT_PERSIST off: the engine has no --slot-save-path")
            return None
        if plan.slots != 1 and not plan.side_slot:
            plan.notes.append(
                f"SLOT_PERSIST off: {plan.slots} slots without SIDE_SLOT (the conversation's "
                "slot is not known)"
            )
            return None
        raw = (preset.features.get("SLOT_PERSIST_MAX_MB") or "").strip()
        max_mb = int(raw) if raw.isdigit() else slot_files.DEFAULT_MAX_MB
        try:
            model = slot_files.model_key(cfg.model)
        except OSError as exc:
            plan.notes.append(f"SLOT_PERSIST off: model file unreadable ({exc})")
            return None
        plan.notes.append(f"SLOT_PERSIST on: slot 0 kept in {plan.slot_save_path} (≤ {max_mb} MiB)")
        return PersistConfig(plan.slot_save_path, model, max_mb * 1024 * 1024)

    # ------------------------------------------------------------------ the plan
    def local_config(self, preset: Preset) -> LocalConfig:
        """Resolve a local preset into a :class:`LocalConfig` (model path, port, key, ...)."""
        model = Path(preset.model) if preset.model else servers.find_bundled_model()
        return LocalConfig(
            model=model,
            ctx=preset.ctx,
            ngl=preset.ngl,
            parallel=preset.parallel,
            ubatch=preset.ubatch,
            extra_args=preset.extra_args,
            side_slot=truthy(preset.features.get("SIDE_SLOT")),
            cache_ram=preset.features.get("CACHE_RAM", "") or "",
            chat_template_file=preset.features.get("CHAT_TEMPLATE_FILE", "") or "",
            mmproj=(preset.features.get("MMPROJ", "") or "").strip(),
            tail_reuse=truthy(preset.features.get("COMPACT_TAIL_REUSE")),
            cache_reuse=chunk_tokens(preset.features.get("CACHE_REUSE")),
            host=self.settings.engine_host,
            port=self._port,
            api_key=self.settings.engine_api_key.get_secret_value()
            if self.settings.engine_api_key
            else None,
            threads=self.settings.engine_threads,
            slot_dir=self._local_slot_dir(),
            draft=DraftRequest(
                model=preset.draft_model,
                max=preset.draft_max,
                min=preset.draft_min,
                ngl=preset.draft_ngl,
            ),
        )

    def _local_slot_dir(self) -> Path:
        """The launched engine's ``--slot-save-path``: ``LOKI_HOME/slots``; the pool's
        ``LOKI_ENGINE_SLOT_DIR`` when the engine is the pool's ``local`` one and it is set
        (the slot transfer saves and restores there on every engine)."""
        if self._slot_dir_shared():
            return Path(self.settings.engine_slot_dir.strip())
        return Path(self.settings.home).resolve() / "slots"

    def _slot_dir_shared(self) -> bool:
        """The launched engine saves into the pool's shared ``LOKI_ENGINE_SLOT_DIR``."""
        shared = self.settings.engine_slot_dir.strip()
        return bool(shared) and self.pool is not None and self.pool.local is not None

    def _keep_slot_file(self, persist: PersistConfig | None) -> Callable[[str], bool] | None:
        """Which files of the slot directory a launch keeps: all of them in the pool's
        shared ``LOKI_ENGINE_SLOT_DIR`` (other engines' saved slots), SLOT_PERSIST's own
        files, else none (a previous launch's files are stale)."""
        if self._slot_dir_shared():
            return lambda _name: True
        return slot_files.is_slot_file if persist else None

    async def make_plan(self, preset: Preset) -> tuple[LocalConfig, LaunchPlan]:
        """Compute the launch plan of a local preset from fresh facts.

        Raises:
            InvalidRequest: the preset cannot be planned (malformed EXTRA_ARGS or CACHE_RAM).
            ModelFileError: the model file is missing, unreadable or not a GGUF file.
            servers.ServerNotFound: no llama-server or no model.
        """
        cfg = self.local_config(preset)
        await asyncio.to_thread(check_model_file, cfg.model, model_source(preset))
        binary = servers.find_llama_server()
        draft = Path(cfg.draft.model) if cfg.draft.model else None
        facts = await asyncio.to_thread(collect_facts, cfg.model, binary, draft)
        try:
            return cfg, plan_launch(cfg, facts)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc

    async def launch_facts(self, preset: Preset) -> Facts:
        """The facts the launch rules read for a local preset (GGUF headers, GPUs, RAM,
        the engine's ``--help``), read now."""
        cfg = self.local_config(preset)
        draft = Path(cfg.draft.model) if cfg.draft.model else None
        binary = servers.find_llama_server()
        return await asyncio.to_thread(collect_facts, cfg.model, binary, draft)

    def bench_n_ctx(self) -> int:
        """The window a ``bench`` request gets: slot 1's with SIDE_SLOT, else the
        conversation's (tokens)."""
        slots = self.runner.props.slot_n_ctx
        if self.view().two_slots:
            return slots[1]
        return self.n_ctx()

    async def launch_and_wait(self, preset: Preset) -> str | None:
        """Launch ``preset`` (not stored, not made active: the optimiser's candidates and the
        preset it restores) and wait until its engine is ready. Returns None when ready, else
        why not (the launch failed, or not ready within the start timeout + 30 s)."""
        if self.closing:
            return "the supervisor is stopping"
        old = self.runner.process
        await self.apply(preset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.engine_start_timeout + 30
        while loop.time() < deadline:
            runner = self.runner
            if runner.process is not old or runner.process is None:
                if runner.state == "ready" and runner.process is not None:
                    return None
                if runner.state == "failed":
                    return runner.detail or "the launch failed"
            await asyncio.sleep(0.2)
        return "the engine was not ready in time"

    # ------------------------------------------------------------------ applying
    async def apply(self, preset: Preset) -> None:
        """Make ``preset`` the running configuration: an external preset stops the local
        engine (and stops following the pool); with ``LOKI_ENGINE_URLS`` its URLs are
        followed, and only with a ``local`` entry is llama-server launched beside them; with
        ``LOKI_ENGINE_URL`` the engine there is followed; otherwise llama-server is
        (re)launched from the preset's plan. A preset that cannot be planned
        leaves the engine ``failed`` with the reason."""
        async with self._apply_lock:
            await self._save_before_stop()
            self.persist.configure(None)
            self.preset = preset
            self.plan = None
            self.plan_error = None
            if preset.external:
                if self.settings.compact_tail_reuse and not self._reuse_logged:
                    self._reuse_logged = True
                    log.info("COMPACT_TAIL_REUSE has no effect on an external preset")
                key = await self.store.api_key(preset.id) if preset.api_key_set else None
                if self.pool is not None:
                    await self.pool.pool.stop()  # the external API replaces the pool
                await self.runner.run_external(preset.base_url, key, preset.api_model)
                return
            if self.pool is not None:  # LOKI_ENGINE_URLS: the pool's URLs are followed
                await self.pool.pool.follow()
                self.leases.pump()
                if self.pool.local is None:  # no local entry: none launched
                    await self.runner.stop()
                    return
            api_key = (
                self.settings.engine_api_key.get_secret_value()
                if self.settings.engine_api_key
                else None
            )
            if self.settings.engine_url:
                await self.runner.run_follow(self.settings.engine_url, api_key)
                return
            try:
                cfg, plan = await self.make_plan(preset)
                binary = servers.find_llama_server()
            except Exception as exc:  # any failure to plan is the preset's state, shown as is
                if not isinstance(exc, (SupervisorError, servers.ServerNotFound, OSError)):
                    log.exception("planning the launch failed")
                await self.runner.stop()
                self.plan_error = str(exc)
                await self.runner._set("failed", f"cannot launch: {exc}")
                return
            persist = self.persist_config(preset, plan, cfg)
            self.persist.configure(persist)
            self.plan = plan
            self.runner.build_hint = facts_mod.package_build(binary)
            for note in plan.notes:
                log.warning("%s", note) if "refused" in note or "imposed" in note else log.info(
                    "%s", note
                )
            await self.runner.run_launch(
                LaunchSpec(
                    args=list(plan.args),
                    host=cfg.host,
                    port=cfg.port,
                    api_key=cfg.api_key,
                    slot_dir=plan.slot_save_path,
                    binary=binary,
                    auto_port=self.settings.engine_port is None,
                    model=cfg.model,
                    model_source=model_source(preset),
                    keep_slot_file=self._keep_slot_file(persist),
                    slot_dir_shared=self._slot_dir_shared(),
                ),
                plan.notes,
            )

    def health(self) -> dict[str, str]:
        """The health check's verdict (``loki.health.engine-supervisor``): unhealthy, with
        the reason, only when the engine failed for good (a launch that will not be retried);
        starting, ready, or failed and restarting with backoff are healthy answers."""
        runner = self.runner
        if runner.state == "failed" and runner.retry_in_s is None:
            return {"engine": f"failed: {runner.detail}"}
        return {}

    def apply_in_background(self, preset: Preset) -> None:
        """:meth:`apply` without waiting (a launch takes seconds to minutes)."""
        self._apply_task = asyncio.create_task(self.apply(preset), name="apply-preset")

    # ------------------------------------------------------------------ views
    def view(self) -> EngineView:
        props = self.runner.props
        return EngineView(
            external=self.runner.external,
            total_slots=props.total_slots,
            slot_n_ctx=tuple(props.slot_n_ctx),
            ctx=self.preset.ctx,
            shared_window=bool(self.plan and self.plan.shared_window),
        )

    def n_ctx(self) -> int:
        """The conversation window: CTX, or the smallest slot's ``n_ctx`` when smaller."""
        slots = [n for n in self.runner.props.slot_n_ctx if n > 0]
        return min([self.preset.ctx, *slots]) if slots else self.preset.ctx

    def target(self) -> Target | None:
        """Where requests go now; None while the engine is not ready."""
        if self.runner.state != "ready":
            return None
        return Target(
            base_url=self.runner.base_url,
            model=self.runner.props.model or self.preset.api_model,
            api_key=self.runner.api_key,
            view=self.view(),
            preset_id=self.preset.id,
            n_ctx=self.n_ctx(),
            template=self.runner.template,
            max_tokens=step_cap(self.preset, self.n_ctx()),
            vision=self.vision(),
            verify=tristate(self.preset.features.get("VERIFY")),
        )

    def vision(self) -> bool:
        """The endpoint sees images: the external preset's checkbox, else ``/props``."""
        return self.preset.vision if self.runner.external else self.runner.props.vision

    def info(self) -> EngineInfo:
        props = self.runner.props
        plan = self.plan
        info = EngineInfo(
            state=self.runner.state,
            base_url=self.runner.base_url,
            model=props.model or self.preset.api_model,
            model_path=props.model_path,
            n_ctx=self.n_ctx(),
            total_slots=props.total_slots,
            slot_n_ctx=list(props.slot_n_ctx),
            build_info=props.build_info,
            build_number=self.runner.build,
            chat_template=props.chat_template,
            external=self.runner.external,
            api_key=self.runner.api_key,
            detail=self.runner.detail,
            preset_id=self.preset.id,
            sampling=dict(self.preset.sampling),
            system_prompt=self.preset.system_prompt,
            vision=self.vision(),
            features=dict(self.preset.features),
            side_slot=bool(plan and plan.side_slot),
            side_slot_refusal=plan.side_slot_refusal if plan else None,
            notes=[*self.runner.notes, *self._advice_notes],
            stderr_tail=list(self.runner.stderr_tail),
            retry_in_s=self.runner.retry_in_s,
            argv=plan.masked_args() if plan else [],
            in_flight=self.leases.in_flight,
            cache_ram_mib=plan.cache_ram.effective_mib if plan else None,
            restarts=self.runner.restarts,
            slot_persist=dict(self.persist.last) if self.persist.enabled else None,
            draft_model=self.preset.draft_model if plan and plan.draft.on else None,
            draft_refusal=plan.draft.refusal if plan else None,
            template=self.runner.template,
            boot=self.boot,
        )
        if self.pool is not None:
            self.pool.fill_info(info)
        return info

    # ------------------------------------------------------------------ leases
    async def lease(self, req: LeaseRequest) -> Lease:
        """Wait for a lease (see :meth:`LeaseManager.acquire`); in pool mode the granted
        slot is prepared (evict-save, restore) before the answer."""
        lease = await self.leases.acquire(req)
        if self.pool is not None and lease.placement is not None:
            lease = await self.pool.before_reply(self.leases, lease)
        return lease

    def renew(self, req: RenewRequest) -> Lease:
        return self.leases.renew(req.lease_id)

    async def release(self, req: ReleaseRequest) -> ReleaseReply:
        """Free a lease; after the last request of a side job, erase slot 0 when CACHE_ISOLATE
        allows it (bounded to 2 s, no lease granted meanwhile); advise raising CACHE_RAM
        once when a conversation came back with less than half its prompt cached after a
        side job shared its slot.

        Raises:
            NotFound: the lease is not held.
        """
        held = self.leases.release(req.lease_id, pump=False)
        if self.pool is not None and held.slot is not None:
            try:  # a pooled slot: its idle-save; side jobs ran apart, nothing erased
                return self.pool.released(self.leases, held, req)
            finally:
                self.leases.pump()
        reply = ReleaseReply(ok=True)
        try:
            lease = held.lease
            if lease.kind in SIDE_KINDS and lease.shares_main_slot:
                self._side_counter += 1
            if lease.kind == "main" and lease.id_slot in (None, 0):
                self.persist.turn_done(held.conversation, req.prompt_fingerprint)
            elif lease.shares_main_slot:
                self.persist.slot_used()
            if lease.kind == "main" and held.conversation:
                reply.advice = self._advice(held.conversation, req)
            if req.job_done:
                self.leases.pause()
                try:
                    reply.erase_skipped = await asyncio.wait_for(
                        self._erase_after_side_job(lease.kind), ERASE_TIMEOUT_S + 0.5
                    )
                except TimeoutError:
                    reply.erase_skipped = "erase timed out"
                finally:
                    self.leases.resume()
                reply.slot_erased = reply.erase_skipped is None
                if reply.slot_erased:
                    log.info("slot 0 erased after a %s job", lease.kind)
        finally:
            self.leases.pump()
        return reply

    async def _erase_after_side_job(self, kind: str) -> str | None:
        if self.runner.state != "ready" and not self.runner.external:
            return "engine not ready"
        common: dict[str, Any] = dict(
            kind=kind,
            job_done=True,
            cache_isolate=truthy(self.preset.features.get("CACHE_ISOLATE"), default=True),
            external=self.runner.external,
            build=self.runner.build,
            total_slots=self.runner.props.total_slots,
            in_flight=self.leases.in_flight,
        )
        reason = erase_decision(slot0_idle=True, **common)
        if reason is not None:
            return reason
        reason = erase_decision(slot0_idle=await self.runner.slot0_idle(), **common)
        if reason is not None:
            return reason
        return await self.runner.erase_slot(0, ERASE_TIMEOUT_S)

    def _advice(self, conversation: str, req: ReleaseRequest) -> str | None:
        seen = self._side_seen.pop(conversation, None)
        self._side_seen[conversation] = self._side_counter
        while len(self._side_seen) > 1000:
            self._side_seen.popitem(last=False)
        if (
            self._advised
            or seen is None
            or self._side_counter == seen
            or not cache_ram_advice(req.prompt_tokens, req.cached_tokens)
        ):
            return None
        self._advised = True
        current = self.plan.cache_ram.effective_mib if self.plan else None
        advice = (
            f"the conversation came back after a side job with {req.cached_tokens} of "
            f"{req.prompt_tokens} prompt tokens cached: raise CACHE_RAM"
            f"{f' (now {current} MiB)' if current else ''} or turn SIDE_SLOT on"
        )
        log.warning("%s", advice)
        self._advice_notes.append(advice)
        return advice

    # ------------------------------------------------------------------ presets
    async def presets(self, req: PresetsRequest) -> PresetsReply:
        """Serve one preset action (see :class:`PresetsRequest`).

        Raises:
            InvalidRequest, NotFound: bad request, unknown preset.
        """
        active = await self.store.active_id()
        handover = req.action in ("save", "switch") and self.optimiser.running
        if handover:  # the person's preset wins over a search (no candidate left running)
            await self.optimiser.cancel(restore=False)
        if req.action == "list":
            return PresetsReply(presets=[public(p) for p in await self.store.list()], active=active)
        if req.action == "get":
            return PresetsReply(
                preset=public(await self.store.get(self._need_id(req))), active=active
            )
        if req.action == "save":
            if not req.preset:
                raise InvalidRequest("save needs a preset")
            data = dict(req.preset)
            if req.preset_id and not data.get("id"):
                data["id"] = req.preset_id
            saved = await self.store.save(data)
            detail = await self._preview(saved)
            if saved.id == active:
                detail["applied"] = True
                self.apply_in_background(saved)
            elif handover:
                self.apply_in_background(await self.store.get(active))
            return PresetsReply(preset=public(saved), active=active, detail=detail)
        if req.action == "delete":
            pid = self._need_id(req)
            if pid == active:
                raise InvalidRequest("the active preset cannot be deleted: switch first")
            await self.store.delete(pid)
            return PresetsReply(active=active)
        if req.action == "switch":
            preset = await self.store.get(self._need_id(req))
            await self.store.set_active(preset.id)
            detail = await self._preview(preset)
            self.apply_in_background(preset)
            return PresetsReply(preset=public(preset), active=preset.id, detail=detail)
        if req.action == "test":
            return PresetsReply(active=active, detail=await self._test(req))
        if req.action == "models":
            dirs = model_files.parse_dirs(self.settings.model_dirs)
            found = await asyncio.to_thread(model_files.list_model_files, dirs)
            return PresetsReply(active=active, detail=found)
        if req.action == "cacheram":
            preset = await self._preset_of(req, active)
            if preset.external:
                return PresetsReply(active=active, detail={"reason": "external preset: no engine"})
            return PresetsReply(
                preset=public(preset), active=active, detail=await self._preview(preset)
            )
        raise InvalidRequest(f"unknown action {req.action}")

    @staticmethod
    def _need_id(req: PresetsRequest) -> str:
        if not req.preset_id:
            raise InvalidRequest(f"{req.action} needs preset_id")
        return req.preset_id

    async def _preset_of(self, req: PresetsRequest, active: str) -> Preset:
        """The preset a request names (``preset_id``, ``preset.id``, else the active one),
        with the request's edited fields laid over it (``features`` merged key by key)."""
        pid = req.preset_id or (req.preset or {}).get("id") or active
        base = await self.store.get(pid)
        if req.preset:
            edits = {k: v for k, v in req.preset.items() if v is not None}
            merged = {**base.model_dump(), **edits}
            if isinstance(edits.get("features"), dict):
                merged["features"] = {**base.features, **edits["features"]}
            try:
                return Preset.model_validate(merged)
            except ValueError as exc:
                raise InvalidRequest(f"bad preset: {exc}") from exc
        return base

    async def _preview(self, preset: Preset) -> dict[str, Any]:
        """The launch plan's verdicts for the preset editor: notes, SIDE_SLOT (second slot's
        memory or the refusal's reason), CACHE_RAM arithmetic."""
        if preset.external:
            return {"external": True, "notes": ["external preset: the local engine stops"]}
        if self.pool is not None and self.pool.local is None:
            return {"notes": ["engines followed (LOKI_ENGINE_URLS): nothing launched"]}
        if self.settings.engine_url:
            return {"notes": [f"engine followed at {self.settings.engine_url}: nothing launched"]}
        try:
            _, plan = await self.make_plan(preset)
        except (SupervisorError, servers.ServerNotFound, OSError) as exc:
            return {"error": str(exc)}
        return {
            "notes": plan.notes,
            "side_slot": plan.side_slot,
            "side_slot_refusal": plan.side_slot_refusal,
            "side_slot_mib": (plan.side_slot_bytes + 1048575) // 1048576
            if plan.side_slot_bytes is not None
            else None,
            "cache_ram": plan.cache_ram.as_dict(),
            "argv": plan.masked_args(),
            "placement": plan.placement,
            "draft": {
                "on": plan.draft.on,
                "refusal": plan.draft.refusal,
                "mib": -(-plan.draft.bytes // 1048576) if plan.draft.bytes else None,
            },
        }

    async def _test(self, req: PresetsRequest) -> dict[str, Any]:
        data = dict(req.preset or {})
        pid = req.preset_id or data.get("id")
        stored: Preset | None = None
        if pid:
            with contextlib.suppress(SupervisorError):
                stored = await self.store.get(pid)
        base_url = data.get("base_url") or (stored.base_url if stored else "")
        model = data.get("api_model") or (stored.api_model if stored else "")
        key = data.get("api_key") or (await self.store.api_key(pid) if stored and pid else None)
        if not base_url:
            raise InvalidRequest("test needs an external preset's base_url")
        return await test_connection(base_url, key, model)


def build_broker(sup: Supervisor, broker: NatsBroker) -> None:
    """Register the supervisor's NATS handlers on ``broker`` with
    :func:`loki_shared.serve.serve` (queue group ``engine``); what they raise is answered by
    the broker's exception middleware.

    Lease requests are served concurrently (a waiting lease never blocks another queue)."""

    async def on_info(_: EngineInfoRequest) -> EngineInfo:
        if sup.replicas is not None:
            return await sup.replicas.fresh_info()
        info = sup.info()
        info.instance = sup.instance
        return info

    async def on_renew(req: RenewRequest) -> Lease:
        return sup.renew(req)

    q = subjects.QUEUE_ENGINE
    serve(broker, subjects.ENGINE_INFO, on_info, queue=q)
    replicas = sup.replicas
    if replicas is None:
        serve(broker, subjects.ENGINE_LEASE, sup.lease, queue=q, max_workers=256)
        serve(broker, subjects.ENGINE_RENEW, on_renew, queue=q, max_workers=16)
        serve(broker, subjects.ENGINE_RELEASE, sup.release, queue=q, max_workers=16)
    else:  # every instance serves them; a non-leader forwards to the leader (forward.py)

        async def publish(subject: str, payload: bytes, reply: str) -> None:
            connection = broker.config.connection_state.connection
            await connection.publish(subject, payload, reply=reply)

        async def on_lease(msg: NatsMessage) -> None:  # answered by whoever grants it
            await replicas.lease_message(msg.body, msg.reply_to)

        async def on_handed_lease(msg: NatsMessage) -> None:
            await replicas.lease_message(msg.body, msg.reply_to, handed=True)

        replicas.connect(requester(broker), publish)
        broker.subscriber(subjects.ENGINE_LEASE, queue=q, max_workers=256, no_reply=True)(on_lease)
        handed = subjects.engine_node(sup.instance, "lease")
        broker.subscriber(handed, max_workers=256, no_reply=True)(on_handed_lease)
        serve(broker, subjects.ENGINE_RENEW, replicas.renew, queue=q, max_workers=64)
        serve(broker, subjects.ENGINE_RELEASE, replicas.release, queue=q, max_workers=64)
        node: list[tuple[str, Any, type[BaseModel], type[BaseModel], int]] = [
            ("renew", replicas.node_renew, RenewRequest, Lease, 64),
            ("release", replicas.node_release, ReleaseRequest, ReleaseReply, 64),
            ("info", replicas.node_info, EngineInfoRequest, EngineInfo, 16),
            ("presets", replicas.node_presets, PresetsRequest, PresetsReply, 4),
        ]
        for op, handler, req_type, reply_type, workers in node:
            subject = subjects.engine_node(sup.instance, op)
            serve(broker, subject, handler, max_workers=workers, request=req_type, reply=reply_type)
    presets = replicas.presets if replicas is not None else sup.presets
    serve(broker, subjects.ENGINE_PRESETS, presets, queue=q, max_workers=4)
    measure: list[tuple[str, str, Any, type[BaseModel], type[BaseModel]]] = [
        (subjects.ENGINE_BENCH, "bench", sup.bench.handle, BenchRequest, BenchReply),
        (
            subjects.ENGINE_OPTIMISE,
            "optimise",
            sup.optimiser.handle,
            OptimiseRequest,
            OptimiseReply,
        ),
    ]
    for subject, op, handle, req_type, reply_type in measure:
        if replicas is None:
            serve(broker, subject, handle, queue=q, max_workers=4)
            continue
        # a measurement leases from the leader's book and its job lives where it runs
        on_queue, on_node = replicas.leader_op(op, handle, reply_type)
        serve(broker, subject, on_queue, queue=q, max_workers=4, request=req_type, reply=reply_type)
        node_subject = subjects.engine_node(sup.instance, op)
        serve(broker, node_subject, on_node, max_workers=4, request=req_type, reply=reply_type)
