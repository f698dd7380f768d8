"""PREWARM after an engine restart (``LOKI_PREWARM``; issue 21 §2): a restarted llama-server
starts with empty slots, so the first turn after it computes the whole prompt while the
user waits. When the engine comes back, the conversation that last owned slot 0 gets the
same prewarm request as after a compaction (:mod:`loki_chat.prewarm`).

How the chat service learns of it: the supervisor's ``loki.engine.state`` events (every
instance subscribes; no queue group). A ``ready`` event of a local engine (not an external
preset) is a (re)start: a crash relaunched, ``kill -9`` of llama-server, a preset applied.

Rules:

- which conversation: the one of this instance's last turn that sent a ``main`` request to a
  local engine (:meth:`loki_chat.actor.Actor.ran`; not a task's run, not a sub-agent): with
  one slot, or SIDE_SLOT, that is the conversation slot 0 held (side jobs go to slot 1 or
  are erased after). Nothing when this instance ran no such turn since it started;
- it must still be this instance's (taken again when its lock is free: an idle
  conversation released by the lock keeper is loaded back), not deleted, and no turn of it
  running or queued (its own request fills the slot); a turn that has ended but whose
  worker is still writing its last state is waited for (at most :data:`SETTLE_S`), so a
  restart right after a turn's end still prewarms;
- the request is the prewarm's: the conversation's model view as the next request sends it
  (less the user message to come), the tools, system message, project block and reasoning
  echo of its last turn, ``max_tokens: 1``, a ``prewarm`` lease (pre-empted by any real
  request), record kind ``prewarm``; never on an external preset;
- SLOT_PERSIST first: the supervisor publishes ``ready`` and restores slot 0 before it
  grants any lease, so once the prewarm's lease is granted ``loki.engine.info``
  ``slot_persist`` tells: a restore without ``error`` means the slot holds a conversation
  again (the supervisor's owner), and nothing is sent (outcome ``restored``); SLOT_PERSIST
  off (None), or a failed or impossible restore (``error``), and the prewarm is sent. The
  lease waits up to :data:`RESTART_WAIT_S` (a restore pauses the leases);
- a turn step of this instance asked since the event (``main`` leases counted by
  :class:`~loki_chat.leases.EngineLeases`) has the slot by then: nothing is sent (outcome
  ``taken``);
- one per event; with ``LOKI_PREWARM`` off nothing of this runs.

With several chat instances each prewarms its own last conversation; prewarms never pre-empt
one another, so the slot ends holding the one granted last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from loki_shared import subjects
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, EngineState, Lease

from .errors import ChatError

if TYPE_CHECKING:
    from .actor import Actor, Shared

log = logging.getLogger("loki.chat.prewarm")

#: Seconds the restart prewarm's lease may wait (a SLOT_PERSIST restore pauses the leases
#: while it reads the slot file; past it, no prewarm).
RESTART_WAIT_S = 15.0
#: Longest wait (s) for the owner's worker to finish a turn that has ended (its end event
#: published, its last state being written) before the prewarm is decided.
SETTLE_S = 5.0
#: Bound of the ``loki.engine.info`` request that reads the restore's outcome (s).
INFO_TIMEOUT_S = 2.0


class RestartPrewarm:
    """Turns the engine's ``ready`` events into the prewarm of the slot owner's prefix.

    Args:
        shared: the instance's shared parts (settings, leases, bus, ``slot_owner``).
        take: the owner lookup (:meth:`loki_chat.ownership.Ownership.take`): the local actor
            of a conversation, its lock taken when free; None when another instance holds
            it; raises :class:`~loki_chat.errors.ConversationNotFound` when it is gone.
    """

    def __init__(
        self, shared: Shared, take: Callable[[str, bool], Awaitable[Actor | None]]
    ) -> None:
        self.shared = shared
        self.take = take
        #: the last decision (``sent``, or why not), for the log and the tests
        self.last: str | None = None
        #: the prewarm started for the last event (its result: the outcome)
        self.task: asyncio.Task[str] | None = None

    async def on_state(self, event: EngineState) -> str | None:
        """Handle one ``loki.engine.state`` event. Returns None for an event that is not a
        local engine's ``ready`` (or with ``LOKI_PREWARM`` off), else the decision:
        ``sent`` (the prewarm task started: its outcome is ``task``'s result), or
        ``no_owner``, ``gone``, ``elsewhere``, ``busy``. Never raises.

        A pooled engine's event (``event.engine`` set, issue 44) is not one either: the slot
        owner is a one-engine notion, and the pool routes a conversation's next turn to the
        slot that holds its prefix (or restores its slot file) by itself."""
        if (
            not self.shared.settings.prewarm
            or event.state != "ready"
            or event.external
            or event.engine
        ):
            return None
        self.last = decision = await self._start()
        log.info("[prewarm] engine ready: %s", decision)
        return decision

    async def _start(self) -> str:
        owner = self.shared.slot_owner
        if owner is None:
            return "no_owner"
        try:
            actor = await self.take(owner.cid, False)
        except ChatError:
            return "gone"  # deleted since its turn
        except Exception:  # Redis away: the next turn fills the slot
            log.warning("[prewarm] %s: owner not readable", owner.cid, exc_info=True)
            return "gone"
        if actor is None or actor.lost:
            return "elsewhere"
        if actor.busy and not actor.conv.pending and not actor.conv.turn_open:
            # the worker is past the turn's end (writing its last state): wait for it
            await actor.settle(SETTLE_S)
        if actor.busy or actor.conv.pending or actor.conv.turn_open:
            return "busy"
        mark = self.shared.leases.main_asked
        job = replace(owner, messages=list(actor.conv.messages))
        self.task = actor.prewarm(job, wait_s=RESTART_WAIT_S, check=self._check(mark))
        return "sent"

    def _check(self, mark: int) -> Callable[[Lease], Awaitable[str | None]]:
        async def check(_lease: Lease) -> str | None:
            if self.shared.leases.main_asked != mark:
                return "taken"
            return await self.restored()

        return check

    async def restored(self) -> str | None:
        """``restored`` when the supervisor's last SLOT_PERSIST action is a restore without
        error (``loki.engine.info`` ``slot_persist``), else None (off, failed, unknown)."""
        try:
            info = await self.shared.bus.request(
                subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, INFO_TIMEOUT_S
            )
        except Exception:  # noqa: BLE001 - unknown: prewarm (at worst one cheap prefill)
            return None
        persist = info.slot_persist or {}
        if persist.get("action") == "restore" and not persist.get("error"):
            return "restored"
        return None
