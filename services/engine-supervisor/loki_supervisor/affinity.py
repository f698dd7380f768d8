"""Pure pool routing rules (issue 44): which pooled engine and slot a lease request gets.

The caller (the pool's lease manager) describes every slot of the engines that are up now
(:class:`SlotState`, from the slot book and the held/waiting leases), every such engine's load
(:class:`EngineLoad`) and the request (:class:`Ask`); :func:`choose` answers a
:class:`Choice`: a slot to grant, or to wait (for one named slot, or for any). No I/O, no
clock: table tests in ``tests/engine/test_affinity.py``, one test per clause below.

Terms:

- *free slot*: not busy and nobody already waiting for it (``waiting == 0``, FIFO per slot:
  a later asker never overtakes an earlier one). A busy slot is never chosen.
- *prefix* of a slot: ``common_prefix(ask.fingerprints, slot.fingerprints)``, the leading
  messages of the request the slot already holds (:mod:`loki_shared.fingerprint`).
  ``Choice.prefix`` always reports it for the chosen slot, whatever the policy.
- *countable prefix* (what affinity follows): the prefix of a slot whose last main prompt is
  this conversation's; for any other slot (another conversation's, a side job's, an unnamed
  one) the prefix counts only when the request extends that slot's *whole* prompt
  (``prefix == len(slot.fingerprints)``), e.g. a slot that holds just the shared system
  prompt. An identical system prompt alone never pulls a new conversation onto a slot that
  holds another conversation's longer prompt: that would evict it for one message.
- *content class* of a slot: ``empty`` (no conversation, no side job, no fingerprints),
  ``side`` (last used by a side job, or by a prompt of no conversation), ``main`` (holds a
  conversation's main prompt).
- *least loaded*: the engine with the smallest ``(held + waiting) / slots``, ties by
  ``order`` (its position in ``LOKI_ENGINE_URLS``); an engine with no slots is never chosen.
- *main-like ask*: ``kind`` in :data:`MAIN_KINDS`, or ``compact`` with ``continuation``;
  every other kind is a *side* ask (verify, subagent, task, bench, foreign, plain compact).
- *home slot* of a conversation: among the slots whose last main prompt is this
  conversation's, for a main-like ask the one with the longest prefix (ties: most recently
  used, engine order); for a side ask (whose fingerprints are its own prompt's, not the
  conversation's) the most recently used one: where the main prompt ran last. Its engine is
  the *home engine*.

Policy ``affine`` (the default), main-like ask:

1. *affine*: the slots with the largest countable prefix (> 0) are the affine slots. A free
   one is granted (reason ``affine``; several: the conversation's own first, then most
   recently used, then engine order, then slot id).
2. *affine wait*: none of them free: the first of them in that order is *the* affine slot.
   While fewer than ``queue_max`` requests already wait for it, the asker waits for it
   (reason ``wait``, ``wait_for = (engine, id_slot)``).
3. *overloaded*: ``queue_max`` or more already wait: the best free slot of all engines
   (largest countable prefix, then not holding another conversation's main prompt, then least
   loaded engine, then empty / side / main, then least recently used, engine order, slot id),
   reason ``overloaded``, ``moved_from`` = the affine slot's engine (which may be the chosen
   engine: a move between two slots of one engine).
4. *overloaded, nothing free*: wait for the affine slot anyway.
5. *new*: no countable prefix anywhere: the least loaded engine that has a free slot holding
   nobody's main prompt, on it an empty slot, else a side one, else the least recently used;
   only when every free slot holds a main prompt, the least loaded engine's least recently
   used one (evicting another conversation is the last resort). Reason ``new``.
6. *failover*: ``last_engine`` (the engine that last ran this conversation's main prompt) is
   given and is not among ``engines``, and the grant (rule 1 or 5) lands on a slot that is
   not the conversation's own: reason ``failover``, ``moved_from = last_engine``.
7. *new, nothing free*: wait for any slot (``wait_for`` None).

Policy ``affine``, side ask (it never evicts the conversation's own main prompt while
anything else is free):

8. *apart*: a free slot that holds nobody's main prompt, on an engine other than the home
   engine: the least loaded such engine, on it an empty slot, else the least recently used
   side one. Reason ``apart`` (also when the conversation has no home slot).
9. *side on the home engine*: else such a slot on the home engine: reason ``side``.
10. *evict another*: else a free slot holding another conversation's main prompt (or a stale
    copy of this one), other engines first, the least loaded, its least recently used slot:
    ``apart`` off the home engine, ``side`` on it.
11. *evict own*: else the home slot itself (reason ``side``).
12. *side, nothing free*: wait for any slot.

Comparison policies (the benchmark's ``LOKI_ENGINE_ROUTING``), every kind, prefixes ignored:

13. ``round_robin``: the engine at ``rr_next % len(engines)`` (engines sorted by ``order``;
    one with no free slot is skipped for the next in turn; the caller advances ``rr_next``
    after a grant), on it a free slot: empty first, then least recently used.
14. ``least_busy``: the least loaded engine that has a free slot, on it a free slot: empty
    first, then least recently used.
15. Both wait for any slot when nothing is free, and report ``moved_from`` = the home engine
    when a main-like grant is not on the home slot, so the figures show the moves they cause.

Slots of an engine that is not in ``engines`` are ignored (the engine is gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from loki_shared.fingerprint import common_prefix

Policy = Literal["affine", "round_robin", "least_busy"]
#: Kinds that run a conversation's main prompt (plus ``compact`` with ``continuation``).
MAIN_KINDS = frozenset({"main", "prewarm"})

_EMPTY, _SIDE, _MAIN = 0, 1, 2


@dataclass(frozen=True)
class SlotState:
    """One pooled slot as the router sees it now.

    ``engine``: the engine's id; ``id_slot``: llama.cpp's slot id; ``busy``: a lease holds
    it; ``waiting``: requests already queued for this very slot, ahead of the asker;
    ``conversation``: whose main prompt it last ran (None: empty, or a side job's);
    ``fingerprints``: that prompt's cumulative fingerprints; ``last_used``: monotonic time
    (s) of its last grant, 0 for never; ``side``: its last request was a side job.
    """

    engine: str
    id_slot: int
    busy: bool
    waiting: int
    conversation: str | None
    fingerprints: tuple[str, ...]
    last_used: float
    side: bool = False

    @property
    def free(self) -> bool:
        """Not held, and no earlier asker waits for it."""
        return not self.busy and self.waiting == 0

    @property
    def content(self) -> int:
        """0 empty, 1 side (a side job's, or a prompt of no conversation), 2 a main prompt."""
        if self.conversation is not None and not self.side:
            return _MAIN
        if self.side or self.fingerprints:
            return _SIDE
        return _EMPTY


@dataclass(frozen=True)
class EngineLoad:
    """One pooled engine's load: ``order``: its position in ``LOKI_ENGINE_URLS`` (breaks
    ties); ``held``: leases it holds; ``waiting``: requests queued for its slots;
    ``slots``: its slot count (``/props`` ``total_slots``)."""

    engine: str
    order: int
    held: int
    waiting: int
    slots: int

    @property
    def load(self) -> float:
        """``(held + waiting) / slots``; infinite without slots."""
        if self.slots <= 0:
            return float("inf")
        return (self.held + self.waiting) / self.slots


@dataclass(frozen=True)
class Ask:
    """A lease request as routing sees it: ``kind`` (``main``, ``verify``, ...),
    ``conversation`` (None: none named), ``fingerprints``: the prompt's cumulative
    fingerprints (``LeaseRequest.prompt_fingerprints``), ``continuation``: a ``compact``
    that continues the cached prompt (main-like)."""

    kind: str
    conversation: str | None
    fingerprints: tuple[str, ...]
    continuation: bool = False

    @property
    def main_like(self) -> bool:
        """Runs the conversation's main prompt: kind in MAIN_KINDS, or a continuation compact."""
        return self.kind in MAIN_KINDS or (self.kind == "compact" and self.continuation)


@dataclass(frozen=True)
class Choice:
    """The routing answer. ``engine``/``id_slot``: the slot to grant (both None: wait, nothing
    to grant now); ``reason``: ``affine | new | overloaded | apart | side | failover |
    round_robin | least_busy | wait``; ``prefix``: leading messages the chosen slot already
    holds; ``moved_from``: the engine that held the conversation's longest prefix when the
    grant goes elsewhere (for ``failover``: the engine that is gone); ``wait_for``: the
    ``(engine, id_slot)`` the asker waits for (its FIFO queue), None: any slot."""

    engine: str | None
    id_slot: int | None
    reason: str
    prefix: int = 0
    moved_from: str | None = None
    wait_for: tuple[str, int] | None = None

    @property
    def granted(self) -> bool:
        """A slot was chosen (not a wait)."""
        return self.engine is not None


def _prefix(ask: Ask, slot: SlotState) -> int:
    return common_prefix(list(ask.fingerprints), list(slot.fingerprints))


def _own(ask: Ask, slot: SlotState) -> bool:
    return ask.conversation is not None and slot.conversation == ask.conversation and not slot.side


def _countable(ask: Ask, slot: SlotState) -> int:
    """The prefix affinity follows (see the module docstring)."""
    n = _prefix(ask, slot)
    if _own(ask, slot) or n == len(slot.fingerprints):
        return n
    return 0


def _home(ask: Ask, slots: Sequence[SlotState], order: dict[str, int]) -> SlotState | None:
    own = [s for s in slots if _own(ask, s)]
    if not own:
        return None
    if ask.main_like:
        return min(own, key=lambda s: (-_prefix(ask, s), -s.last_used, order[s.engine], s.id_slot))
    return min(own, key=lambda s: (-s.last_used, order[s.engine], s.id_slot))


def _wait(wait_for: tuple[str, int] | None = None) -> Choice:
    return Choice(None, None, "wait", wait_for=wait_for)


def _grant(ask: Ask, slot: SlotState, reason: str, moved_from: str | None = None) -> Choice:
    return Choice(slot.engine, slot.id_slot, reason, _prefix(ask, slot), moved_from)


def choose(
    ask: Ask,
    slots: Sequence[SlotState],
    engines: Sequence[EngineLoad],
    *,
    policy: Policy = "affine",
    queue_max: int = 1,
    rr_next: int = 0,
    last_engine: str | None = None,
) -> Choice:
    """Where ``ask`` runs now (rules in the module docstring).

    ``slots``: every slot of the pooled engines (any order); ``engines``: the engines that are
    up, with their load; ``policy``: ``LOKI_ENGINE_ROUTING``; ``queue_max``:
    ``LOKI_AFFINITY_QUEUE_MAX`` (requests allowed to wait for a busy affine slot); ``rr_next``:
    the round-robin counter; ``last_engine``: the engine that last ran this conversation's
    main prompt (the slot book's memory, for ``failover``).

    Returns a :class:`Choice`; never a busy slot nor one another asker waits for.

    Raises:
        ValueError: unknown ``policy``.
    """
    if policy not in ("affine", "round_robin", "least_busy"):
        raise ValueError(f"unknown engine routing policy: {policy!r}")
    loads = {e.engine: e for e in engines if e.slots > 0}
    order = {e.engine: e.order for e in engines}
    live = [s for s in slots if s.engine in loads]
    free = [s for s in live if s.free]
    home = _home(ask, live, order)

    if policy != "affine":
        pick = _comparison(policy, free, engines, loads, rr_next)
        if pick is None:
            return _wait()
        moved = home.engine if ask.main_like and home is not None and pick is not home else None
        return _grant(ask, pick, policy, moved)

    if ask.main_like:
        return _affine_main(ask, live, free, loads, order, queue_max, last_engine)
    return _affine_side(ask, free, loads, order, home)


def _comparison(
    policy: str,
    free: list[SlotState],
    engines: Sequence[EngineLoad],
    loads: dict[str, EngineLoad],
    rr_next: int,
) -> SlotState | None:
    """Rules 13-14: the engine in turn / the least loaded, on it empty first, then LRU."""
    if not free:
        return None
    ranked = sorted(engines, key=lambda e: e.order)
    if policy == "round_robin":
        n = len(ranked)
        engine_turn = [ranked[(rr_next + i) % n].engine for i in range(n)]
    else:
        engine_turn = [
            e.engine for e in sorted(ranked, key=lambda e: (e.load, e.order)) if e.slots > 0
        ]
    for engine in engine_turn:
        mine = [s for s in free if s.engine == engine and engine in loads]
        if mine:
            return min(mine, key=lambda s: (s.content != _EMPTY, s.last_used, s.id_slot))
    return None


def _affine_main(
    ask: Ask,
    live: list[SlotState],
    free: list[SlotState],
    loads: dict[str, EngineLoad],
    order: dict[str, int],
    queue_max: int,
    last_engine: str | None,
) -> Choice:
    """Rules 1-7."""
    gone = last_engine is not None and last_engine not in loads

    def rank(s: SlotState) -> tuple[bool, float, int, int]:
        return (not _own(ask, s), -s.last_used, order[s.engine], s.id_slot)

    best = max((_countable(ask, s) for s in live), default=0)
    if best > 0:
        affine = [s for s in live if _countable(ask, s) == best]
        affine_free = [s for s in affine if s.free]
        if affine_free:
            pick = min(affine_free, key=rank)
            if gone and not _own(ask, pick):
                return _grant(ask, pick, "failover", last_engine)
            return _grant(ask, pick, "affine")
        target = min(affine, key=rank)
        wait_for = (target.engine, target.id_slot)
        if target.waiting < queue_max or not free:
            return _wait(wait_for)
        pick = min(
            free,
            key=lambda s: (
                -_countable(ask, s),
                s.content == _MAIN and not _own(ask, s),
                loads[s.engine].load,
                s.content,
                s.last_used,
                order[s.engine],
                s.id_slot,
            ),
        )
        return _grant(ask, pick, "overloaded", target.engine)

    if not free:
        return _wait()
    pick = min(
        free,
        key=lambda s: (
            s.content == _MAIN,
            loads[s.engine].load,
            order[s.engine],
            s.content,
            s.last_used,
            s.id_slot,
        ),
    )
    if gone:
        return _grant(ask, pick, "failover", last_engine)
    return _grant(ask, pick, "new")


def _affine_side(
    ask: Ask,
    free: list[SlotState],
    loads: dict[str, EngineLoad],
    order: dict[str, int],
    home: SlotState | None,
) -> Choice:
    """Rules 8-12."""
    if not free:
        return _wait()
    home_engine = home.engine if home is not None else None

    def tier(s: SlotState) -> int:
        if home is not None and (s.engine, s.id_slot) == (home.engine, home.id_slot):
            return 2  # the conversation's own main prompt: last resort
        return 1 if s.content == _MAIN else 0

    pick = min(
        free,
        key=lambda s: (
            tier(s),
            s.engine == home_engine,
            loads[s.engine].load,
            order[s.engine],
            s.content,
            s.last_used,
            s.id_slot,
        ),
    )
    return _grant(ask, pick, "side" if pick.engine == home_engine else "apart")
