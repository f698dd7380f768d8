"""Which supervisor instance grants leases when several run (``LOKI_SUPERVISOR_REPLICATED``).

One leader at a time, elected in Redis:

- ``loki:engine:leader`` (:data:`LEADER_KEY`) holds ``"<epoch>:<instance>"`` with a TTL of
  ``LOKI_SUPERVISOR_LEADER_TTL_S`` (``PX``); it is taken only when absent (one Lua step that
  also draws the epoch with ``INCR loki:engine:leader:epoch``, :data:`EPOCH_KEY`). The epoch is
  the fencing token: every write of the leader's state (:mod:`.lease_mirror`) checks in the same
  Lua step that the key still holds this exact value, so an old leader's late write is refused.
- The leader renews the key every third of its TTL (compare-and-``PEXPIRE``). A renewal refused
  (the key holds another value: it expired and another instance took it) steps down at once; a
  renewal that fails (Redis away, a timeout) is retried, but the leader stops leading when its
  last successful renewal is older than :data:`SAFETY` × TTL, measured from when that renewal
  was *sent*: before the key can expire in Redis, so two instances never lead at once.
- Every other instance tries to take the key every third of the TTL: a killed leader is
  replaced within about 4/3 × TTL. A leader that stepped down while the key still names it
  takes the same term back (same epoch: nobody else led meanwhile).

Callbacks: ``on_gain(epoch)`` (awaited before :attr:`Leadership.granting` turns true: the new
leader loads the mirrored leases) and ``on_loss()`` (stop granting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("loki_supervisor.leadership")

LEADER_KEY = "loki:engine:leader"
EPOCH_KEY = "loki:engine:leader:epoch"
#: A leader leads for at most this fraction of the TTL after its last successful renewal was
#: sent (the key itself lives the whole TTL from when Redis ran that renewal).
SAFETY = 0.8

# KEYS[1] leader key, KEYS[2] epoch key; ARGV[1] instance, ARGV[2] ttl ms.
# Returns the key's value: ours when taken now, or when it still names this instance (a term
# it stepped down from after a failed renewal: taken back, its TTL renewed in the same step).
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local mine = ':' .. ARGV[1]
  if string.sub(cur, -string.len(mine)) == mine then
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  end
  return cur
end
local epoch = redis.call('INCR', KEYS[2])
local value = epoch .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', tonumber(ARGV[2]))
return value
"""
# KEYS[1] leader key; ARGV[1] our value, ARGV[2] ttl ms. 1: renewed, 0: not ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0
"""
# KEYS[1] leader key; ARGV[1] our value. Deletes it only while it is ours.
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def stop_task(task: asyncio.Task[None], every_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every ``every_s`` s.

    Python 3.11's ``asyncio.wait_for`` can swallow a cancellation that arrives just as the
    awaited call completes (fixed in 3.12): a loop cancelled at that instant would go on, and
    a plain ``await task`` after one ``cancel()`` would wait for ever (seen as a stop that
    hung under load)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


@dataclass(frozen=True)
class Term:
    """One leader's term: the ``instance`` that leads and its ``epoch`` (the fencing token,
    strictly increasing across terms)."""

    epoch: int
    instance: str

    @property
    def value(self) -> str:
        """The leader key's value for this term (``"<epoch>:<instance>"``)."""
        return f"{self.epoch}:{self.instance}"

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Term | None:
        """The term a leader key's value names; None for no value or a malformed one."""
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        epoch, sep, instance = text.partition(":")
        if not sep or not epoch.isdigit() or not instance:
            return None
        return cls(int(epoch), instance)


