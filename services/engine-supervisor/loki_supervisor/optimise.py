"""The optimiser: a bounded search over launch settings, each candidate launched and measured
by the benchmark, the fastest proposed as a preset diff the person applies.

Rules (docs/behaviour.md, "engine measuring"):

- opt-in (``loki.engine.optimise`` ``start``), refused on an external preset, while a
  benchmark or another search runs, and while a turn runs or waits (a ``main`` or
  ``compact`` lease held or asked); a turn that asks for the engine during the search stops
  it (cancelled), as does ``cancel``; the preset in service is launched again as it was in
  every case (the search never leaves a candidate running);
- the candidates (:func:`default_candidates`) come from what the engine's ``--help`` lists:
  UBATCH (``--ubatch-size``), batch (``--batch-size``), flash attention (``--flash-attn``),
  KV cache types (``--cache-type-k``/``-v``), GPU layers (only with a GPU), draft settings
  (only with a draft model); one setting changed at a time from the preset, at most
  :data:`MAX_CANDIDATES`;
- each candidate is planned with the launch rules (:func:`loki_supervisor.plan.plan_launch`)
  and checked by :func:`memory_refusal` (model + KV of every slot + draft within 90% of VRAM
  or available RAM) before it is launched; a plan that refuses SIDE_SLOT or the draft model
  the preset has is refused too;
- the score of a measured row is the mean of its pp and tg median speeds' ratios to the
  preset's own (the baseline, row 0, scores 1); the best row is proposed as ``diff`` and
  never applied by the supervisor; the table is kept (:mod:`loki_supervisor.bench_store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
import uuid
from typing import TYPE_CHECKING, Any

from loki_shared.errors import Conflict
from loki_shared.messages.engine import (
    BenchJob,
    BenchRequest,
    OptimiseCandidate,
    OptimiseReply,
    OptimiseRequest,
    OptimiseResult,
    Preset,
)

from . import bench as bench_mod
from .bench_job import plan_of
from .draft import memory_refusal as draft_memory_refusal
from .errors import InvalidRequest
from .facts import EngineHelp
from .plan import Facts, LaunchPlan, cache_types, plan_launch, split_args

if TYPE_CHECKING:
    from .service import Supervisor

log = logging.getLogger(__name__)

#: At most this many candidates besides the preset itself.
MAX_CANDIDATES = 12
#: Lease kinds that make a turn: the search never starts while one is held or asked.
TURN_KINDS = frozenset({"main", "compact"})
#: Preset fields a candidate may change.
FIELDS = ("ubatch", "ngl", "extra_args", "draft_max", "draft_min")
#: Seconds between two looks at the lease queue for a turn during the search.
WATCH_S = 0.25


def _with_args(base: str, *args: str) -> str:
    return " ".join(x for x in (base.strip(), shlex.join(args)) if x)


def default_candidates(
    preset: Preset, help_: EngineHelp, gpu_present: bool | None
) -> list[dict[str, Any]]:
    """The search: one setting changed at a time from ``preset``, only what ``help_`` lists.

    Each candidate is a dict of preset fields (``FIELDS``); ``extra_args`` candidates are the
    preset's EXTRA_ARGS with one option appended (llama.cpp keeps the last occurrence)."""
    out: list[dict[str, Any]] = []
    base = preset.extra_args or ""
    tokens = set(split_args(base))
    if help_.has("--ubatch-size", "-ub"):
        for ub in (128, 256, 1024):
            if ub != (preset.ubatch or 512):
                out.append({"ubatch": ub})
    if help_.has("--batch-size", "-b") and not tokens & {"-b", "--batch-size"}:
        out.append({"extra_args": _with_args(base, "--batch-size", "4096")})
    if help_.has("--flash-attn", "-fa") and not tokens & {"-fa", "--flash-attn"}:
        text = help_.option_text("--flash-attn") or help_.option_text("-fa")
        values = ("on", "off") if "on" in text and "off" in text else ()
        for v in values:
            out.append({"extra_args": _with_args(base, "--flash-attn", v)})
    if help_.has("--cache-type-k", "-ctk") and not tokens & {"-ctk", "--cache-type-k"}:
        out.append(
            {"extra_args": _with_args(base, "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")}
        )
    if gpu_present and (preset.ngl or "").strip().lower() not in ("", "auto"):
        out.append({"ngl": "auto"})
    if preset.draft_model:
        for n in (4, 8, 16):
            if n != preset.draft_max:
                out.append({"draft_max": n})
    return out[:MAX_CANDIDATES]


def candidate_preset(preset: Preset, settings: dict[str, Any]) -> Preset:
    """``preset`` with a candidate's fields laid over it.

    Raises:
        InvalidRequest: a field the optimiser does not change, or a malformed value.
    """
    bad = sorted(set(settings) - set(FIELDS))
    if bad:
        raise InvalidRequest(f"a candidate may change only {', '.join(FIELDS)} (not {bad})")
    try:
        return Preset.model_validate({**preset.model_dump(), **settings})
    except ValueError as exc:
        raise InvalidRequest(f"bad candidate {settings}: {exc}") from exc


