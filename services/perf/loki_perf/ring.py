"""The ring of the last completion records, loss analysis, summary and CACHE_RAM advice.

The ring holds at most ``capacity`` (5000) decoded :class:`~loki_perf.decode.Entry` objects in
stream order. Aggregates are kept incrementally (added on insert, subtracted on eviction) so a
summary over a full ring costs a few sorts, not a pass over 5000 records.

Loss rules (``tests/perf/test_ring.py`` names one test per rule):

1. A completion is compared with the previous completion of the same conversation and the same
   kind (``prev``); records without a conversation are never compared.
2. Never after a cut stream: when ``prev.cut`` is true (or unknown) nothing is flagged.
3. Records of an external preset are kept but never flagged: an external API's cache follows
   its own rules.
4. When this request's fingerprints strictly extend ``prev``'s (``prev``'s list is a proper
   prefix), ``loss = prev.total − reused`` with ``prev.total = prompt_n + cache_n +
   predicted_n`` and ``reused`` = this ``cache_n`` (+1 on a full hit). It is flagged as a
   ``loss`` when it exceeds ``loss_min_tokens`` (the last generated token is never in the
   slot and the reply may re-tokenise differently when sent back, so a few tokens are normal).
5. When the fingerprints of a ``main`` request do not strictly extend (and are not
   identical), a ``divergence`` is flagged with the index and role of the first message whose
   fingerprint differs. Other kinds start new prompts by design and are not flagged.
6. What ran on the engine in between (records after ``prev`` in stream order, other than
   external ones and, when both slots are known, ones on another slot) is named in ``between``;
   the cause of a loss is the category of the last of them, ``none`` if there was none —
   except on a record flagged ``prefix_unstable`` (the model's chat template does not keep a
   stable prefix, issue 16): its loss is caused by ``template``; and except when the tools
   offered changed since ``prev`` (both records say their ``tools_fingerprint`` and they
   differ: an MCP server's tool list changed, issue 42): its loss is caused by ``tools``.
7. CACHE_RAM advice: a ``main`` completion of a local preset that strictly extends its previous
   one after something else ran in between, and whose ``cached_tokens`` (else ``cache_n``) is
   under half its prompt, is an advice event (the supervisor advises raising CACHE_RAM once).
8. Several engines (issue 44): the previous record is the conversation's previous one *on
   any engine* (rule 1's key has no engine), so a move is compared like any other request.
   A loss on a record that was moved — it says ``moved_from``, or its ``engine`` differs from
   the previous record's (both known) — is caused by ``engine_moved``, before ``tools`` and
   ``template``; a ``restored`` record whose ``cache_n`` covers the previous total is no loss
   (rule 4's figures say so). What ran in between counts only records on the same engine
   (when both say theirs) as well as the same slot. ``by_engine`` in the summary: per engine,
   the hit rate, the losses by cause, the moves in (records with ``moved_from``) and the
   restores (``transfer`` ``restored``; ``restores_lost``: those flagged with a loss).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .decode import (
    CAUSES,
    DEPTH_BOUNDS,
    DEPTH_NAMES,
    ENGINE_MOVED_CAUSE,
    KINDS,
    TEMPLATE_CAUSE,
    TOOLS_CAUSE,
    UNKNOWN_KIND,
    Entry,
    Loss,
    category,
)

_ALL_KINDS = (*KINDS, UNKNOWN_KIND)


@dataclass(slots=True)
class KindAgg:
    """Running sums over the ring for one kind (unknown figures are not counted)."""

    completions: int = 0
    with_cache: int = 0  # completions whose cache figures are known
    prompt_n: int = 0  # Σ tokens prefilled (raw prompt_n, usage fallback)
    cache_n: int = 0  # Σ tokens reused (raw cache_n, usage fallback)
    prompt_tokens: int = 0  # Σ N = cache_n + prompt_n
    eff_cached: int = 0
    recomputed: int = 0
    full_hits: int = 0
    generated: int = 0
    draft_n: int = 0
    draft_accepted: int = 0
    cut: int = 0
    losses: int = 0
    tokens_lost: int = 0
    divergences: int = 0

    def apply(self, e: Entry, sign: int) -> None:
        """Add (``sign`` = 1) or remove (``sign`` = -1) ``e``'s figures."""
        self.completions += sign
        if e.cached is not None and e.computed is not None:
            self.with_cache += sign
            self.prompt_n += sign * e.computed
            self.cache_n += sign * e.cached
            # depth, eff_cached and recomputed are set whenever cached and computed are
            assert e.depth is not None and e.eff_cached is not None and e.recomputed is not None
            self.prompt_tokens += sign * e.depth
            self.eff_cached += sign * e.eff_cached
            self.recomputed += sign * e.recomputed
            if e.full_hit:
                self.full_hits += sign
        if e.generated is not None:
            self.generated += sign * e.generated
        if e.draft_n is not None and e.draft_n_accepted is not None:
            self.draft_n += sign * e.draft_n
            self.draft_accepted += sign * e.draft_n_accepted
        if e.cut is not False:
            self.cut += sign
        if e.loss is not None:
            if e.loss.type == "loss":
                self.losses += sign
                self.tokens_lost += sign * (e.loss.tokens or 0)
            else:
                self.divergences += sign

    def as_dict(self) -> dict[str, Any]:
        """Figures for the summary, with ratios (None when undefined)."""
        return {
            "completions": self.completions,
            "with_cache_figures": self.with_cache,
            "prompt_n": self.prompt_n,
            "cache_n": self.cache_n,
            "prompt_tokens": self.prompt_tokens,
            "recomputed": self.recomputed,
            "full_hits": self.full_hits,
            "hit_rate": _ratio(self.eff_cached, self.prompt_tokens),
            "recomputed_per_completion": _ratio(self.recomputed, self.with_cache),
            "generated": self.generated,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_accepted,
            "draft_acceptance": _ratio(self.draft_accepted, self.draft_n),
            "cut": self.cut,
            "losses": self.losses,
            "tokens_lost": self.tokens_lost,
            "divergences": self.divergences,
        }