class Leadership:
    """This instance's part in the election (see the module docstring).

    Args:
        redis: the service's asyncio Redis client (ACL keys ``loki:engine:*``).
        instance: this instance's id (a NATS subject token).
        ttl_s: the leader key's lifetime without renewal (s).
        on_gain: awaited with the new epoch when this instance becomes the leader, before it
            grants (bounded by a third of the TTL; what it raises is logged, and leading
            goes on).
        on_loss: awaited when this instance stops leading.

    Attributes:
        leader: the last term read from Redis (None: no leader known).
        epoch_seen: the highest epoch seen (0: none yet); never goes back.
    """

    def __init__(
        self,
        redis: Any,
        instance: str,
        ttl_s: float = 3.0,
        on_gain: Callable[[int], Awaitable[None]] | None = None,
        on_loss: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.redis = redis
        self.instance = instance
        self.ttl_s = ttl_s
        self.on_gain = on_gain
        self.on_loss = on_loss
        self.leader: Term | None = None
        self.epoch_seen = 0
        self._mine: Term | None = None
        self._valid_until = 0.0  # monotonic: leading is safe until then
        self._ready = False
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._resign = redis.register_script(_RESIGN)

    # ------------------------------------------------------------------ state
    @property
    def term(self) -> Term | None:
        """This instance's term while it leads (its key renewed recently enough), else None."""
        if self._mine is not None and time.monotonic() < self._valid_until:
            return self._mine
        return None

    @property
    def is_leader(self) -> bool:
        """This instance holds a valid term (its writes are fenced by it)."""
        return self.term is not None

    @property
    def granting(self) -> bool:
        """This instance leads and its ``on_gain`` is done: it grants leases."""
        return self._ready and self.is_leader

    def other_leader(self) -> Term | None:
        """The leader to forward to: the known term when it is another instance's."""
        leader = self.leader
        return leader if leader is not None and leader.instance != self.instance else None

    async def wait_change(self, timeout: float) -> None:
        """Return after the next change of the known leader, or after ``timeout`` s."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the election loop (from a running event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="supervisor-leadership")

    async def close(self) -> None:
        """Stop the loop; a leader deletes its key (a planned stop: another instance takes
        over at its next try instead of after the TTL)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        mine = self.term
        if mine is not None:
            await self._step_down("stopping")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._resign(keys=[LEADER_KEY], args=[mine.value]), self.ttl_s / 3
                )

    async def refresh(self, timeout: float | None = None) -> Term | None:
        """Read the leader key now (bounded by ``timeout`` s, default a third of the TTL);
        the known leader on a failure."""
        try:
            bound = self.ttl_s / 3 if timeout is None else timeout
            raw = await asyncio.wait_for(self.redis.get(LEADER_KEY), bound)
        except Exception as exc:  # noqa: BLE001 - Redis away: keep what is known
            log.debug("leader key not read: %s", type(exc).__name__)
            return self.leader
        self._see(Term.parse(raw))
        return self.leader

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        every = self.ttl_s / 3
        while True:
            try:
                if self._mine is not None:
                    await self._keep()
                else:
                    await self._try_take()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leadership round failed")
            pause = every if self._mine is None else min(every, self._left() / 2 or every)
            await asyncio.sleep(max(0.05, pause))

    def _left(self) -> float:
        return max(0.0, self._valid_until - time.monotonic())

    async def _try_take(self) -> None:
        sent = time.monotonic()
        try:
            raw = await asyncio.wait_for(
                self._acquire(
                    keys=[LEADER_KEY, EPOCH_KEY],
                    args=[self.instance, int(self.ttl_s * 1000)],
                ),
                self.ttl_s / 3,
            )
        except Exception as exc:  # noqa: BLE001 - Redis away: not the leader
            log.debug("leader key not tried: %s", type(exc).__name__)
            return
        term = Term.parse(raw)
        self._see(term)
        if term is None or term.instance != self.instance:
            return
        self._mine = term
        self._valid_until = sent + self.ttl_s * SAFETY
        log.info("this supervisor (%s) leads, epoch %d", self.instance, term.epoch)
        if self.on_gain is not None:
            try:
                await asyncio.wait_for(self.on_gain(term.epoch), self.ttl_s / 3)
            except Exception:
                log.exception("taking over as leader (epoch %d) did not finish", term.epoch)
        if self.term is term:
            self._ready = True
            self._changed.set()

    async def _keep(self) -> None:
        mine = self._mine
        assert mine is not None
        sent = time.monotonic()
        try:
            ok = await asyncio.wait_for(
                self._renew(keys=[LEADER_KEY], args=[mine.value, int(self.ttl_s * 1000)]),
                max(0.05, min(self.ttl_s / 3, self._left())),
            )
        except Exception as exc:  # noqa: BLE001 - Redis away: lead until the safe end
            if self.term is None:
                await self._step_down(f"no renewal within the TTL ({type(exc).__name__})")
            else:
                log.warning("leader key not renewed (%s): retrying", type(exc).__name__)
            return
        if not ok:
            await self._step_down("the leader key is no longer this instance's")
            await self.refresh()
            return
        self._valid_until = sent + self.ttl_s * SAFETY
        self._see(mine)

    async def _step_down(self, why: str) -> None:
        mine, self._mine = self._mine, None
        self._ready = False
        self._valid_until = 0.0
        if mine is None:
            return
        log.warning(
            "this supervisor (%s) stops leading epoch %d: %s", self.instance, mine.epoch, why
        )
        if self.leader == mine:
            self.leader = None
        self._changed.set()
        if self.on_loss is not None:
            try:
                await self.on_loss()
            except Exception:
                log.exception("stepping down did not finish")

    def _see(self, term: Term | None) -> None:
        if term is not None and term.epoch < self.epoch_seen:
            return  # a read older than what is known (epochs only grow)
        if term is None and self.term is not None:
            return  # a read sent before this instance took the key
        if term != self.leader:
            self.leader = term
            self._changed.set()
        if term is not None:
            self.epoch_seen = max(self.epoch_seen, term.epoch)


__all__ = ["EPOCH_KEY", "LEADER_KEY", "SAFETY", "Leadership", "Term"]
