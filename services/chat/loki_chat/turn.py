"""The turn loop: an explicit state machine of small steps.

States (each a method returning the next one)::

    begin -> check(start) -> build -> complete -> assess --text--> [verify] --pass--> finish
                               ^                     |                 |--fail: build (once)
                               |                     |--tool calls--> tools -> check(mid) -+
                               |                     |--reasoning only (<= 2 reminders)----+
                               |                     |--500: replay tool_choice none, then no tools
                               |                     |--overflow: echo off, then compaction, replay
                               +---------------------+

The runner keeps the turn's state; each step's work lives in a module of its own, with its
rules (tests named in docs/behaviour.md (chat)): :mod:`.step` (the request built from the
step's lease, streamed), :mod:`.step_rules` (tools offered, REASONING_ECHO, NUDGE_IN_TOOL, the
verifier's and a side job's conditions: pure), :mod:`.refusal` (HTTP errors, overflow, the
500 replays), :mod:`.reminders`, :mod:`.calls` (tool calls stored and run), :mod:`.replies`
(what is kept of an answer, the turn end), :mod:`.turn_images`, :mod:`.turn_verify`.

Rules implemented here:

- Step budget per turn (``LOKI_STEP_BUDGET``); a reminder goes with the last step. A step
  that ends with reasoning only (no text, no call) gets at most two reminders to act.
- Calls written as text (``<tool_call>…</tool_call>``) are executed like native ones; under
  the ``tool_choice: "none"`` replay a call or an empty answer falls back to no tools.
- The conversation is persisted after every accepted step; a turn's images follow the
  ephemeral rule at its end, or KEEP_TURN_IMAGES' budget (:mod:`loki_chat.kept_images`).
- A compaction at the turn's end is followed by PREWARM (``LOKI_PREWARM``): the next
  request's prefix sent to the slot while the user reads.
- A step cut at the request's ``max_tokens`` ends the turn with ``finish_reason: "length"``;
  the turn end says ``cut_at`` (the cap). Continue (``resume``) sends the conversation as it
  is — its last message the cut assistant reply — so llama-server continues that message
  (assistant prefill; the prefix is in the slot's cache); the text is appended to the same
  stored message, marked by a ``continue`` display event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from loki_shared.fingerprint import fingerprints
from loki_shared.lease import EngineLease, LeaseError, LeaseStopped
from loki_shared.messages.base import RequestKind
from loki_shared.messages.chat import ChatEvent, ChatMessage, ImageAttachment, ToolCall
from loki_shared.messages.engine import Lease, TemplateProbe
from loki_shared.messages.perf import PerfRecord

from . import calls, refusal, reminders, replies, step, step_rules, turn_images, turn_verify
from .code import loop as code_loop
from .code import rules as code_rules
from .context import ContextPolicy, ContextView, OverflowInfo, Trigger
from .conversation import Conversation
from .engine import EngineClient, StepResult
from .errors import StreamError
from .images import PendingItem, forget_images, unpack
from .kept_images import KeptImages, settle_turn
from .prewarm import PrewarmJob
from .project.head import ProjectHead
from .settings import Settings
from .step import StepPlan
from .stream import extract_text_tool_calls
from .tools import ToolBox
from .tools.memory import CURRENT_PROJECT

log = logging.getLogger("loki.chat.turn")


class TurnHost(Protocol):
    """What the loop needs from the conversation's owner (:class:`loki_chat.actor.Actor`)."""

    conv: Conversation
    settings: Settings
    engine: EngineClient
    policy: ContextPolicy
    stop: asyncio.Event

    @property
    def toolbox(self) -> ToolBox: ...

    async def emit(self, delta: dict[str, Any] | None = None, **fields: Any) -> ChatEvent: ...
    async def persist(self) -> None: ...
    def lease(
        self, kind: RequestKind = "main", fingerprints: list[str] | None = None
    ) -> EngineLease: ...
    def publish_perf(self, record: PerfRecord) -> None: ...
    async def total_slots(self) -> int | None: ...
    def tools_withheld(self, unavailable: dict[str, Any] | None) -> None: ...
    async def keep_images(self, images: list[ImageAttachment]) -> None: ...
    async def shelf_images(self) -> dict[str, ImageAttachment]: ...
    def prewarm(self, job: PrewarmJob) -> object: ...
    async def check_criteria(self, stop: asyncio.Event, answer: str = "") -> bool: ...

    @property
    def project(self) -> ProjectHead: ...


@dataclass
class TurnOutcome:
    """How the turn ended."""

    finish_reason: str | None = None
    steps: int = 0
    stopped: bool = False
    error: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None


State = Callable[[], Awaitable["State | None"]]