@dataclass(slots=True)
class EngineAgg:
    """Running sums over the ring for one pooled engine (records that name it)."""

    completions: int = 0
    with_cache: int = 0
    prompt_tokens: int = 0  # Σ N of the records with cache figures
    eff_cached: int = 0
    recomputed: int = 0
    losses: int = 0
    tokens_lost: int = 0
    divergences: int = 0
    moves_in: int = 0  # records with ``moved_from``
    restores: int = 0  # records with ``transfer`` restored
    restores_lost: int = 0  # of those, flagged with a loss (the restore did not cover it)
    recomputed_moves: int = 0  # records with ``transfer`` recomputed
    causes: dict[str, list[int]] = field(default_factory=dict)  # cause -> [count, tokens]

    def apply(self, e: Entry, sign: int) -> None:
        """Add (``sign`` = 1) or remove (``sign`` = -1) ``e``'s figures."""
        self.completions += sign
        if e.cached is not None and e.computed is not None:
            assert e.depth is not None and e.eff_cached is not None and e.recomputed is not None
            self.with_cache += sign
            self.prompt_tokens += sign * e.depth
            self.eff_cached += sign * e.eff_cached
            self.recomputed += sign * e.recomputed
        lost = e.loss is not None and e.loss.type == "loss"
        if e.loss is not None:
            if lost:
                self.losses += sign
                self.tokens_lost += sign * (e.loss.tokens or 0)
            else:
                self.divergences += sign
            c = self.causes.setdefault(e.loss.cause, [0, 0])
            c[0] += sign
            c[1] += sign * (e.loss.tokens or 0)
            if not c[0]:
                del self.causes[e.loss.cause]
        if e.moved_from is not None:
            self.moves_in += sign
        if e.transfer == "restored":
            self.restores += sign
            if lost:
                self.restores_lost += sign
        elif e.transfer == "recomputed":
            self.recomputed_moves += sign

    def as_dict(self) -> dict[str, Any]:
        """Figures for the summary's ``by_engine`` (ratios None when undefined)."""
        return {
            "completions": self.completions,
            "with_cache_figures": self.with_cache,
            "prompt_tokens": self.prompt_tokens,
            "recomputed": self.recomputed,
            "hit_rate": _ratio(self.eff_cached, self.prompt_tokens),
            "losses": self.losses,
            "tokens_lost": self.tokens_lost,
            "divergences": self.divergences,
            "losses_by_cause": {
                c: {"count": v[0], "tokens": v[1]} for c, v in sorted(self.causes.items())
            },
            "moves_in": self.moves_in,
            "restores": self.restores,
            "restores_lost": self.restores_lost,
            "recomputed_moves": self.recomputed_moves,
        }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _median(values: list[float]) -> float | None:
    """Median of an already sorted list (None when empty)."""
    n = len(values)
    if not n:
        return None
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _discard(values: list[float], value: float) -> None:
    """Remove one occurrence of ``value`` from the sorted list ``values``."""
    i = bisect_left(values, value)
    if i < len(values) and values[i] == value:
        del values[i]


