"""What a turn asks of the project: the head of the first user message, the update to store.

:class:`ProjectHead` is the one place the turn loop meets projects (see :mod:`.snapshot` for
PROJ_SNAPSHOT's rules):

- key off (``LOKI_PROJ_SNAPSHOT`` unset): :meth:`begin_turn` fetches the project's block once
  per turn and :meth:`head` renders it (rebuilt each turn); no system line, nothing stored;
  a snapshot left by the key is cleaned away (update blocks removed, snapshot dropped);
- key on: :meth:`begin_turn` also stores an update block before the user's message when the
  project changed since the state announced (or retakes past the threshold); :meth:`head`
  retakes when the request's prompt, model or the service's start changed and returns the
  snapshot's text byte for byte; :meth:`after_compaction` retakes at once from the live block.
- Code mode (issue 43): the workspace's ``AGENTS.md`` joins the block (:meth:`_live_of`),
  and with the key on its change is a full-text update like the instructions file's.
- The memory service unreachable: no block with the key off; with it on, the snapshot is
  sent as it is and no update is stored (the next turn catches up). A new conversation waits
  at most ``active_wait_s`` for the active project, then belongs to the default project (no
  project stored). The first failure is logged as a warning, the next ones at debug level
  until the service answers again (logged once more); while it does not answer, each block
  fetch is bounded by ``active_wait_s`` too, so chat never waits on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from loki_shared.messages.chat import ChatMessage, LokiMeta
from loki_shared.messages.recall import DEFAULT_PROJECT

from .block import BlockView, render
from .snapshot import (
    UPDATE_KIND,
    ProjSnap,
    is_update,
    prompt_fingerprint,
    retake_reason,
    strip_updates,
)
from .update import diff

log = logging.getLogger("loki.chat.project")
T = TypeVar("T")

#: The fixed line added to the system prompt with the key on (never with it off).
SNAPSHOT_SYSTEM_LINE = (
    "The project context at the head of the conversation is a dated copy; "
    '<context_update from="loki"> blocks later in the conversation say what changed since.'
)

#: ``fetch(project) -> BlockView | None`` (None: no such project or service unreachable).
BlockFetch = Callable[[str], Awaitable[BlockView | None]]
#: ``agents(project) -> text | None``: the ``AGENTS.md`` of the project's workspace (None:
#: none, or the workspace service did not answer).
AgentsFetch = Callable[[str], Awaitable[str | None]]


def utc_stamp() -> str:
    """The date written in "as of <date>" headers: ``YYYY-MM-DD HH:MM UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


