"""The turn loop: an explicit state machine of small steps.

States (each a method returning the next one)::

    begin -> check(start) -> build -> complete -> assess --text--> [verify] --pass--> finish
                               ^                     |                 |--fail: build (once)
                               |                     |--tool calls--> tools -> check(mid) -+
                               |                     |--reasoning only (<= 2 reminders)----+
                               |                     |--500: replay tool_choice none, then no tools
                               |                     |--overflow: echo off, then compaction, replay
                               +---------------------+

Rules implemented here (tests named in docs/behaviour.md (chat)):

- Step budget per turn (``LOKI_STEP_BUDGET``); a reminder goes with the last step. A step
  that ends with reasoning only (no text, no call) gets at most two reminders to act.
- Reminders are persisted exactly as sent, as user messages marked by the field
  ``loki.injected`` (never a text prefix). Behind another user message a reminder is sent
  once at the end of that message and not stored (no two consecutive user messages). One
  left unanswered by a stop or an error is removed before the conversation is persisted.
- NUDGE_IN_TOOL (seeds; ``LOKI_NUDGE_IN_TOOL``, off by default): the budget reminder is
  appended to the last tool result (that message, persisted as sent) instead of a separate
  user message, only on a local engine whose template probe says ``stable_prefix`` and when
  the last message is a tool result with text; otherwise the separate message. Off, the
  requests are byte-identical to before (frozen copy in tests/templates).
- The chat template probe's verdicts come with every lease (``Lease.template``): a template
  that drops tools (``supports_tools`` false) gets no ``tools`` at all, and the user is told
  once per turn (event ``tools_unavailable``, and ``/api/chat/state``); REASONING_ECHO sends
  nothing back to a template that does not render ``reasoning_content``. No verdict (an
  external API, an engine not probed): as before.
- Text the model wrote before a tool call is stored once (in the message that carries the
  calls). Calls written as text (``<tool_call>…</tool_call>``) are executed like native ones.
  Calls run in index order; invalid JSON arguments are not executed (see :mod:`.tools`).
- HTTP 500 from the local engine: replay once with the same tools and system message,
  ``tool_choice: "none"`` and an instruction at the end of the last message (never
  persisted); refused again, a tool call anyway, or an empty answer: once more without tools.
- Context overflow only from llama.cpp's ``exceed_context_size_error`` / "exceeds the
  available context size", OpenAI's ``context_length_exceeded``, or, with no label, a
  conversation already at 90% of the window: reasoning echo dropped first, then the
  :class:`~loki_chat.context.ContextPolicy` (at most two compactions per step) and replay.
  "Context size has been exceeded." without a token count while two slots serve is replayed
  as is (once), never compacted.
- The verifier (``LOKI_VERIFY`` or the preset's ``VERIFY``; :mod:`loki_chat.verify`) checks
  a main turn's final text answer once; a failing verdict adds one corrective step (a
  ``verify`` reminder, persisted as sent, then one more completion), never two.
- A stop or a broken stream keeps the partial text, marked ``loki.stopped`` /
  ``loki.error``; nothing half-assembled (tool calls) is kept.
- The conversation is persisted after every accepted step (the blob is written whole).
- Images: the ephemeral rule (:mod:`loki_chat.images`: a turn's images become markers at
  its end); with KEEP_TURN_IMAGES (``LOKI_KEEP_TURN_IMAGES``, off by default) a main turn's
  images are references resolved before each request (:meth:`TurnRunner.model_view`),
  measured after the first request that sends them (:meth:`TurnRunner.measure_images`) and
  kept at the turn's end within the budget (:mod:`loki_chat.kept_images`). Off, the
  requests are byte-identical to before (frozen copy in tests/chat/test_chat_images.py).
- A step cut at the request's ``max_tokens`` ends the turn with ``finish_reason: "length"``;
  the turn end says ``cut_at`` (the cap). Continue (``resume``) sends the conversation as it
  is — its last message the cut assistant reply — so llama-server continues that message
  (assistant prefill; the prefix is in the slot's cache); the text is appended to the same
  stored message, marked by a ``continue`` display event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from loki_shared.fingerprint import fingerprints
from loki_shared.lease import EngineLease, LeaseError, LeaseStopped
from loki_shared.messages.base import RequestKind
from loki_shared.messages.chat import (
    REMINDER_KINDS,
    ChatEvent,
    ChatMessage,
    ImageAttachment,
    LokiMeta,
    ToolCall,
    ToolCallFunction,
)
from loki_shared.messages.engine import Lease, TemplateProbe
from loki_shared.messages.perf import PerfRecord

from .compaction import layout
from .context import ContextPolicy, ContextView, OverflowInfo, Trigger
from .conversation import Conversation
from .engine import EngineClient, StepResult
from .errors import StepError, StreamError
from .images import PendingItem, forget_images, unpack, user_content
from .kept_images import KeptImages, settle_turn
from .prewarm import PrewarmJob
from .project.head import ProjectHead
from .request import build_payload, encode, wire_messages
from .settings import Settings
from .stream import extract_text_tool_calls
from .tokens import TokenCounts
from .tools import ToolBox, ToolOutcome, cut_for_model, label, parse_arguments
from .tools.box import CallContext
from .tools.memory import CURRENT_PROJECT
from .tools.vision import NAME as SEE_IMAGE
from .verify import corrective_reminder, last_request, run_verify, verify_enabled

log = logging.getLogger("loki.chat.turn")

BUDGET_REMINDER = (
    "[Loki] This is the last step of this turn: answer the user now with "
    "what you have, without calling a tool."
)
ACT_REMINDER = (
    "[Loki] You reasoned but neither answered nor called a tool. Act now: "
    "answer the user, or call the tool you need."
)
NO_TOOL_INSTRUCTION = (
    "(Answer the user directly now, in the user's language, with text only: do not call any tool.)"
)

MAX_ACT_REMINDERS = 2
#: Tools offered only when the lease's endpoint sees images.
VISION_TOOLS = frozenset({SEE_IMAGE})
MAX_COMPACTIONS_PER_STEP = 2


class TurnHost(Protocol):
    """What the loop needs from the conversation's owner (:class:`loki_chat.actor.Actor`)."""

    conv: Conversation
    settings: Settings
    toolbox: ToolBox
    engine: EngineClient
    policy: ContextPolicy
    stop: asyncio.Event

    async def emit(self, delta: dict[str, Any] | None = None, **fields: Any) -> ChatEvent: ...
    async def persist(self) -> None: ...
    def lease(self, kind: RequestKind = "main") -> EngineLease: ...
    def publish_perf(self, record: PerfRecord) -> None: ...
    async def total_slots(self) -> int | None: ...
    def tools_withheld(self, unavailable: dict[str, Any] | None) -> None: ...
    async def keep_images(self, images: list[ImageAttachment]) -> None: ...
    async def shelf_images(self) -> dict[str, ImageAttachment]: ...
    def prewarm(self, job: PrewarmJob) -> object: ...

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