class Ring:
    """The last ``capacity`` records, with loss analysis done once, on insertion.

    Args:
        capacity: records kept (the JetStream stream keeps the same number).
        loss_min_tokens: a strict extension losing at most this many tokens is not a loss.
        scan_limit: at most this many records are read back to name what ran in between.
        key_limit: at most this many (conversation, kind) keys are remembered for comparison.

    Not thread-safe: one task inserts; readers run on the same event loop.
    """

    def __init__(
        self,
        capacity: int = 5000,
        loss_min_tokens: int = 8,
        scan_limit: int = 64,
        key_limit: int = 20000,
    ) -> None:
        self.capacity = capacity
        self.loss_min_tokens = loss_min_tokens
        self.scan_limit = scan_limit
        self.key_limit = key_limit
        self.entries: deque[Entry] = deque()
        self._last: dict[tuple[str, str], Entry] = {}
        self._aggs: dict[str, KindAgg] = {k: KindAgg() for k in _ALL_KINDS}
        self._engines: dict[str, EngineAgg] = {}  # by engine id (records that name one)
        self._causes: dict[str, list[int]] = {c: [0, 0] for c in CAUSES}  # count, tokens
        # Sorted lists (insort on insert, bisect on eviction): a median is one index.
        self._pp: list[list[float]] = [[] for _ in DEPTH_NAMES]
        self._tg: list[list[float]] = [[] for _ in DEPTH_NAMES]
        self._ttft: list[float] = []
        self._ttft_depth: list[list[float]] = [[] for _ in DEPTH_NAMES]
        self._losses: deque[Entry] = deque()
        self._advice: deque[Entry] = deque()
        self.advice_total = 0  # advice events seen by this process (not only in the ring)
        self.last_seq = 0

    def __len__(self) -> int:
        return len(self.entries)

    # --- insertion ---------------------------------------------------------------------------
    def add(self, e: Entry) -> Entry:
        """Analyse ``e`` against the ring (rules in the module docstring), insert it, evict
        the oldest record beyond capacity, and return ``e`` (with ``loss``/``advice`` set)."""
        self._analyse(e)
        self.entries.append(e)
        self.last_seq = e.seq
        self._account(e, 1)
        if len(self.entries) > self.capacity:
            self._account(self.entries.popleft(), -1)
        return e

    def _account(self, e: Entry, sign: int) -> None:
        self._aggs[e.kind].apply(e, sign)
        if e.engine:
            agg = self._engines.get(e.engine)
            if agg is None:
                agg = self._engines[e.engine] = EngineAgg()
            agg.apply(e, sign)
            if not agg.completions:
                del self._engines[e.engine]
        if e.loss is not None:
            c = self._causes[e.loss.cause]
            c[0] += sign
            c[1] += sign * (e.loss.tokens or 0)
        local = not e.external
        if sign > 0:
            if local and e.bucket is not None:
                if e.pp_tps is not None:
                    insort(self._pp[e.bucket], e.pp_tps)
                if e.tg_tps is not None:
                    insort(self._tg[e.bucket], e.tg_tps)
                if e.ttft_ms is not None:
                    insort(self._ttft_depth[e.bucket], e.ttft_ms)
            if e.ttft_ms is not None:
                insort(self._ttft, e.ttft_ms)
            if e.loss is not None:
                self._losses.append(e)
            if e.advice is not None:
                self._advice.append(e)
        else:
            # The ring is FIFO, so an evicted record is also the oldest of the side queues.
            if local and e.bucket is not None:
                if e.pp_tps is not None:
                    _discard(self._pp[e.bucket], e.pp_tps)
                if e.tg_tps is not None:
                    _discard(self._tg[e.bucket], e.tg_tps)
                if e.ttft_ms is not None:
                    _discard(self._ttft_depth[e.bucket], e.ttft_ms)
            if e.ttft_ms is not None:
                _discard(self._ttft, e.ttft_ms)
            if self._losses and self._losses[0] is e:
                self._losses.popleft()
            if self._advice and self._advice[0] is e:
                self._advice.popleft()

    def _analyse(self, e: Entry) -> None:
        if e.conversation is None:
            e.fingerprints = e.roles = None  # never compared: do not keep them
            return
        key = (e.conversation, e.kind)
        prev = self._last.pop(key, None)
        self._last[key] = e
        if len(self._last) > self.key_limit:
            old = self._last.pop(next(iter(self._last)))
            old.fingerprints = old.roles = None
        if prev is not None:
            # Only the latest record of a key is ever compared again: the ring keeps the
            # fingerprints of one record per key, not of 5000 (a long conversation sends
            # hundreds of messages per request).
            pf = prev.fingerprints
            prev.fingerprints = prev.roles = None
        else:
            pf = None
        if prev is None or e.external or prev.external:
            return
        if prev.cut is not False:
            return  # never after a cut stream: the slot's content is unknown
        if e.fingerprints is None or pf is None:
            return
        cf = e.fingerprints
        shared = chained_prefix(pf, cf)
        extends = shared == len(pf) and len(cf) > len(pf)
        identical = shared == len(pf) == len(cf)
        if identical:
            return
        prev_total = prev.total
        tokens = None
        if prev_total is not None and e.eff_cached is not None:
            tokens = max(0, prev_total - e.eff_cached)
        if extends:
            e.loss_tokens = tokens
            flagged = tokens is not None and tokens > self.loss_min_tokens
            if not flagged and not (e.kind == "main" and self._low_cache(e)):
                return  # nothing to name: skip reading back what ran in between
            between, truncated = self._between(e, prev)
            if between and e.kind == "main":
                self._maybe_advise(e, between)
            if not flagged:
                return
            if moved(prev, e):  # another engine's cache: a restore did not cover it
                cause = ENGINE_MOVED_CAUSE
            elif tools_changed(prev, e):  # the tools are part of the prefix
                cause = TOOLS_CAUSE
            elif e.prefix_unstable:  # the template re-renders the prefix: its own fault
                cause = TEMPLATE_CAUSE
            else:
                cause = category(between[-1][0]) if between else "none"
            e.loss = Loss(
                "loss",
                cause,
                tokens,
                prev.seq,
                prev_total,
                between=between,
                between_truncated=truncated,
            )
        elif e.kind == "main":
            # Only a conversation's own prompt is expected to grow turn after turn; side jobs
            # (sub-agents, verifications, summaries...) start new prompts by design.
            between, truncated = self._between(e, prev)
            role = None
            if shared < len(cf) and e.roles is not None and shared < len(e.roles):
                role = e.roles[shared]
            e.loss = Loss(
                "divergence",
                "divergence",
                tokens,
                prev.seq,
                prev_total,
                index=shared,
                role=role,
                between=between,
                between_truncated=truncated,
            )

    def _between(self, e: Entry, prev: Entry) -> tuple[list[list], bool]:
        """What ran on the engine after ``prev``, oldest first, as runs ``[kind, conversation,
        count]`` of consecutive records; at most ``scan_limit`` records are read back (the
        second value tells whether the scan stopped there)."""
        runs: list[list] = []
        if self.entries and self.entries[-1] is prev:
            return runs, False
        scanned = 0
        slot = e.slot
        engine = e.engine
        prev_seq = prev.seq
        for other in reversed(self.entries):
            if other.seq <= prev_seq:
                return runs[::-1], False
            scanned += 1
            if scanned > self.scan_limit:
                return runs[::-1], True
            if (
                other.external
                or (slot is not None and other.slot is not None and other.slot != slot)
                or (engine and other.engine and other.engine != engine)
            ):
                continue
            if runs and runs[-1][0] == other.kind and runs[-1][1] == other.conversation:
                runs[-1][2] += 1
            else:
                runs.append([other.kind, other.conversation, 1])
        return runs[::-1], False

    @staticmethod
    def _cache_figures(e: Entry) -> tuple[int | None, int | None]:
        """(cached tokens, prompt tokens) for the CACHE_RAM rule: ``usage`` first (the
        figure the rule is written in), then ``timings``; a full hit counts whole."""
        cached = e.cached_tokens if e.cached_tokens is not None else e.cached
        prompt = e.prompt_tokens if e.prompt_tokens is not None else e.depth
        if cached is not None and e.full_hit:
            cached += 1
        return cached, prompt

    def _low_cache(self, e: Entry) -> bool:
        cached, prompt = self._cache_figures(e)
        return cached is not None and prompt is not None and prompt != 0 and cached * 2 < prompt

    def _maybe_advise(self, e: Entry, between: list[list]) -> None:
        if self._low_cache(e):
            cached, prompt = self._cache_figures(e)
            e.advice = {
                "seq": e.seq,
                "ts": e.ts,
                "conversation": e.conversation,
                "cached_tokens": cached,
                "prompt_tokens": prompt,
                "between": between,  # runs; shown through _group()
            }
            self.advice_total += 1

    # --- reading -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Aggregates over the ring (shape documented in docs/behaviour.md (perf)).

        Top level: ``completions``, ``prompt_n`` and ``cache_n`` (sums over the records whose
        cache figures are known) and ``detail`` (hit rate, per kind, speeds by depth, draft
        acceptance, losses by cause, CACHE_RAM advice).
        """
        total = KindAgg()
        for agg in self._aggs.values():
            for name in KindAgg.__slots__:
                setattr(total, name, getattr(total, name) + getattr(agg, name))
        by_kind = {k: a.as_dict() for k, a in self._aggs.items() if a.completions}
        main = self._aggs["main"]
        speeds = []
        for i, name in enumerate(DEPTH_NAMES):
            pp, tg, ttft = self._pp[i], self._tg[i], self._ttft_depth[i]
            if not pp and not tg and not ttft:
                continue
            speeds.append(
                {
                    "depth": name,
                    "max_tokens": DEPTH_BOUNDS[i] if i < len(DEPTH_BOUNDS) else None,
                    "n_prompt": len(pp),
                    "n_gen": len(tg),
                    "prompt_tps_median": _median(pp),
                    "gen_tps_median": _median(tg),
                    "n_ttft": len(ttft),
                    "ttft_ms_median": _median(ttft),
                }
            )
        overall = total.as_dict()
        detail = {
            "ring": len(self.entries),
            "capacity": self.capacity,
            "last_seq": self.last_seq,
            "hit_rate": overall["hit_rate"],
            "full_hits": total.full_hits,
            "with_cache_figures": total.with_cache,
            "unknown_cache_figures": total.completions - total.with_cache,
            "recomputed": total.recomputed,
            "recomputed_per_completion": overall["recomputed_per_completion"],
            "recomputed_per_turn": _ratio(main.recomputed, main.with_cache),
            "generated": total.generated,
            "draft": {
                "draft_n": total.draft_n,
                "draft_n_accepted": total.draft_accepted,
                "acceptance": overall["draft_acceptance"],
            },
            "cut": total.cut,
            "ttft_ms_median": _median(self._ttft),
            "by_kind": by_kind,
            "speeds_by_depth": speeds,
            "losses_by_cause": {
                c: {"count": v[0], "tokens": v[1]} for c, v in self._causes.items() if v[0]
            },
            "by_engine": {k: a.as_dict() for k, a in sorted(self._engines.items())},
            "moves": sum(a.moves_in for a in self._engines.values()),
            "restores": sum(a.restores for a in self._engines.values()),
            "loss_min_tokens": self.loss_min_tokens,
            "cache_ram": self.advice(),
        }
        return {
            "completions": total.completions,
            "prompt_n": total.prompt_n,
            "cache_n": total.cache_n,
            "detail": detail,
        }

    def losses(self, limit: int = 100) -> list[dict[str, Any]]:
        """The most recent flagged losses and divergences, newest first."""
        out: list[dict[str, Any]] = []
        for e in reversed(self._losses):
            if len(out) >= limit:
                break
            out.append(loss_view(e))
        return out

    def advice(self, since_seq: int = 0) -> dict[str, Any]:
        """CACHE_RAM advice events in the ring after ``since_seq``: ``advise`` is true when
        there is at least one; ``events`` newest last (at most 20)."""
        count = 0
        newest: list[Entry] = []
        for e in reversed(self._advice):
            if e.seq <= since_seq:
                break
            count += 1
            if len(newest) < 20:
                newest.append(e)
        events = [
            {**advice, "between": _group(advice["between"])}
            for e in reversed(newest)
            if (advice := e.advice) is not None
        ]
        return {
            "advise": count > 0,
            "count": count,
            "events": events,
            "last_seq": self.last_seq,
        }


def moved(prev: Entry, e: Entry) -> bool:
    """``e`` ran on another engine than the one holding its conversation's prefix: it says
    ``moved_from``, or both records name their engine and they differ (rule 8: cause
    ``engine_moved``)."""
    return e.moved_from is not None or bool(prev.engine and e.engine and prev.engine != e.engine)


def tools_changed(prev: Entry, e: Entry) -> bool:
    """Both records say which tools they offered, and they differ (rule 6: cause ``tools``)."""
    a, b = prev.tools_fingerprint, e.tools_fingerprint
    return a is not None and b is not None and a != b


def chained_prefix(a: list[str], b: list[str]) -> int:
    """Number of leading fingerprints ``a`` and ``b`` share, in O(log n).

    Fingerprints are cumulative (fingerprint i hashes fingerprint i-1 and message i), so
    ``a[i] == b[i]`` implies the whole prefix up to ``i`` is equal: equality is monotone and a
    binary search finds the first difference. Same result as
    :func:`loki_shared.fingerprint.common_prefix` on genuine fingerprint lists.
    """
    lo, hi = 0, min(len(a), len(b))
    if hi and a[hi - 1] == b[hi - 1]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[hi-1] != b[hi-1] or hi == len
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def loss_view(e: Entry) -> dict[str, Any]:
    """The JSON view of a flagged record's loss (an element of ``LossesReply.losses``)."""
    loss = e.loss
    assert loss is not None
    return {
        "seq": e.seq,
        "ts": e.ts,
        "conversation": e.conversation,
        "kind": e.kind,
        "model": e.model,
        "engine": e.engine,
        "moved_from": e.moved_from,
        "transfer": e.transfer,
        "type": loss.type,
        "cause": loss.cause,
        "tokens": loss.tokens,
        "prev_seq": loss.prev_seq,
        "prev_total": loss.prev_total,
        "cache_n": e.cached,
        "prompt_n": e.computed,
        "index": loss.index,
        "role": loss.role,
        "between": _group(loss.between),
        "between_truncated": loss.between_truncated,
    }


def _group(runs: list[list]) -> list[dict[str, Any]]:
    """The JSON view of :meth:`Ring._between`'s runs: ``kind, cause, conversation, count``."""
    return [
        {"kind": kind, "cause": category(kind), "conversation": conv, "count": count}
        for kind, conv, count in runs
    ]