@dataclass
class ProjectHead:
    """Per chat instance. A conversation here has ``id``, ``project`` (str), ``proj_snap``
    (:class:`ProjSnap` or None) and ``messages``. ``fetch`` gets a project's block;
    ``enabled`` is the key; ``boot`` this process's start token; ``clock`` the headers' date.
    """

    fetch: BlockFetch | None
    enabled: bool = False
    max_updates: int = 8
    boot: str = ""
    clock: Callable[[], str] = utc_stamp
    #: the active project's id (a new conversation belongs to it); None: the default one
    active: Callable[[], Awaitable[str]] | None = None
    #: seconds a new conversation waits for the active project (and a block fetch while the
    #: memory service does not answer)
    active_wait_s: float = 0.5
    #: the memory service did not answer the last request (its warning was logged)
    unreachable: bool = False
    #: the workspace's ``AGENTS.md`` of a conversation in code mode (None: never)
    agents: AgentsFetch | None = None
    _live: dict[str, BlockView | None] = field(default_factory=dict)

    def _failed(self, what: str, exc: BaseException) -> None:
        if self.unreachable:
            log.debug("%s unavailable: %r", what, exc)
            return
        self.unreachable = True
        log.warning(
            "%s unavailable (%r): no project block, new conversations in the default "
            "project until the memory service answers (logged once)",
            what,
            exc,
        )

    def _answered(self) -> None:
        if self.unreachable:
            self.unreachable = False
            log.info("the memory service answers again")

    async def _ask(self, call: Awaitable[T], bound: float | None) -> T:
        if bound is None:
            return await call
        return await asyncio.wait_for(call, bound)

    async def _fetch(self, project: str) -> BlockView | None:
        if self.fetch is None:
            return None
        bound = self.active_wait_s if self.unreachable else None
        try:
            view = await self._ask(self.fetch(project), bound)
        except Exception as exc:  # noqa: BLE001 - unreachable: the turn goes on without it
            self._failed(f"project block of {project}", exc)
            return None
        self._answered()
        return view

    async def _live_of(self, conv: Any) -> BlockView | None:
        """The project's block now for ``conv``: the memory service's, with, in code mode,
        the ``AGENTS.md`` of the conversation's workspace (:attr:`agents`). With no memory
        service at all, that file alone makes a block; with one that does not answer, no
        block (the memory service's rule)."""
        live = await self._fetch(conv.project)
        code = getattr(conv, "code", None)
        if self.agents is None or code is None or code.mode != "code":
            return live
        try:
            text = await self.agents(code.project or conv.project)
        except Exception:
            log.debug("AGENTS.md of %s not read", conv.id, exc_info=True)
            text = None
        if not text or not text.strip():
            return live
        if live is None:
            if self.fetch is not None:
                return None
            live = BlockView(project=conv.project, name=conv.project)
        return replace(live, workspace_agents=text)

    async def project_for_new(self) -> str:
        """The project of a conversation created now: the active one; the default project
        when there is no memory service or it does not answer within ``active_wait_s``."""
        if self.active is None:
            return DEFAULT_PROJECT
        try:
            project = await self._ask(self.active(), self.active_wait_s)
        except Exception as exc:  # noqa: BLE001 - no memory service: the default project
            self._failed("active project", exc)
            return DEFAULT_PROJECT
        self._answered()
        return project

    def system_prompt(self, base: str) -> str:
        """The system message: ``base``, plus the fixed snapshot line with the key on."""
        return f"{base}\n\n{SNAPSHOT_SYSTEM_LINE}" if self.enabled else base

    async def begin_turn(self, conv: Any) -> bool:
        """Once per turn, after the turn-start compaction. Returns whether the history
        changed (an update stored, a retake or a cleaning): the caller persists."""
        live = await self._live_of(conv)
        self._live[conv.id] = live
        if not self.enabled:
            if conv.proj_snap is not None or any(is_update(m) for m in conv.messages):
                strip_updates(conv.messages)  # key removed: cleaning
                conv.proj_snap = None
                conv.meter.invalidate()
                return True
            return False
        snap: ProjSnap | None = conv.proj_snap
        if snap is None or live is None:
            return False  # taken at the first request (head), or unreachable
        if live.project != snap.project or live.name != snap.name:
            return False  # retaken by head()
        as_of = self.clock()
        block = diff(snap.announced, live, as_of)
        if block is None:
            return False
        updates = sum(1 for m in conv.messages if is_update(m))
        if updates + 1 > self.max_updates:
            self.retake(conv, live, snap.prompt, snap.model)
            return True
        last = conv.messages[-1] if conv.messages else None
        if last is None or last.role != "user" or last.loki:
            return False  # a Continue: no user message to lead; the next turn brings it
        at = len(conv.messages) - 1  # at the head of this turn's user message
        update = ChatMessage(role="user", content=block, loki=LokiMeta(injected=UPDATE_KIND))
        conv.messages.insert(at, update)
        snap.announced = live
        return True

    def head(
        self, conv: Any, system_prompt: str, tools: list[dict[str, Any]] | None, model: str
    ) -> str | None:
        """The text joined at the head of the first user message of this request (None:
        none). Key on: retakes first when :func:`~.snapshot.retake_reason` says so."""
        live = self._live.get(conv.id)
        if not self.enabled:
            text = render(live) if live is not None else ""
            return text or None
        prompt = prompt_fingerprint(system_prompt, tools)
        updates = sum(1 for m in conv.messages if is_update(m))
        reason = retake_reason(
            conv.proj_snap,
            live=live,
            prompt=prompt,
            model=model,
            boot=self.boot,
            updates=updates,
            max_updates=self.max_updates,
        )
        if reason is not None and live is not None:
            log.info("project snapshot of %s retaken (%s)", conv.id, reason)
            self.retake(conv, live, prompt, model)
        snap: ProjSnap | None = conv.proj_snap
        if snap is None:
            return None
        if not snap.prompt:  # taken by a compaction or the threshold: this request's
            snap.prompt, snap.model = prompt, model
        return snap.text or None

    def peek(self, conv: Any) -> str | None:
        """What :meth:`head` would return for ``conv`` when no retake is due, without any
        side effect (issue 44: a lease request names the fingerprints of the messages it
        will send before the request is built)."""
        if not self.enabled:
            live = self._live.get(conv.id)
            text = render(live) if live is not None else ""
            return text or None
        snap: ProjSnap | None = conv.proj_snap
        return (snap.text or None) if snap is not None else None

    def retake(self, conv: Any, live: BlockView, prompt: str = "", model: str = "") -> None:
        """A fresh dated copy from ``live``; every update block leaves the history (the
        context meter's measure no longer matches it: estimates until the next step)."""
        strip_updates(conv.messages)
        conv.meter.invalidate()
        as_of = self.clock()
        conv.proj_snap = ProjSnap(
            as_of=as_of,
            text=render(live, as_of=as_of),
            announced=live,
            project=live.project,
            name=live.name,
            prompt=prompt,
            model=model,
            boot=self.boot,
        )

    async def after_compaction(self, conv: Any) -> None:
        """A compaction (any trigger) changed the prompt anyway: with the key on, the live
        block becomes the snapshot at once (no recomputation more)."""
        if not self.enabled:
            return
        live = await self._live_of(conv)
        self._live[conv.id] = live
        snap: ProjSnap | None = conv.proj_snap
        if live is None:
            return  # unreachable: the snapshot and its updates stay as they are
        self.retake(conv, live, snap.prompt if snap else "", snap.model if snap else "")

    def reset(self, conv: Any) -> None:
        """Reset or load: the snapshot goes, update blocks too."""
        strip_updates(conv.messages)
        conv.proj_snap = None

    def end_turn(self, conv: Any) -> None:
        """Forget the live block fetched for this turn."""
        self._live.pop(conv.id, None)