@dataclass
class StepPlan:
    """How the next request is shaped: ``mode`` is ``normal``, ``none`` (tool_choice none
    after a 500) or ``no_tools``; ``suffix`` an ephemeral instruction; ``echo`` whether
    reasoning may be sent back."""

    mode: str = "normal"
    suffix: str | None = None
    echo: bool = True
    compactions: int = 0
    pool_replays: int = 0


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
    lease_n_ctx: int = 0
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
            conv.messages.append(ChatMessage(role="user", content=self.image_content(text, images)))
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
            await self.remind("budget", BUDGET_REMINDER)
        return self.complete

    async def complete(self) -> State:
        host = self.host
        self.result = None
        try:
            async with host.lease() as held:
                lease = held.lease
                self.lease_n_ctx = lease.n_ctx
                if lease.n_ctx:
                    self.conv.meter.n_ctx = lease.n_ctx
                self.model = lease.model
                self.external = lease.external
                self.template = lease.template
                self.vision = lease.vision
                self.preset_verify = lease.verify
                echo_model = lease.model if self.echo_reasoning() and self.plan.echo else None
                tail_first = layout.for_lease(self.settings.compact_tail_reuse, lease)
                tools = self.offered_tools()
                project = self.host.project
                system = project.system_prompt(self.settings.system_prompt)
                # the configured tools (not this step's fallback) are part of the prompt's identity
                configured = self.host.toolbox.schemas()
                head = project.head(
                    self.conv, system, configured, f"{lease.base_url}|{lease.model}"
                )
                self.sent_system, self.sent_head = system, head
                wire = wire_messages(
                    system,
                    layout.laid_out(await self.model_view(), tail_first),
                    echo_model=echo_model,
                    suffix=self.plan.suffix,
                    head=head,
                )
                await self.tell_withheld()
                payload = build_payload(
                    self.settings,
                    lease,
                    wire,
                    tools,
                    tool_choice="none" if self.plan.mode == "none" else None,
                )
                body = encode(payload)
                self.max_tokens_sent = payload.get("max_tokens")
                self.sent_wire = wire
                counter = self.conv.meter.counter
                if counter is not None:  # the engine of this lease counts
                    counter.use(lease.base_url, lease.api_key, lease.model, lease.external)
                await self.prime()
                self.estimate_at_send = self.ctx_used()
                self.sent_tools = bool(tools)
                self.sent_echo = any("reasoning_content" in m for m in wire)
                first = True

                async def on_delta(deltas: list[dict[str, Any]]) -> None:
                    nonlocal first
                    for delta in deltas:
                        if first:
                            delta = {"role": "assistant", **delta}
                            first = False
                        await host.emit(delta)

                async def on_retry(attempt: int, delay: float, reason: str) -> None:
                    await host.emit(
                        {},
                        loki={
                            "event": "retry",
                            "attempt": attempt,
                            "delay_s": delay,
                            "reason": reason,
                        },
                    )

                self.result = await host.engine.stream(
                    lease.base_url,
                    body,
                    api_key=lease.api_key,
                    stop=host.stop,
                    on_delta=on_delta,
                    on_retry=on_retry,
                )
                usage = self.result.acc.usage or {}
                held.report(
                    usage.get("prompt_tokens"),
                    usage.get("cached_tokens"),
                    prompt_fingerprint=next(reversed(fingerprints(wire)), None),
                    job_done=self.kind != "main" and self.last_side_request(),
                )
        except LeaseStopped:
            self.outcome.stopped = True
            return self.finish
        except LeaseError as exc:
            self.outcome.error = f"engine unavailable: {exc}"
            return self.finish
        if self.result.responded:
            self.publish_perf(lease, wire)
        if self.result.error is None and not self.result.stopped:
            await self.measure_images(payload)
            # compaction: the slot now holds this prompt
            host.policy.note_step(
                self.conv.id,
                lease,
                body,
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
            await self.keep_partial(stopped=True)
            return self.finish
        if isinstance(result.error, StreamError):
            self.outcome.error = str(result.error)
            await self.keep_partial(error=str(result.error))
            return self.finish
        if result.error is not None:
            return await self.refused(result.error)
        content = acc.content
        calls: list[tuple[str, str, str]] = [
            (c.id, c.name, c.arguments) for c in acc.ordered_calls() if c.name
        ]
        if self.sent_tools:
            content, text_calls = extract_text_tool_calls(content)
            base = len(self.conv.messages)
            for i, (name, args) in enumerate(text_calls):
                calls.append((f"call_t{base}_{i}", name, args))
        if self.plan.mode == "none":
            if calls or not content.strip():
                log.warning(
                    "replay with tool_choice none gave %s; falling back to no tools",
                    "a tool call" if calls else "nothing",
                )
                self.plan.mode = "no_tools"
                await self.host.emit(
                    {}, loki={"event": "discarded", "reason": "tool call or empty under none"}
                )
                return self.complete
            self.plan.mode = "normal"
        elif self.plan.mode == "no_tools":
            calls = []
        self.plan.suffix = None
        resume, self.resume = self.resume, False
        if calls:
            return await self.accept_calls(content, calls)
        if content.strip() or (resume and content):
            if resume:
                self.extend_last(content)
            else:
                self.accept_message(ChatMessage(role="assistant", content=content))
            self.outcome.finish_reason = acc.finish_reason or "stop"
            await self.host.persist()
            return self.verify if self.should_verify() else self.finish
        if resume:  # nothing more to say: the reply was whole
            self.outcome.finish_reason = acc.finish_reason or "stop"
            return self.finish
        # reasoning only, or nothing at all
        if self.act_reminders < MAX_ACT_REMINDERS and self.outcome.steps < self.step_budget:
            self.act_reminders += 1
            await self.remind("act", ACT_REMINDER)
            return self.build
        self.outcome.finish_reason = acc.finish_reason or "stop"
        return self.finish

    async def accept_calls(self, content: str, calls: list[tuple[str, str, str]]) -> State:
        stored: list[ToolCall] = []
        for n, (call_id, name, args) in enumerate(calls):
            call_id = call_id or f"call_{len(self.conv.messages)}_{n}"
            parsed, _ = parse_arguments(args)
            stored.append(
                ToolCall(
                    id=call_id,
                    function=ToolCallFunction(
                        name=name, arguments=args if parsed is not None else "{}"
                    ),
                )
            )
        self.pending_calls = stored
        self.pending_raw = {c.id: a for c, (_, _, a) in zip(stored, calls)}
        self.accept_message(
            ChatMessage(role="assistant", content=content or None, tool_calls=stored)
        )
        await self.host.persist()
        return self.tools

    async def tools(self) -> State:
        host = self.host
        stopped_text = "Not executed: the user stopped the turn."
        seen: list[ImageAttachment] = []
        for call in self.pending_calls:
            # every call gets a result, even when stopped: a call without its result would
            # break the next request
            text = stopped_text
            raw_args = self.pending_raw.get(call.id, call.function.arguments)
            if not host.stop.is_set():
                name = call.function.name
                context = CallContext(call.id, self.conv.id, host.stop, host.emit)
                running = host.toolbox.execute(name, raw_args, context)
                if host.toolbox.handles_stop(name):  # it ends itself: its result is kept
                    outcome: ToolOutcome | None = await running
                else:
                    outcome = await self.wait_or_stop(running)
                if outcome is not None:
                    text = outcome.text
                    seen += outcome.images
            if text is stopped_text or host.stop.is_set():
                self.outcome.stopped = True
            model_text = cut_for_model(text, self.settings.tool_result_max)
            self.conv.messages.append(
                ChatMessage(
                    role="tool", tool_call_id=call.id, name=call.function.name, content=model_text
                )
            )
            await host.emit(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.function.name,
                    "content": text,
                },
                loki={
                    "event": "tool_result",
                    "label": label(call.function.name, parse_arguments(raw_args)[0] or {}),
                },
            )
        self.pending_calls = []
        if seen and not self.outcome.stopped:
            await self.show_images(seen)
        await host.persist()
        if self.outcome.stopped:
            return self.finish
        return await self.check("mid", then=self.build)

    async def verify(self) -> State:
        """The verifier (:mod:`loki_chat.verify`): check the final answer; a failing verdict
        adds one corrective step (a ``verify`` reminder, then one more completion)."""
        host = self.host
        self.verified = True
        answer = self.conv.messages[-1]
        request = last_request(self.conv.messages[:-1])
        if request is None or not isinstance(answer.content, str):
            return self.finish
        outcome = await run_verify(
            settings=self.settings,
            engine=host.engine,
            lease=lambda: host.lease("verify"),
            conversation=self.conv.id,
            request=request,
            answer=answer.content,
            stop=host.stop,
            publish_perf=host.publish_perf,
        )
        verdict = outcome.verdict
        if outcome.stopped or verdict is None:
            self.outcome.stopped = True
            return self.finish
        meta: dict[str, Any] = {
            "event": "verify",
            "verdict": "pass" if verdict.ok else "fail",
            "reason": verdict.reason,
        }
        if verdict.malformed:
            meta["malformed"] = True
        await host.emit({}, loki=meta)
        if verdict.ok:
            return self.finish
        if self.outcome.steps >= self.step_budget:
            self.budget_extra += 1  # the corrective step is one more than the budget
        if self.outcome.steps + 1 >= self.step_budget:
            self.budget_reminded = True  # the verify reminder already asks for the answer
        self.outcome.finish_reason = None
        await self.remind("verify", corrective_reminder(verdict))
        return self.build

    async def finish(self) -> None:
        conv = self.conv
        if self.nudged is not None and conv.messages and conv.messages[-1] is self.nudged[0]:
            # a nudge left unanswered goes like an unanswered reminder: the tool result as it was
            conv.messages[-1].content = self.nudged[1]
        self.nudged = None
        # a reminder left unanswered (stop, error, budget) never stays in the history
        while (
            conv.messages
            and conv.messages[-1].loki
            and conv.messages[-1].loki.injected in REMINDER_KINDS
        ):
            conv.messages.pop()
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
                    )
                )
        if self.outcome.stopped:
            finish = "stopped"
        elif self.outcome.error is not None:
            finish = "error"
        else:
            finish = self.outcome.finish_reason or "stop"
        self.outcome.finish_reason = finish
        meta: dict[str, Any] = {"event": "turn_end", "steps": self.outcome.steps}
        if self.outcome.stopped:
            meta["stopped"] = True
        if self.outcome.error is not None:
            meta["error"] = self.outcome.error
        if finish == "length" and self.max_tokens_sent:
            generated = (self.outcome.usage or {}).get("completion_tokens")
            if not isinstance(generated, int) or generated >= self.max_tokens_sent:
                meta["cut_at"] = self.max_tokens_sent  # cut at the cap (not by the window)
        if self.prefix_unstable():
            meta["prefix_unstable"] = True  # the UI's prefill badge says why the cache is lost
        meta["ctx_used"] = conv.meter.used(self.settings.system_prompt, conv.messages)
        self.host.project.end_turn(conv)
        await self.host.emit(
            {},
            finish_reason=finish,
            usage=self.outcome.usage,
            timings=self.outcome.timings,
            loki=meta,
        )
        await self.host.persist()

    async def show_images(self, images: list[ImageAttachment]) -> None:
        """Images a tool gave (``see_image``): one user message after the step's results,
        marked ``injected="see_image"``; the ephemeral rule removes them at the turn's end."""
        names = ", ".join(i.name for i in images)
        text = f"[see_image] {names}"
        self.conv.messages.append(
            ChatMessage(
                role="user",
                content=self.image_content(text, images),
                loki=LokiMeta(injected="see_image"),
            )
        )
        await self.host.emit(
            {"role": "user", "content": text},
            loki={
                "event": "see_image",
                "injected": "see_image",
                "images": [{"id": i.id, "name": i.name} for i in images],
            },
        )

    # -- helpers --------------------------------------------------------------------------
    def image_content(self, text: str, images: list[ImageAttachment]) -> Any:
        """A user message's content with this turn's images: data URLs (the ephemeral
        rule), or references with KEEP_TURN_IMAGES (:mod:`loki_chat.kept_images`)."""
        if self.kept is not None:
            return self.kept.content(text, images)
        return user_content(text, images)

    async def model_view(self) -> list[ChatMessage]:
        """The messages the next request sends: the stored ones, with KEEP_TURN_IMAGES'
        references resolved for this step's lease (a kept image that cannot be sent becomes
        its marker now: the meter's measure no longer holds)."""
        if self.kept is None:
            return self.conv.messages
        view, changed = await self.kept.wire_view(
            self.conv.messages, self.host.shelf_images, self.vision
        )
        if changed:
            log.info("[images] %s: no longer kept: %s", self.conv.id, self.kept.dropped)
            self.conv.meter.invalidate()
            await self.host.persist()
        return view

    async def measure_images(self, payload: dict[str, Any]) -> None:
        """KEEP_TURN_IMAGES: the cost of the images this step sent first (measured by the
        engine; :meth:`loki_chat.kept_images.KeptImages.measure`)."""
        if self.kept is None or not self.kept.new or self.result is None:
            return
        counter = self.conv.meter.counter
        count = counter.text_prompt_tokens if isinstance(counter, TokenCounts) else None
        cost = await self.kept.measure(self.conv.messages, payload, self.result.acc.usage, count)
        log.info("[images] %s: measured cost %s tokens an image", self.conv.id, cost)

    def should_verify(self) -> bool:
        """The verifier checks this answer: a main turn's final text answer ended by
        ``stop`` (not a Continue), not yet verified, the verifier on (the preset's VERIFY,
        else ``LOKI_VERIFY``)."""
        return (
            self.kind == "main"
            and not self.verified
            and not self.continued
            and self.outcome.finish_reason == "stop"
            and verify_enabled(self.settings, self.preset_verify)
        )

    def last_side_request(self) -> bool:
        """A side job's request is its last one (``job_done`` on its release): no tool call
        came back, or the step budget is spent."""
        acc = self.result.acc if self.result else None
        calls = bool(acc and (acc.ordered_calls() or "<tool_call>" in acc.content))
        return not calls or self.outcome.steps >= self.settings.step_budget

    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas offered to the next step (None: no ``tools`` key): the host's
        tool box, none in the no-tools fallback, none to a model whose chat template drops
        them (the lease's probe says ``supports_tools`` false: sending them would only
        waste tokens the model never sees). Every rule that takes tools away for a step or
        a model (``self.model``, the lease's) belongs here."""
        if self.plan.mode == "no_tools":
            return None
        if self.tools_dropped():
            return None
        schemas = self.host.toolbox.schemas()
        if not self.vision:  # see_image only for an endpoint that sees images
            schemas = [s for s in schemas if s["function"]["name"] not in VISION_TOOLS]
        return schemas

    def prefix_unstable(self) -> bool:
        """The lease's template probe says the template does not keep a stable prefix
        (``stable_prefix`` False): cache losses on it are the template's (issue 16)."""
        return self.template is not None and self.template.stable_prefix is False

    def tools_dropped(self) -> bool:
        """The lease's template probe says the template ignores ``tools``."""
        return self.template is not None and self.template.supports_tools is False

    async def tell_withheld(self) -> None:
        """Tell the user, once per turn, that the tools are off for this model (display
        event ``tools_unavailable``; also kept for ``/api/chat/state``)."""
        if not self.tools_dropped():
            self.host.tools_withheld(None)
            return
        names = [t["function"]["name"] for t in self.host.toolbox.schemas() or []]
        unavailable = {
            "tools": names,
            "model": self.model,
            "reason": "this model's template ignores tools: recall is off for it",
        }
        self.host.tools_withheld(unavailable)
        if names and not self.withheld_told:
            self.withheld_told = True
            await self.host.emit({}, loki={"event": "tools_unavailable", **unavailable})

    def echo_reasoning(self) -> bool:
        """REASONING_ECHO applies to this step: the key is on, the engine is local, and its
        template renders ``reasoning_content`` (or was not probed)."""
        return (
            self.settings.reasoning_echo
            and not self.external
            and not (self.template is not None and self.template.renders_reasoning is False)
        )

    def nudge_fits(self) -> bool:
        """NUDGE_IN_TOOL may put the budget reminder in the last tool result: the key is on,
        the engine is local, its template keeps a stable prefix (probe), and the last message
        is a tool result with text (any other shape: the separate message)."""
        last = self.conv.messages[-1] if self.conv.messages else None
        return bool(
            self.settings.nudge_in_tool
            and not self.external
            and self.template is not None
            and self.template.stable_prefix is True
            and last is not None
            and last.role == "tool"
            and isinstance(last.content, str)
        )

    async def refused(self, error: StepError) -> State:
        """The engine refused the request before streaming (HTTP error or unreachable)."""
        kind, info = classify_refusal(error, self.ctx_used(), self.lease_n_ctx)
        if kind == "pool":
            slots = await self.host.total_slots()
            if slots is not None and slots >= 2 and self.plan.pool_replays < 1:
                self.plan.pool_replays += 1
                log.warning("shared KV pool full with two slots; replaying as is")
                return self.complete
            kind, info = classify_refusal(error, self.ctx_used(), self.lease_n_ctx, pool=False)
        if kind == "overflow":
            if self.sent_echo and self.plan.echo:
                self.plan.echo = False
                return self.complete
            if self.plan.compactions < MAX_COMPACTIONS_PER_STEP and await self.compact(
                "reactive", info
            ):
                self.plan.compactions += 1
                await self.host.persist()
                return self.complete
            self.outcome.error = f"the conversation no longer fits the context window: {error}"
            return self.finish
        if error.status == 500 and not self.external:
            if self.plan.mode == "normal" and self.sent_tools:
                self.plan.mode = "none"
                self.plan.suffix = NO_TOOL_INSTRUCTION
                log.warning("engine answered 500; replaying with tool_choice none")
                return self.complete
            if self.plan.mode == "none":
                self.plan.mode = "no_tools"
                log.warning("replay with tool_choice none refused; falling back to no tools")
                return self.complete
        self.outcome.error = str(error)
        return self.finish

    async def remind(self, kind: str, text: str) -> None:
        """Inject a reminder: persisted as a marked user message, unless the last message is
        a user message (then sent once at its end, not stored), or, for the budget reminder
        with NUDGE_IN_TOOL, appended to the last tool result (:meth:`nudge_fits`)."""
        conv = self.conv
        if kind == "budget" and self.nudge_fits():
            last = conv.messages[-1]
            self.nudged = (last, last.content)
            last.content = f"{last.content}\n\n{text}" if last.content else text
            await self.host.emit(
                {}, loki={"event": "reminder", "injected": kind, "stored": True, "in_tool": True}
            )
            await self.host.persist()
            return
        if conv.messages and conv.messages[-1].role == "user":
            self.plan.suffix = text if not self.plan.suffix else f"{self.plan.suffix}\n\n{text}"
            await self.host.emit({}, loki={"event": "reminder", "injected": kind, "stored": False})
            return
        conv.messages.append(ChatMessage(role="user", content=text, loki=LokiMeta(injected=kind)))
        await self.host.emit(
            {"role": "user", "content": text},
            loki={"event": "reminder", "injected": kind, "stored": True},
        )
        await self.host.persist()

    def extend_last(self, content: str) -> None:
        """Continue: append ``content`` to the last (assistant) message, which the engine
        continued; its stop/error marks go (the reply is resumed), the meter takes the
        step's measure."""
        last = self.conv.messages.pop()
        text = last.content if isinstance(last.content, str) else ""
        self.accept_message(last.model_copy(update={"content": text + content, "loki": None}))

    def accept_message(self, message: ChatMessage) -> None:
        acc = self.result.acc if self.result else None
        echo = self.echo_reasoning()
        if acc is not None and echo and acc.reasoning:
            message.reasoning_content = acc.reasoning
            message.reasoning_model = self.model
        self.conv.messages.append(message)
        prompt = (acc.usage or {}).get("prompt_tokens") if acc is not None else None
        if isinstance(prompt, int) and prompt and self.estimate_at_send:
            gap = abs(self.estimate_at_send - prompt) / prompt
            if gap > 0.02:
                log.info(
                    "[ctx] %s: estimate %d vs measured prompt %d (%.0f%%)",
                    self.conv.id,
                    self.estimate_at_send,
                    prompt,
                    gap * 100,
                )
        if acc is not None:
            # only the local server's separated reasoning is subtracted; an external API's
            # count is kept whole (its reasoning is not separated piece by piece)
            sent_back = self.external or bool(
                echo and message.reasoning_content and (message.content or message.tool_calls)
            )
            self.conv.meter.record(
                acc.usage,
                acc.reasoning_pieces,
                reasoning_sent_back=sent_back,
                count=len(self.conv.messages),
            )

    async def keep_partial(self, *, stopped: bool = False, error: str | None = None) -> None:
        """Keep the partial text of a stopped or broken step, marked; drop partial calls."""
        acc = self.result.acc if self.result else None
        text = acc.content if acc else ""
        if text.strip():
            self.accept_message(
                ChatMessage(
                    role="assistant", content=text, loki=LokiMeta(stopped=stopped, error=error)
                )
            )
        await self.host.emit(
            {},
            loki={
                "event": "stopped" if stopped else "error",
                **({"message": error} if error else {}),
            },
        )

    async def prime(self) -> None:
        """Have the engine count what :meth:`ctx_used` needs (bounded; estimates else)."""
        pending = [ChatMessage(role="user", content=unpack(t)[0]) for t in self.conv.pending]
        await self.conv.meter.prime(self.settings.system_prompt, [*self.conv.messages, *pending])

    async def compact(self, trigger: Trigger, overflow: OverflowInfo | None = None) -> bool:
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

    async def wait_or_stop(self, coro: Awaitable[Any]) -> Any:
        """Await ``coro`` unless the stop fires first (then cancel it and return None)."""
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self.host.stop.wait())
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task in done:
            return task.result()
        task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - cancelled on purpose
            pass
        return None

    def publish_perf(self, lease: Lease, wire: list[dict[str, Any]]) -> None:
        assert self.result is not None
        # a scheduled task's run is a main turn of a ``task`` conversation
        kind = self.conv.kind if self.kind == "main" else self.kind
        self.host.publish_perf(self.result.perf_record(kind, self.conv.id, lease, wire))