@dataclass
class TurnRunner:
    """Runs one turn for ``host.conv``; ``user_text`` None resumes without a new message;
    ``resume``: the turn continues the last (assistant) message instead of adding one."""

    host: TurnHost
    user_text: PendingItem | None
    resume: bool = False
    outcome: TurnOutcome = field(default_factory=TurnOutcome)
    plan: StepPlan = field(default_factory=StepPlan)
    act_reminders: int = 0
    budget_reminded: bool = False
    lease_n_ctx: int = 0  # the step's lease's window (the lease's fields: step.adopt)
    vision: bool = False  # the last lease's endpoint sees images (see_image offered)
    result: StepResult | None = None
    sent_wire: list[dict[str, Any]] = field(default_factory=list)
    sent_system: str | None = None  # the last request's system message (PREWARM reuses it)
    sent_head: str | None = None  # the last request's project block (PREWARM reuses it)
    sent_echo: bool = False
    sent_tools: bool = False
    model: str = ""
    external: bool = False
    pending_calls: list[ToolCall] = field(default_factory=list)
    pending_raw: dict[str, str] = field(default_factory=dict)
    estimate_at_send: int = 0
    template: TemplateProbe | None = None
    withheld_told: bool = False
    nudged: tuple[ChatMessage, Any] | None = None
    max_tokens_sent: int | None = None
    kind: str = "main"  # the lease and perf kind: ``main``, or ``subagent`` (a side job)
    preset_verify: bool | None = None  # the last lease's ``verify`` (the preset's VERIFY)
    verified: bool = False  # the verifier ran in this turn (at most once)
    budget_extra: int = 0  # steps granted beyond the budget (the corrective step)
    continued: bool = False  # this turn is a Continue (never verified)
    kept: KeptImages | None = None  # KEEP_TURN_IMAGES' side of this turn (None: key off)
    code_rounds: int = 0  # corrective rounds the criteria sent in this turn (code mode)
    criteria_failed: list[str] = field(default_factory=list)  # after the last check
    criteria_unchecked: list[str] = field(default_factory=list)  # after the last check
    #: the last step's lease (the host's previous one at the start): the next lease request
    #: names the fingerprints of the messages it would send under it (:func:`.step.preview`)
    last_lease: Lease | None = None

    @property
    def conv(self) -> Conversation:
        return self.host.conv

    @property
    def settings(self) -> Settings:
        return self.host.settings

    @property
    def step_budget(self) -> int:
        """Completion steps this turn may take: the budget, plus the verifier's corrective
        step when the budget was spent."""
        return self.settings.step_budget + self.budget_extra

    async def run(self) -> TurnOutcome:
        """Run the states until the turn ends. Never raises for engine or tool trouble."""
        state: State | None = self.begin
        while state is not None:
            if self.host.stop.is_set() and state not in (
                self.finish,
                self.begin,
                self.assess,
                self.tools,
            ):
                self.outcome.stopped = True
                state = self.finish
            state = await state()
        return self.outcome

    # -- states ---------------------------------------------------------------------------
    async def begin(self) -> State:
        conv = self.conv
        CURRENT_PROJECT.set(conv.project)  # the memory tools act on this project
        if self.resume:
            self.continued = True
            await self.host.emit({}, loki={"event": "continue"})
        if self.settings.keep_turn_images and self.kind == "main":
            self.kept = KeptImages()
            self.kept.start(conv.messages)  # images not kept (a crash left them) leave first
        else:
            # images of an earlier turn (one a crash left open) leave the history first
            forget_images(conv.messages)
        if self.user_text is not None:
            if conv.pending and conv.pending[0] == self.user_text:
                conv.pending.pop(0)
            text, images = unpack(self.user_text)
            await self.host.keep_images(images)
            content = turn_images.image_content(self, text, images)
            conv.messages.append(ChatMessage(role="user", content=content))
            if not conv.title:
                first = text.strip() or (images[0].name if images else "")
                conv.title = first.splitlines()[0][:60] if first else ""
            meta: dict[str, Any] = {"event": "user"}
            if images:
                meta["images"] = [{"id": i.id, "name": i.name} for i in images]
            await self.host.emit({"role": "user", "content": text}, loki=meta)
        conv.turn_open = True
        await self.host.persist()
        return await self.check("start", then=self.project_update)

    async def project_update(self) -> State:
        """The project's block for this turn; with PROJ_SNAPSHOT, the update block stored
        after the turn-start compaction (see :mod:`.project.head`)."""
        if await self.host.project.begin_turn(self.conv):
            await self.host.persist()
        return await self.build()

    async def check(self, trigger: Trigger, then: State) -> State:
        if await self.compact(trigger):
            await self.host.persist()
        return then

    async def build(self) -> State:
        if self.outcome.steps >= self.step_budget:
            self.outcome.finish_reason = "step_budget"
            return self.finish
        self.outcome.steps += 1
        last_step = self.outcome.steps == self.step_budget
        if last_step and self.step_budget > 1 and not self.budget_reminded:
            self.budget_reminded = True
            await reminders.remind(self, "budget", reminders.BUDGET_REMINDER)
        return self.complete

    async def complete(self) -> State:
        """One completion under one lease (:mod:`.step`: the request, then its stream)."""
        self.result = None
        try:
            anticipated = fingerprints(step.preview(self, self.last_lease))
            async with self.host.lease(fingerprints=anticipated) as held:
                req = await step.prepare(self, held.lease)
                self.result = await step.stream(self, req)
                usage = self.result.acc.usage or {}
                held.report(
                    usage.get("prompt_tokens"),
                    usage.get("cached_tokens"),
                    prompt_fingerprint=next(reversed(fingerprints(req.wire)), None),
                    job_done=self.kind != "main"
                    and step_rules.last_side_request(
                        self.result, self.outcome.steps, self.settings.step_budget
                    ),
                )
        except LeaseStopped:
            self.outcome.stopped = True
            return self.finish
        except LeaseError as exc:
            self.outcome.error = f"engine unavailable: {exc}"
            return self.finish
        if self.result.responded:
            self.publish_perf(req.lease, req.wire, req.tools)
        if self.result.error is None and not self.result.stopped:
            await turn_images.measure_images(self, req.payload)
            # compaction: the slot now holds this prompt
            self.host.policy.note_step(
                self.conv.id,
                req.lease,
                req.body,
                self.result.acc.usage,
                len(self.conv.messages),
                len(self.result.acc.content),
            )
        return self.assess

    async def assess(self) -> State:
        result = self.result
        assert result is not None
        acc = result.acc
        if acc.usage is not None:
            self.outcome.usage = acc.usage
        if acc.timings is not None:
            self.outcome.timings = acc.timings
        if result.stopped:
            self.outcome.stopped = True
            await replies.keep_partial(self, stopped=True)
            return self.finish
        if isinstance(result.error, StreamError):
            self.outcome.error = str(result.error)
            await replies.keep_partial(self, error=str(result.error))
            return self.finish
        if result.error is not None:
            return await refusal.recover(self, result.error)
        content = acc.content
        found: list[tuple[str, str, str]] = [
            (c.id, c.name, c.arguments) for c in acc.ordered_calls() if c.name
        ]
        if self.sent_tools:
            content, text_calls = extract_text_tool_calls(content)
            base = len(self.conv.messages)
            for i, (name, args) in enumerate(text_calls):
                found.append((f"call_t{base}_{i}", name, args))
        if self.plan.mode == "none":
            if found or not content.strip():
                log.warning(
                    "replay with tool_choice none gave %s; falling back to no tools",
                    "a tool call" if found else "nothing",
                )
                self.plan.mode = "no_tools"
                await self.host.emit(
                    {}, loki={"event": "discarded", "reason": "tool call or empty under none"}
                )
                return self.complete
            self.plan.mode = "normal"
        elif self.plan.mode == "no_tools":
            found = []
        self.plan.suffix = None
        resume, self.resume = self.resume, False
        if found:
            await calls.accept_calls(self, content, found)
            return self.tools
        if content.strip() or (resume and content):
            if resume:
                replies.extend_last(self, content)
            else:
                replies.accept_message(self, ChatMessage(role="assistant", content=content))
            self.outcome.finish_reason = acc.finish_reason or "stop"
            await self.host.persist()
            return self.after_answer()
        if resume:  # nothing more to say: the reply was whole
            self.outcome.finish_reason = acc.finish_reason or "stop"
            return self.finish
        # reasoning only, or nothing at all
        if (
            self.act_reminders < reminders.MAX_ACT_REMINDERS
            and self.outcome.steps < self.step_budget
        ):
            self.act_reminders += 1
            await reminders.remind(self, "act", reminders.ACT_REMINDER)
            return self.build
        self.outcome.finish_reason = acc.finish_reason or "stop"
        return self.finish

    async def tools(self) -> State:
        """Run the step's calls (:mod:`.calls`), then the images a tool showed."""
        seen = await calls.run_calls(self)
        if seen and not self.outcome.stopped:
            await turn_images.show_images(self, seen)
        await self.host.persist()
        if self.outcome.stopped:
            return self.finish
        return await self.check("mid", then=self.build)

    async def verify(self) -> State:
        """The verifier and its corrective step (:func:`.turn_verify.verify`)."""
        return await turn_verify.verify(self)

    async def criteria(self) -> State:
        """Code mode's verification loop (:func:`.code.loop.verify_criteria`)."""
        return await code_loop.verify_criteria(self)

    def after_answer(self) -> State:
        """After a final text answer: code mode's criteria check when it applies
        (:func:`.code.rules.should_check`), else the verifier when it applies, else the
        end."""
        if code_rules.should_check(
            self.conv.code,
            kind=self.kind,
            continued=self.continued,
            finish_reason=self.outcome.finish_reason,
        ):
            return self.criteria
        return self.verify if self.should_verify() else self.finish

    async def finish(self) -> None:
        conv = self.conv
        reminders.drop_unanswered(self)  # a reminder left unanswered never stays
        conv.turn_open = False
        if self.kept is not None:  # KEEP_TURN_IMAGES: the turn's images kept within budget
            settle_turn(conv.messages, set(self.kept.fresh), self.lease_n_ctx)
        else:  # the ephemeral rule: an image is seen in the turn it arrives only
            forget_images(conv.messages)
        if not self.outcome.stopped and self.outcome.error is None:
            if await self.compact("end") and self.settings.prewarm:
                # PREWARM: the next request's prefix goes to the slot while the user reads
                self.host.prewarm(
                    PrewarmJob(
                        conv.id,
                        list(conv.messages),
                        self.offered_tools(),
                        self.echo_reasoning(),
                        system=self.sent_system,
                        head=self.sent_head,
                        lease=self.last_lease,
                    )
                )
        if self.outcome.stopped:
            finish = "stopped"
        elif self.outcome.error is not None:
            finish = "error"
        else:
            finish = self.outcome.finish_reason or "stop"
        self.outcome.finish_reason = finish
        meta = replies.turn_end_meta(self, finish)
        self.host.project.end_turn(conv)
        await self.host.emit(
            {},
            finish_reason=finish,
            usage=self.outcome.usage,
            timings=self.outcome.timings,
            loki=meta,
        )
        await self.host.persist()

    # -- helpers --------------------------------------------------------------------------
    def should_verify(self) -> bool:
        """:func:`.step_rules.should_verify` for this turn's answer."""
        return step_rules.should_verify(
            self.settings,
            kind=self.kind,
            verified=self.verified,
            continued=self.continued,
            finish_reason=self.outcome.finish_reason,
            preset_verify=self.preset_verify,
        )

    def offered_tools(self) -> list[dict[str, Any]] | None:
        """:func:`.step_rules.offered_tools` for the next step (the host's tool box, the
        plan's mode, the last lease's template and vision)."""
        return step_rules.offered_tools(
            self.host.toolbox.schemas(),
            mode=self.plan.mode,
            template=self.template,
            vision=self.vision,
        )

    def echo_reasoning(self) -> bool:
        """:func:`.step_rules.echo_reasoning` under the last lease."""
        return step_rules.echo_reasoning(self.settings, self.external, self.template)

    async def prime(self) -> None:
        """Have the engine count what :meth:`ctx_used` needs (bounded; estimates else)."""
        pending = [ChatMessage(role="user", content=unpack(t)[0]) for t in self.conv.pending]
        await self.conv.meter.prime(self.settings.system_prompt, [*self.conv.messages, *pending])

    async def compact(self, trigger: Trigger, overflow: OverflowInfo | None = None) -> bool:
        """Ask the context policy to compact at ``trigger``; True when it did. A failed
        compaction never fails the turn (logged, the turn goes on uncompacted)."""
        await self.prime()
        view = ContextView(
            conversation=self.conv,
            trigger=trigger,
            n_ctx=self.lease_n_ctx or self.conv.meter.n_ctx or 0,
            ctx_used=self.ctx_used(),
            overflow=overflow,
            emit=lambda delta, meta: self.host.emit(delta, loki=meta),
        )
        try:
            compacted = bool(await self.host.policy.maybe_compact(view))
        except Exception:  # a failed compaction never fails the turn: it goes on uncompacted
            log.exception("compaction (%s) failed", trigger)
            return False
        if compacted:  # the prompt changed anyway: PROJ_SNAPSHOT retakes its copy
            await self.host.project.after_compaction(self.conv)
        return compacted

    def ctx_used(self) -> int:
        """``ctx_used`` plus estimates of the user messages queued behind this turn."""
        # begin() moved this turn's message out of ``pending``: what is left waits behind it
        queued = sum(self.conv.meter.tokens(unpack(t)[0]) for t in self.conv.pending)
        return self.conv.meter.used(self.settings.system_prompt, self.conv.messages) + queued

    def publish_perf(
        self,
        lease: Lease,
        wire: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        assert self.result is not None
        # a scheduled task's run is a main turn of a ``task`` conversation
        kind = self.conv.kind if self.kind == "main" else self.kind
        self.host.publish_perf(self.result.perf_record(kind, self.conv.id, lease, wire, tools))
