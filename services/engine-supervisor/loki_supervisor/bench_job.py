"""The benchmark job: one benchmark of the preset in service at a time, as side work of kind
``bench`` under the lease rules every side job follows.

- Refused (``conflict``) on an external preset (there is no engine of ours to measure) and
  while another benchmark or an optimiser search runs.
- One ``bench`` lease per depth (:mod:`loki_supervisor.lease_book`): with SIDE_SLOT the lease
  routes it to slot 1 and the conversation keeps slot 0; with one slot a turn waits at most
  one depth's measurement, and the release of the last depth carries ``job_done``, so
  CACHE_ISOLATE erases slot 0 (the conversation's prompt comes back from the engine's host
  prompt cache, CACHE_RAM, at its next request). The lease is renewed in-process while held.
- The run is stored (:mod:`loki_supervisor.bench_store`) under the preset, model and engine
  build; progress is the job's ``done``/``total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from loki_shared.errors import Conflict
from loki_shared.messages.engine import (
    BenchJob,
    BenchPoint,
    BenchReply,
    BenchRequest,
    BenchRun,
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
)

from . import bench as bench_mod
from .errors import InvalidRequest
from .lease_book import LeaseManager

if TYPE_CHECKING:
    from .service import Supervisor

log = logging.getLogger(__name__)

#: Seconds a benchmark waits for its lease (a turn in progress goes first).
LEASE_WAIT_S = 600.0
#: The lease's lifetime without renewal (renewed every third of it while held).
LEASE_TTL_S = 30.0


def conflict(message: str) -> Conflict:
    """A ``conflict`` error (HTTP 409 at the gateway) with ``message`` for a person."""
    return Conflict(message)


@dataclass
class SideLease:
    """A lease held by the supervisor itself; ``reply``: its release's answer once left."""

    lease: Lease
    reply: ReleaseReply | None = None


def settings_of(preset: Any) -> dict[str, Any]:
    """The launch settings a run is measured with (the fields the optimiser changes)."""
    return {
        "ubatch": preset.ubatch,
        "ngl": preset.ngl,
        "extra_args": preset.extra_args,
        "draft_max": preset.draft_max,
        "draft_min": preset.draft_min,
    }


def plan_of(req: Any, n_ctx: int) -> bench_mod.BenchPlan:
    """The :class:`~loki_supervisor.bench.BenchPlan` a request asks (defaults filled, the
    depths that do not fit ``n_ctx`` dropped when none were asked).

    Raises:
        InvalidRequest: the plan is malformed or an asked depth does not fit.
    """
    default = bench_mod.BenchPlan()
    n_pp = req.n_pp or default.n_pp
    n_tg = req.n_tg or default.n_tg
    if req.depths:
        depths = tuple(req.depths)
    else:
        room = n_ctx - max(n_pp, n_tg) - 1 if n_ctx else max(default.depths)
        depths = tuple(d for d in default.depths if d <= room) or (0,)
    plan = bench_mod.BenchPlan(depths=depths, n_pp=n_pp, n_tg=n_tg, reps=req.reps or default.reps)
    try:
        plan.check(n_ctx)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    return plan


@contextlib.asynccontextmanager
async def held_lease(
    leases: LeaseManager, request: LeaseRequest, release: Any, job_done: bool
) -> AsyncIterator[SideLease]:
    """Hold one lease of the supervisor's own :class:`LeaseManager` (renewed while held);
    released through ``release`` (the supervisor's, which erases slot 0 after the job's last
    request) with ``job_done``."""
    lease = await leases.acquire(request)

    async def renew() -> None:
        while True:
            await asyncio.sleep(max(0.2, min(lease.ttl_s / 3, leases.claim_s / 2)))
            try:
                leases.renew(lease.lease_id)
            except Exception:  # noqa: BLE001 - expired: the request runs unreserved
                return

    leases.renew(lease.lease_id)  # the claim
    renewer = asyncio.create_task(renew())
    held = SideLease(lease)
    try:
        yield held
    finally:
        renewer.cancel()
        try:
            held.reply = await release(ReleaseRequest(lease_id=lease.lease_id, job_done=job_done))
        except Exception as exc:  # noqa: BLE001 - expired meanwhile: nothing to free
            log.info("bench lease %s not released: %s", lease.lease_id, exc)