def memory_refusal(plan: LaunchPlan, facts: Facts, ctx: int) -> str | None:
    """Whether a candidate's plan does not fit: model + KV of every slot (its cache types) +
    the draft model within 90% of VRAM (all on GPU) or available RAM (CPU-only engine).
    Unknown facts or a split placement are not refused."""
    if facts.gguf is None:
        return None
    ctk, ctv = cache_types(list(plan.args), facts.env)
    per_slot = facts.gguf.kv_bytes(ctx, ctk, ctv) + facts.gguf.recurrent_state_bytes()
    need = facts.gguf.file_size + plan.slots * per_slot
    if plan.placement == "gpu":
        room, what = facts.gpu.total, "VRAM"
    elif plan.placement == "cpu":
        room, what = facts.host.available, "available RAM"
    else:
        return None
    refusal, _ = draft_memory_refusal(need, plan.draft.bytes or 0, room, what)
    return refusal


def plan_refusal(base: LaunchPlan, plan: LaunchPlan) -> str | None:
    """A candidate's plan that gives up what the preset has: SIDE_SLOT or the draft model."""
    if base.side_slot and not plan.side_slot:
        return f"SIDE_SLOT refused: {plan.side_slot_refusal}"
    if base.draft.on and not plan.draft.on:
        return f"draft model refused: {plan.draft.refusal}"
    return None


def score_rows(table: list[OptimiseCandidate]) -> int | None:
    """Score the measured rows against row 0 (the preset as it is); return the index of the
    best row (None: the baseline itself was not measured)."""
    base = table[0] if table else None
    if base is None or base.verdict != "measured" or not base.pp or not base.tg:
        return None
    best, best_score = 0, -1.0
    for i, row in enumerate(table):
        if row.verdict != "measured" or not row.pp or not row.tg:
            continue
        row.score = round((row.pp / base.pp + row.tg / base.tg) / 2, 4)
        if row.score > best_score:
            best, best_score = i, row.score
    return best


