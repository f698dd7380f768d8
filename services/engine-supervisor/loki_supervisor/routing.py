"""Pure slot rules: which ``id_slot`` a request gets, whether slot 0 is erased after a side
job (CACHE_ISOLATE), and when to advise raising CACHE_RAM. Table tests:
``tests/engine/test_routing.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Kinds that run beside the conversation (slot 1 with SIDE_SLOT).
SIDE_KINDS = frozenset({"verify", "subagent", "task", "bench", "foreign"})
#: Side jobs after which slot 0 is erased with one slot (not ``compact``: nothing to gain).
ERASE_AFTER_KINDS = frozenset({"verify", "subagent", "task", "bench"})
#: First llama.cpp build whose slot erase is safe to use here (``/props`` ``build_info``).
MIN_ERASE_BUILD = 8660


@dataclass(frozen=True)
class EngineView:
    """What routing needs to know of the engine.

    ``ctx``: CTX (the conversation window, tokens); ``slot_n_ctx``: per-slot ``n_ctx`` from
    ``/props``/``/slots``; ``shared_window``: the slots share one KV pool (unified cache);
    ``external``: an external preset (no slots).
    """

    external: bool
    total_slots: int
    slot_n_ctx: tuple[int, ...]
    ctx: int
    shared_window: bool = False

    @property
    def two_slots(self) -> bool:
        """``/props`` announces exactly 2 slots of at least CTX tokens each, not sharing one
        window: the only layout where ``id_slot`` is ever set."""
        return (
            not self.external
            and not self.shared_window
            and self.total_slots == 2
            and len(self.slot_n_ctx) == 2
            and min(self.slot_n_ctx) >= self.ctx
        )


def route(kind: str, view: EngineView, continuation: bool = False) -> int | None:
    """The ``id_slot`` for a request of ``kind`` (None: do not set ``id_slot``).

    With two slots of CTX (SIDE_SLOT): slot 0 for ``main`` (the turn, its steps) and
    ``prewarm`` and for a ``compact`` that continues the cached prompt
    (``continuation``); slot 1 for ``verify``, ``subagent``, ``task``, ``bench``, a
    transcript ``compact`` and ``foreign`` (``/v1`` clients are rewritten to slot 1
    whatever they asked). Never an ``id_slot`` with one slot, an external preset or a shared
    window.
    """
    if not view.two_slots:
        return None
    if kind in ("main", "prewarm") or (kind == "compact" and continuation):
        return 0
    return 1


def shares_main_slot(kind: str, id_slot: int | None, view: EngineView) -> bool:
    """Whether a request runs in the slot that holds the conversation's prompt (so it may
    evict it): any local request without a slot-1 route. A slot-1 request does not end the
    "slot holds the prompt" state."""
    if view.external:
        return False
    return id_slot != 1


def build_number(build_info: str | None) -> int | None:
    """llama.cpp's build number from ``/props`` ``build_info`` (``b8660-1a2b3c4`` → 8660);
    None when absent, unreadable or 0 (a build made outside a git checkout reports
    ``b0-unknown``: unknown build)."""
    if not build_info:
        return None
    m = re.match(r"\s*b?(\d+)", build_info)
    if not m or int(m.group(1)) == 0:
        return None  # "b0-unknown": built outside a git checkout, build unknown
    return int(m.group(1))


def erase_decision(
    *,
    kind: str,
    job_done: bool,
    cache_isolate: bool,
    external: bool,
    build: int | None,
    total_slots: int,
    slot0_idle: bool | None,
    in_flight: int,
) -> str | None:
    """Whether to erase slot 0 after a side job (CACHE_ISOLATE). Returns None to erase, or
    the reason to abstain.

    Erase only after the last request of a ``verify``/``subagent``/``task``/``bench`` job
    (never after ``compact``), CACHE_ISOLATE on, a local engine, ``/props`` build ≥ 8660
    (unknown build → abstain), ``total_slots == 1`` (two slots: abstain, the conversation
    keeps its own), slot 0 idle, and no other Loki request in flight (``in_flight`` counts
    leases held by others).
    """
    if not job_done:
        return "not the end of a side job"
    if kind == "compact":
        return "not after a compaction"
    if kind not in ERASE_AFTER_KINDS:
        return f"{kind} is not a side job"
    if not cache_isolate:
        return "CACHE_ISOLATE off"
    if external:
        return "external preset"
    if build is None:
        return "engine build unknown"
    if build < MIN_ERASE_BUILD:
        return f"engine build {build} < {MIN_ERASE_BUILD}"
    if total_slots != 1:
        return f"{total_slots} slots: the conversation keeps its own"
    if in_flight > 0:
        return f"{in_flight} Loki request(s) in flight"
    if slot0_idle is None:
        return "slot 0 state unknown"
    if not slot0_idle:
        return "slot 0 busy"
    return None


def cache_ram_advice(prompt_tokens: int | None, cached_tokens: int | None) -> bool:
    """Whether a conversation that comes back after a side job on its slot lost its cache:
    less than half of its prompt cached (``usage.prompt_tokens_details.cached_tokens``).
    Unknown figures never advise."""
    if prompt_tokens is None or cached_tokens is None or prompt_tokens <= 0:
        return False
    return cached_tokens * 2 < prompt_tokens