class BenchRunner:
    """The supervisor's benchmark job (see the module docstring).

    Args:
        sup: the supervisor (its engine, leases, preset and store).
    """

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.job = BenchJob(kind="bench")
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """A benchmark is in progress."""
        return self._task is not None and not self._task.done()

    async def handle(self, req: BenchRequest) -> BenchReply:
        """Serve ``loki.engine.bench``.

        Raises:
            Conflict: ``start`` on an external preset, or while a job runs.
            InvalidRequest: a malformed plan.
        """
        if req.action == "start":
            return BenchReply(job=self.start(req))
        if req.action == "cancel":
            await self.cancel()
            return BenchReply(job=self.job)
        if req.action == "latest":
            return BenchReply(job=self.job, runs=await self.sup.bench_store.latest())
        return BenchReply(job=self.job, runs=await self.sup.bench_store.runs_of(self.sup.preset.id))

    def refusal(self) -> str | None:
        """Why a benchmark cannot start now (None: it can)."""
        sup = self.sup
        if sup.runner.external or sup.preset.external:
            return (
                "the preset in service is external (an API elsewhere): the benchmark "
                "measures the local engine only"
            )
        if self.running or sup.optimiser.running:
            return "a benchmark or an optimiser search is already running"
        if sup.runner.state != "ready":
            return f"the engine is {sup.runner.state}, not ready"
        return None

    def start(self, req: BenchRequest) -> BenchJob:
        """Start a benchmark of the preset in service (returns the job at once).

        Raises:
            Conflict: see :meth:`refusal`.
            InvalidRequest: a malformed plan.
        """
        why = self.refusal()
        if why is not None:
            raise conflict(why)
        plan = plan_of(req, self.sup.bench_n_ctx())
        self.job = BenchJob(
            job_id=uuid.uuid4().hex[:12], kind="bench", state="running", total=plan.steps
        )
        self._task = asyncio.create_task(self._run(self.job, plan), name="bench")
        return self.job

    async def cancel(self) -> None:
        """Cancel the running benchmark (its lease released); nothing is stored."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, job_: BenchJob, plan: bench_mod.BenchPlan) -> None:
        def progress(done: int, step: str) -> None:
            job_.done, job_.step = done, step

        try:
            job_.run = await self.measure(plan, progress)
            await self.sup.bench_store.add(job_.run)
            job_.state = "done"
            job_.step = "done"
        except asyncio.CancelledError:
            job_.state = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - the job's verdict, shown to the person
            log.warning("benchmark failed: %s", exc)
            job_.state = "failed"
            job_.error = str(exc)

    async def measure(
        self, plan: bench_mod.BenchPlan, on_progress: Callable[[int, str], None] | None = None
    ) -> BenchRun:
        """Measure ``plan`` on the engine in service under ``bench`` leases (one per depth,
        the last released with ``job_done``); ``on_progress(done, step)`` as it goes.

        Raises:
            bench.BenchError: a request failed.
            LokiError: no lease.
        """
        sup = self.sup
        started = time.time()
        points: list[BenchPoint] = []
        id_slot: int | None = None
        erased, skipped = False, None
        done_before = 0

        def progress(done: int, total: int, step: str) -> None:
            if on_progress is not None:
                on_progress(done_before + done, step)

        async with httpx.AsyncClient() as http:
            for i, depth in enumerate(plan.depths):
                last = i == len(plan.depths) - 1
                request = LeaseRequest(kind="bench", wait_s=LEASE_WAIT_S, ttl_s=LEASE_TTL_S)
                async with held_lease(sup.leases, request, sup.release, last) as held:
                    id_slot = held.lease.id_slot
                    send = bench_mod.http_sender(http, held.lease.base_url, held.lease.api_key)
                    one = bench_mod.BenchPlan(
                        depths=(depth,), n_pp=plan.n_pp, n_tg=plan.n_tg, reps=plan.reps
                    )
                    points += await bench_mod.measure(send, one, id_slot, progress)
                done_before += one.steps
                if last and held.reply is not None:
                    erased = held.reply.slot_erased
                    skipped = held.reply.erase_skipped
        info = sup.runner.props
        return BenchRun(
            run_id=uuid.uuid4().hex[:12],
            preset_id=sup.preset.id,
            model=info.model or info.model_path or sup.preset.model,
            build=info.build_info or "",
            settings=settings_of(sup.preset),
            points=points,
            reps=plan.reps,
            started=started,
            finished=time.time(),
            id_slot=id_slot,
            slot_erased=erased,
            erase_skipped=skipped,
        )