class Optimiser:
    """The supervisor's optimiser job (see the module docstring).

    Args:
        sup: the supervisor.
    """

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.job = BenchJob(kind="optimise")
        self.result: OptimiseResult | None = None
        self._task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopped_by_turn = False
        self._restore = True
        #: the search is over and the preset in service is being launched again: nothing
        #: cancels that (the turn that stopped the search waits for it)
        self._ending = False
        self._cancel_asked = False

    @property
    def running(self) -> bool:
        """A search is in progress."""
        return self._task is not None and not self._task.done()

    async def handle(self, req: OptimiseRequest) -> OptimiseReply:
        """Serve ``loki.engine.optimise``.

        Raises:
            Conflict: ``start`` refused (see :meth:`refusal`).
            InvalidRequest: a malformed candidate or plan.
        """
        if req.action == "start":
            await self.start(req)
        elif req.action == "cancel":
            await self.cancel()
        result = self.result
        if result is None or result.preset_id != self.sup.preset.id:
            stored = await self.sup.bench_store.search(self.sup.preset.id)
            result = stored or result
        return OptimiseReply(job=self.job, result=result)

    def refusal(self) -> str | None:
        """Why a search cannot start now (None: it can)."""
        sup = self.sup
        if sup.runner.external or sup.preset.external:
            return (
                "the preset in service is external (an API elsewhere): there is no local "
                "engine to tune"
            )
        if sup.settings.engine_url:
            return "the engine is followed at LOKI_ENGINE_URL: Loki does not launch it"
        if self.running or sup.bench.running:
            return "a benchmark or an optimiser search is already running"
        if sup.leases.kind_active(TURN_KINDS):
            return "a turn is running or waiting: the search starts only when the engine is idle"
        if sup.runner.state != "ready":
            return f"the engine is {sup.runner.state}, not ready"
        return None

    async def start(self, req: OptimiseRequest) -> None:
        """Plan and start a search (returns once it runs).

        Raises:
            Conflict: see :meth:`refusal`.
            InvalidRequest: a malformed candidate or benchmark plan.
        """
        why = self.refusal()
        if why is not None:
            raise Conflict(why)
        sup = self.sup
        preset = sup.preset.model_copy(deep=True)
        cfg, base_plan = await sup.make_plan(preset)
        facts = await sup.launch_facts(preset)
        if req.candidates is not None:
            settings = [dict(c) for c in req.candidates][:MAX_CANDIDATES]
        else:
            gpu = bool(facts.gpu.gpus) if facts.gpu.known else None
            settings = default_candidates(preset, facts.help, gpu)
        candidates = [candidate_preset(preset, s) for s in settings]  # validated first
        bench_req = BenchRequest(
            action="start", depths=req.depths, n_pp=req.n_pp, n_tg=req.n_tg, reps=req.reps
        )
        plan = plan_of(bench_req, sup.bench_n_ctx())
        table = [OptimiseCandidate(settings={})] + [OptimiseCandidate(settings=s) for s in settings]
        self.result = OptimiseResult(
            search_id=uuid.uuid4().hex[:12],
            preset_id=preset.id,
            model=sup.runner.props.model or str(cfg.model),
            build=sup.runner.props.build_info or "",
            table=table,
        )
        self.job = BenchJob(
            job_id=self.result.search_id,
            kind="optimise",
            state="running",
            total=len(table) * plan.steps,
        )
        self._stopped_by_turn = False
        self._restore = True
        self._ending = False
        self._cancel_asked = False
        ctx = {"preset": preset, "base_plan": base_plan, "facts": facts, "plan": plan}
        self._task = asyncio.create_task(self._run(candidates, ctx), name="optimise")
        self._watcher = asyncio.create_task(self._watch(self._task), name="optimise-watch")

    async def cancel(self, restore: bool = True) -> None:
        """Stop the search; the preset in service is launched again as it was unless
        ``restore`` is False (a preset switch or save that launches one itself follows)."""
        self._restore = restore
        self._cancel_asked = True  # seen between steps too (a step may absorb the cancel)
        task = self._task
        if task is not None and not task.done():
            # once, and never once the search is over (the preset's relaunch is not cut)
            if not task.cancelling() and not self._ending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, task: asyncio.Task[None]) -> None:
        """Stop the search as soon as a turn asks for the engine."""
        while not task.done():
            await asyncio.sleep(WATCH_S)
            if self.sup.leases.kind_active(TURN_KINDS) and not task.done():
                log.info("optimiser stopped: a turn asked for the engine")
                self._stopped_by_turn = True
                # once, and not when the search is already over: its end relaunches the
                # preset in service (the turn waits for it); a cancel then would cut that
                # relaunch and leave the job "running" for ever
                if not task.cancelling() and not self._ending:
                    task.cancel()
                return

    async def _run(self, candidates: list[Preset], ctx: dict[str, Any]) -> None:
        sup = self.sup
        preset: Preset = ctx["preset"]
        plan: bench_mod.BenchPlan = ctx["plan"]
        assert self.result is not None
        table = self.result.table
        launched = False
        state, error, step = "done", None, "done"
        try:
            self.job.step = "the preset as it is"
            run = await sup.bench.measure(plan, self._progress(0, plan))
            table[0].pp, table[0].tg = bench_mod.summary(run.points)
            table[0].verdict = "measured"
            for i, cand in enumerate(candidates, start=1):
                if self._cancel_asked or self._stopped_by_turn:
                    raise asyncio.CancelledError
                row = table[i]
                self.job.step = f"candidate {i}: {row.settings}"
                why = self._refusal(cand, ctx)
                if why is not None:
                    row.verdict, row.reason = "refused", why
                    self.job.done = (i + 1) * plan.steps
                    continue
                launched = True
                why = await sup.launch_and_wait(cand)
                if why is not None:
                    row.verdict, row.reason = "failed", why
                    self.job.done = (i + 1) * plan.steps
                    continue
                try:
                    run = await sup.bench.measure(plan, self._progress(i, plan))
                except bench_mod.BenchError as exc:
                    row.verdict, row.reason = "failed", str(exc)
                    continue
                row.pp, row.tg = bench_mod.summary(run.points)
                row.verdict = "measured"
            if self._cancel_asked or self._stopped_by_turn:
                raise asyncio.CancelledError
            self._finish(table)
        except asyncio.CancelledError:
            state = "cancelled"
            step = "stopped: a turn asked for the engine" if self._stopped_by_turn else "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - the job's verdict, shown to the person
            log.warning("optimiser failed: %s", exc)
            state, error = "failed", str(exc)
        finally:
            self._ending = True
            try:
                # the preset in service comes back before the job says it ended
                if launched and self._restore:
                    self.job.step = "launching the preset again"
                    why = await asyncio.shield(sup.launch_and_wait(preset))
                    if why is not None:
                        log.warning("the preset in service did not come back: %s", why)
                if state == "done":
                    self.job.done = self.job.total
                    await sup.bench_store.save_search(self.result)
            finally:  # the job always says how it ended (the service closing cuts the wait)
                self.job.state, self.job.error, self.job.step = state, error, step  # type: ignore[assignment]

    def _progress(self, row: int, plan: bench_mod.BenchPlan) -> Any:
        """Progress of row ``row``'s benchmark, landing in the search's job."""

        def update(done: int, step: str) -> None:
            self.job.done = row * plan.steps + done
            self.job.step = f"row {row}: {step}"

        return update

    def _refusal(self, cand: Preset, ctx: dict[str, Any]) -> str | None:
        try:
            cfg = self.sup.local_config(cand)
            plan = plan_launch(cfg, ctx["facts"])
        except ValueError as exc:
            return f"cannot launch: {exc}"
        return plan_refusal(ctx["base_plan"], plan) or memory_refusal(plan, ctx["facts"], cfg.ctx)

    def _finish(self, table: list[OptimiseCandidate]) -> None:
        assert self.result is not None
        best = score_rows(table)
        self.result.best = best
        self.result.diff = dict(table[best].settings) if best else {}
        self.result.finished = time.time()