_TOKENS_IN_TEXT = re.compile(r"\d+\s*tokens", re.IGNORECASE)


def classify_refusal(
    error: StepError, ctx_used: int, n_ctx: int, pool: bool = True
) -> tuple[str, OverflowInfo | None]:
    """Classify an engine refusal: ``"overflow"`` (with its info), ``"pool"`` (llama.cpp's
    "Context size has been exceeded." without a token count: a shared KV pool full, which
    the caller replays as is when two slots serve) or ``"other"``.

    Overflow only from llama.cpp's ``exceed_context_size_error`` / "exceeds the available
    context size", OpenAI's ``context_length_exceeded``, or — with no label at all — a
    400/500 refusal while the conversation is already at 90% of the window.
    """
    body = error.body or ""
    low = body.lower()
    n_prompt = n_window = None
    try:
        obj = json.loads(body)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict):
            n_prompt = (
                err.get("n_prompt_tokens") if isinstance(err.get("n_prompt_tokens"), int) else None
            )
            n_window = err.get("n_ctx") if isinstance(err.get("n_ctx"), int) else None
    except ValueError:
        pass
    info = OverflowInfo(status=error.status, body=body, n_prompt_tokens=n_prompt, n_ctx=n_window)
    if (
        "exceed_context_size_error" in low
        or "exceeds the available context size" in low
        or "context_length_exceeded" in low
    ):
        return "overflow", info
    if pool and "context size has been exceeded" in low and not _TOKENS_IN_TEXT.search(body):
        return "pool", info
    if error.status in (400, 500) and n_ctx > 0 and ctx_used >= 0.9 * n_ctx:
        return "overflow", info
    return "other", None
