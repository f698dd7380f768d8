"""The owner-side state of one conversation: its queue, its worker, its events.

An :class:`Actor` exists for each conversation this instance owns (see
:mod:`loki_chat.ownership`); it is the turn loop's host (:class:`~loki_chat.turn.TurnHost`).

Queue: a send while a turn runs is queued (FIFO, persisted with the blob) and runs next;
it is never refused. Display events get their seq here: seqs are reserved in Redis ahead of
publication (blocks of :data:`SEQ_BLOCK`), so an owner that dies never leaves a seq for the
next owner to reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loki_shared import subjects
from loki_shared.lease import EngineLease
from loki_shared.messages.base import RequestKind
from loki_shared.messages.chat import REMINDER_KINDS, ChatEvent, ImageAttachment
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, Lease
from loki_shared.messages.perf import PerfRecord

from .bus import ChatBus
from .code.check import check_all
from .code.rules import criteria_event, workspace_of
from .code.workspace import WorkspaceClient
from .context import ContextPolicy
from .conversation import Conversation
from .engine import EngineClient
from .errors import FencedWrite
from .image_shelf import ImageShelf
from .images import pending_item, unpack
from .leases import PREWARM_WAIT_S, EngineLeases
from .mcp import McpManager
from .prewarm import PrewarmJob, run_prewarm
from .project.head import ProjectHead
from .settings import Settings
from .store import Store
from .tasks.store import TaskStore
from .tokens import TokenCounts
from .tools import ToolBox, ToolSpec
from .tools.code import CodeTarget, code_tools
from .turn import TurnRunner
from .verify import Verdict, run_verify

log = logging.getLogger("loki.chat.service")

#: Display seqs reserved in Redis at a time (one small write per block of events).
SEQ_BLOCK = 64
#: Tries of the error end of a turn that raised (one a second).
FAILED_END_TRIES = 15


@dataclass
class Shared:
    """What every actor of one chat instance uses (built once by the service).

    An actor takes ``toolbox`` and ``policy`` when it is created: replace them before the
    first conversation is served. ``closing`` is set when the service stops (workers then
    start no new turn).
    """

    settings: Settings
    store: Store
    bus: ChatBus
    leases: EngineLeases
    engine: EngineClient
    toolbox: ToolBox
    policy: ContextPolicy
    closing: bool = False
    shelf: ImageShelf | None = None  # the conversations' images (see_image)
    tokens: TokenCounts | None = None  # exact token counts (None: estimates)
    tasks: TaskStore | None = None  # marks the person's running turns for task runs
    #: the project block and PROJ_SNAPSHOT (no memory service: no block)
    project: ProjectHead = field(default_factory=lambda: ProjectHead(fetch=None))
    #: the conversation of this instance's last main turn and how its requests were shaped
    #: (``messages`` left empty: taken from the conversation when used) — PREWARM after an
    #: engine restart (:mod:`loki_chat.restart_prewarm`) sends its prefix again
    slot_owner: PrewarmJob | None = None
    #: the person's MCP servers (None: none, the built-in tools alone)
    mcp: McpManager | None = None
    #: the workspace service (code mode's tools and criteria; None: no code tools)
    workspace: WorkspaceClient | None = None


class Actor:
    """The owner-side state of one conversation (implements the turn loop's host).

    Args:
        shared: the instance's shared parts.
        conv: the conversation, loaded from its blob.
        lock_value: the fencing token of this instance's lock on it (every write carries it).
    """

    def __init__(self, shared: Shared, conv: Conversation, lock_value: str) -> None:
        self.shared = shared
        self.conv = conv
        conv.meter.counter = shared.tokens
        self.lock_value = lock_value
        self.settings = shared.settings
        self.engine = shared.engine
        self.policy = shared.policy
        self.project = shared.project
        self.stop = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None
        self.lost = False
        self.last_access = time.monotonic()
        self._emit_lock = asyncio.Lock()
        self._persist_lock = asyncio.Lock()
        self.reserved = 0  # seqs up to this one are reserved in Redis
        self.turn_ends = 0  # end events emitted (a turn that fails before its own gets one)
        #: the tools the last step could not offer and why (the model's template drops
        #: them; ``/api/chat/state``), None when they were offered
        self.tools_unavailable: dict[str, Any] | None = None
        #: the lease of this conversation's last step (None: none since this instance
        #: took it): the next turn's first lease request anticipates its messages with it
        self.last_lease: Lease | None = None
        self._prewarm: asyncio.Task[str] | None = None  # PREWARM's request, while it runs
        #: the MCP tools this conversation was last offered (name -> schema digest; None:
        #: not yet looked at by this owner): a change is told once, ``tools_changed``
        self.mcp_seen: dict[str, str] | None = None
        self._code_specs: list[ToolSpec] | None = None  # built at the first use

    @property
    def toolbox(self) -> ToolBox:
        """The tools this conversation is offered: the instance's built-ins, then the MCP
        tools its project allows (:meth:`loki_chat.mcp.McpManager.box`; a task's run gets its
        project's), then, in code mode, the code tools in their fixed order
        (:func:`loki_chat.tools.code.code_tools`)."""
        mcp = self.shared.mcp
        base = self.shared.toolbox
        if mcp is not None:
            base = mcp.box(base, self.conv.project)
        if self.conv.code.mode != "code" or self.shared.workspace is None:
            return base
        if self._code_specs is None:
            self._code_specs = code_tools(self.code_target(self.shared.workspace))
        return ToolBox([*base.specs.values(), *self._code_specs])

    # -- code mode ------------------------------------------------------------------------
    @property
    def workspace_project(self) -> str:
        """The project whose workspace this conversation works in."""
        return workspace_of(self.conv.code, self.conv.project)

    def code_target(self, workspace: WorkspaceClient) -> CodeTarget:
        """What the code tools act on: this conversation's workspace and code state."""
        return CodeTarget(
            workspace=workspace,
            project=lambda: self.workspace_project,
            state=lambda: self.conv.code,
            changed=self.criteria_changed,
            check=lambda stop: self.check_criteria(stop),
            run_timeout_s=self.settings.code_run_timeout_s,
            result_max=self.settings.tool_result_max,
        )

    async def criteria_changed(self) -> None:
        """The criteria changed or were checked: the ``criteria`` display event, then the
        conversation written."""
        await self.emit({}, loki=criteria_event(self.conv.code))
        await self.persist()

    async def check_criteria(self, stop: asyncio.Event, answer: str = "") -> bool:
        """Check every criterion now (:func:`loki_chat.code.check.check_all`; the verifier
        judges those without a command, under a ``verify`` lease), then tell and keep the
        result (:meth:`criteria_changed`). False when a stop ended the check (what was
        checked is kept)."""
        workspace = self.shared.workspace
        if workspace is None:
            return True

        async def judge(prompt: str, message: str) -> Verdict | None:
            outcome = await run_verify(
                settings=self.settings,
                engine=self.engine,
                lease=lambda sent: self.lease("verify", sent),
                conversation=self.conv.id,
                request="",
                answer="",
                stop=stop,
                publish_perf=self.publish_perf,
                prompt=prompt,
                message=message,
            )
            return None if outcome.stopped else outcome.verdict

        outcome = await check_all(
            self.conv.code,
            workspace=workspace,
            project=self.workspace_project,
            judge=judge,
            answer=answer,
            stop=stop,
            timeout_s=self.settings.code_check_timeout_s,
        )
        await self.criteria_changed()
        return not outcome.stopped

    async def tools_ready(self) -> None:
        """Before a turn: the MCP configuration read again (:meth:`McpManager.refresh`), and
        the user told once when the MCP tools this conversation is offered changed since its
        last turn (display event ``tools_changed``: ``added``, ``removed``, ``changed``
        names; a prompt change, the perf service names it ``tools``). Never fails the turn."""
        mcp = self.shared.mcp
        if mcp is None:
            return
        try:
            await mcp.refresh()
            now = mcp.signature(self.conv.project, self.shared.toolbox)
        except Exception:
            log.warning("conversation %s: MCP tools not refreshed", self.conv.id, exc_info=True)
            return
        before, self.mcp_seen = self.mcp_seen, now
        if before is None or before == now:
            return
        await self.emit(
            {},
            loki={
                "event": "tools_changed",
                "added": sorted(now.keys() - before.keys()),
                "removed": sorted(before.keys() - now.keys()),
                "changed": sorted(n for n in now.keys() & before.keys() if now[n] != before[n]),
            },
        )

    @property
    def busy(self) -> bool:
        return self.worker is not None and not self.worker.done()

    # -- TurnHost -------------------------------------------------------------------------
    async def emit(self, delta: dict[str, Any] | None = None, **fields: Any) -> ChatEvent:
        """Append a display event to the Log and publish it (in seq order). Seqs are
        reserved in Redis ahead of publication (blocks of :data:`SEQ_BLOCK`)."""
        async with self._emit_lock:
            if self.conv.seq + 1 > self.reserved and not self.lost:
                block = self.conv.seq + SEQ_BLOCK
                try:
                    # raises while Redis is away: nothing is published before the reservation
                    await self.shared.store.reserve_seq(self.conv.id, self.lock_value, block)
                    self.reserved = block
                except FencedWrite:
                    self.lost = True
                    self.stop.set()
            event = self.conv.new_event(delta, **fields)
            if fields.get("finish_reason"):
                self.turn_ends += 1
            await self._publish(event)
            return event

    async def _publish(self, event: ChatEvent) -> None:
        try:
            await self.shared.bus.publish(event, subjects.chat_events(event.conversation))
        except Exception:  # noqa: BLE001 - the Log keeps it; replay will deliver it
            log.warning("event %s of %s not published", event.seq, event.conversation)

    async def persist(self) -> None:
        """Write the conversation's blob (fenced: a lost lock stops the actor)."""
        if self.lost:
            return
        async with self._persist_lock:
            self.conv.updated = time.time()
            try:
                await self.shared.store.save(self.conv, self.lock_value)
            except FencedWrite:
                log.error("conversation %s: lock lost, stopping", self.conv.id)
                self.lost = True
                self.stop.set()

    def lease(
        self, kind: RequestKind = "main", fingerprints: list[str] | None = None
    ) -> EngineLease:
        """A lease of ``kind`` (``main``: the turn's next step, ``task`` instead for a
        scheduled task's run, queued at most ``LOKI_TASK_WAIT_S``; ``verify``: the verifier)
        for this conversation, to hold with ``async with`` (see
        :class:`~loki_chat.leases.EngineLeases`); waiting for it ends when the turn is
        stopped. ``fingerprints``: of the messages the request will send."""
        if kind == "main" and self.conv.kind == "task":
            return self.shared.leases.lease(
                self.conv.id,
                "task",
                stop=self.stop,
                wait_s=self.settings.task_wait_s,
                fingerprints=fingerprints,
            )
        return self.shared.leases.lease(
            self.conv.id, kind=kind, stop=self.stop, fingerprints=fingerprints
        )

    def publish_perf(self, record: PerfRecord) -> None:
        self.shared.bus.publish_perf(record)

    async def keep_images(self, images: list[ImageAttachment]) -> None:
        """Keep the images a user message brought, for ``see_image`` (never fails the turn:
        an image not kept is only one ``see_image`` cannot find)."""
        if self.shared.shelf is None or not images:
            return
        try:
            await self.shared.shelf.put(self.conv.id, images)
        except Exception:  # noqa: BLE001 - see_image will say it is not attached
            log.warning("conversation %s: images not kept for see_image", self.conv.id)

    async def shelf_images(self) -> dict[str, ImageAttachment]:
        """The conversation's images on its shelf, by attachment id (KEEP_TURN_IMAGES re-reads
        a kept image there before each request); none when the shelf cannot be read."""
        if self.shared.shelf is None:
            return {}
        try:
            return {i.id: i for i in await self.shared.shelf.all(self.conv.id)}
        except Exception:  # noqa: BLE001 - unreadable: the kept images become markers
            log.warning("conversation %s: image shelf unreadable", self.conv.id)
            return {}

    def tools_withheld(self, unavailable: dict[str, Any] | None) -> None:
        """Record what the last step could not offer (None: the tools were offered)."""
        self.tools_unavailable = unavailable

    def prewarm(
        self,
        job: PrewarmJob,
        wait_s: float = PREWARM_WAIT_S,
        check: Callable[[Lease], Awaitable[str | None]] | None = None,
    ) -> asyncio.Task[str]:
        """Start PREWARM's request for this conversation (:mod:`loki_chat.prewarm`; ``wait_s``
        and ``check`` as :func:`~loki_chat.prewarm.run_prewarm` takes them); one at a time:
        a running one is cancelled first. Returns its task (its result: the outcome)."""
        previous = self._prewarm
        if previous is not None and not previous.done():
            previous.cancel()
        shared = self.shared
        self._prewarm = asyncio.create_task(
            run_prewarm(
                job,
                settings=self.settings,
                leases=shared.leases,
                engine=shared.engine,
                publish=shared.bus.publish_perf,
                wait_s=wait_s,
                check=check,
            ),
            name=f"prewarm-{self.conv.id}",
        )
        return self._prewarm

    def ran(self, runner: TurnRunner) -> None:
        """After a turn of this conversation: when it sent a ``main`` request to a local
        engine (not a task's run, not an external preset), remember it as the instance's
        slot owner (:attr:`Shared.slot_owner`), with the system message, project block,
        tools and reasoning echo its next request would send. Keeps the turn's last lease
        (:attr:`last_lease`)."""
        self.last_lease = runner.last_lease
        if self.conv.kind == "task" or runner.kind != "main" or runner.external:
            return
        if not runner.sent_wire:
            return  # nothing reached the engine (no lease, or stopped before)
        self.shared.slot_owner = PrewarmJob(
            self.conv.id,
            [],
            runner.offered_tools(),
            runner.echo_reasoning(),
            system=runner.sent_system,
            head=runner.sent_head,
            lease=runner.last_lease,
        )

    async def stop_prewarm(self) -> None:
        """Cancel a running prewarm and wait until its request and lease are gone (a real
        request of this conversation pre-empts it)."""
        task, self._prewarm = self._prewarm, None
        if task is not None and not task.done():
            task.cancel()
            # the prewarm is cancelled: however it ends is no news to the request it yields to
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def total_slots(self) -> int | None:
        """The engine's slot count (``loki.engine.info``), None when unknown."""
        try:
            info = await self.shared.bus.request(
                subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2.0
            )
        except Exception:  # noqa: BLE001 - unknown: the caller does not replay
            return None
        return info.total_slots or None

    # -- queue ----------------------------------------------------------------------------
    async def recover(self) -> None:
        """After taking the conversation over: close a turn a dead owner left open, then run
        what was queued."""
        if self.conv.turn_open:
            self.conv.turn_open = False
            while (
                self.conv.messages
                and self.conv.messages[-1].loki
                and self.conv.messages[-1].loki.injected in REMINDER_KINDS
            ):
                self.conv.messages.pop()
            await self.emit(
                {},
                finish_reason="error",
                loki={
                    "event": "turn_end",
                    "error": "interrupted: the chat service serving this turn stopped",
                    "interrupted": True,
                },
            )
            await self.persist()
        if self.conv.pending:
            self._ensure_worker()

    async def enqueue(self, text: str, images: list[ImageAttachment] | None = None) -> bool:
        """Queue a user message (and the images sent with it); return True when it waits
        behind a running turn."""
        busy = self.busy
        self.conv.pending.append(pending_item(text, images or []))
        await self.persist()
        self._ensure_worker()
        return busy

    async def unqueue(self, text: str) -> bool:
        """Drop a queued user message whose text is ``text`` (the latest such one: the same
        text queued twice is the same message twice); False when none waits, because its
        turn already started (it left the queue) or it was never queued. A started message
        is never cancelled: the turn loop takes it off the queue before its first await."""
        for i in range(len(self.conv.pending) - 1, -1, -1):
            if unpack(self.conv.pending[i])[0] == text:
                del self.conv.pending[i]
                await self.persist()
                return True
        return False

    def can_continue(self) -> bool:
        """Whether the last message is an assistant reply (text, no tool call) to resume."""
        last = self.conv.messages[-1] if self.conv.messages else None
        return bool(
            last is not None
            and last.role == "assistant"
            and isinstance(last.content, str)
            and last.content
            and not last.tool_calls
        )

    def resume(self) -> None:
        """Continue the last assistant reply in a turn of its own (Continue, after a reply
        cut at ``max_tokens``); what was queued meanwhile runs after it. The caller checked
        :meth:`can_continue` and that no turn runs."""

        async def run() -> None:
            self.stop.clear()
            await self.stop_prewarm()
            ends = self.turn_ends
            try:
                async with self.person_turn():
                    await self.tools_ready()
                    runner = TurnRunner(self, None, resume=True, last_lease=self.last_lease)
                    await runner.run()
                    self.ran(runner)
            except Exception as exc:  # a continuation that fails ends itself, never the actor
                log.exception("continue failed in %s", self.conv.id)
                await self._failed(exc, ends)
            await self._work()

        self.worker = asyncio.create_task(run(), name=f"continue-{self.conv.id}")

    @contextlib.asynccontextmanager
    async def person_turn(self) -> AsyncIterator[None]:
        """Mark a person's turn as running (in Redis, seen by every instance's task runs,
        which wait for it to end: a task never takes the person's slot mid-turn); a task's
        own turn is not marked. A Redis failure here never stops the turn."""
        tasks = self.shared.tasks
        if tasks is None or self.conv.kind == "task":
            yield
            return
        with contextlib.suppress(Exception):  # Redis away: the turn goes on unmarked
            await tasks.mark_active(self.conv.id)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # Redis away: the mark expires by itself
                await tasks.unmark_active(self.conv.id)

    def _ensure_worker(self) -> None:
        if not self.busy:
            self.worker = asyncio.create_task(self._work(), name=f"turns-{self.conv.id}")

    async def _work(self) -> None:
        while self.conv.pending and not self.lost and not self.shared.closing:
            self.stop.clear()
            await self.stop_prewarm()
            text = self.conv.pending[0]
            ends = self.turn_ends
            # the turns before this one are over: their deltas merge (written by its first
            # persist), so the stored log grows by a few events a turn, not one per token
            self.conv.compact_log()
            try:
                async with self.person_turn():
                    await self.tools_ready()
                    runner = TurnRunner(self, text, last_lease=self.last_lease)
                    await runner.run()
                    self.ran(runner)
            except Exception as exc:  # a turn that fails ends itself, never the actor's queue
                log.exception("turn failed in %s", self.conv.id)
                if self.conv.pending and self.conv.pending[0] == text:
                    self.conv.pending.pop(0)
                await self._failed(exc, ends)
            self.last_access = time.monotonic()

    async def _failed(self, exc: Exception, ends: int) -> None:
        """End a turn that raised (Redis away at a persist, a bug): its clients get an error
        end event unless it emitted its own end already (``turn_ends`` past ``ends``), then
        the conversation is written. Both are tried again, :data:`FAILED_END_TRIES` times a
        second apart, while they raise (Redis coming back); past that, the next owner's
        recovery ends the turn (``turn_open`` stays set in the stored blob)."""
        self.conv.turn_open = False
        reason = f"turn failed: {type(exc).__name__}: {exc}"[:300]
        for attempt in range(FAILED_END_TRIES):
            try:
                if self.turn_ends == ends and not self.lost:
                    await self.emit(
                        {},
                        finish_reason="error",
                        loki={"event": "turn_end", "error": reason},
                    )
                await self.persist()
                return
            except Exception:  # Redis away: try again in a second
                log.warning(
                    "could not end the failed turn of %s (try %d)",
                    self.conv.id,
                    attempt + 1,
                    exc_info=attempt == FAILED_END_TRIES - 1,
                )
                await asyncio.sleep(1)

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` seconds) for the worker to finish on its own, without
        stopping it: after a turn's end event the worker still writes the conversation's
        last state before it is done."""
        worker = self.worker
        if worker is not None and not worker.done():
            # waiting only: the worker's own failure is logged by the worker
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(worker), timeout)

    async def halt(self, timeout: float = 10.0) -> None:
        """Stop the running turn and wait for the worker (queued messages stay queued)."""
        await self.stop_prewarm()
        worker = self.worker
        if worker is not None and not worker.done():
            self.stop.set()
            # waiting only: the worker's own failure is logged by the worker
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(worker), timeout)
