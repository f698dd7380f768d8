"""The compaction policy: when to compact, and compaction itself (archive, then summarise).

Implements :class:`loki_chat.context.ContextPolicy`. Rules (tests named in
docs/behaviour.md (compaction)):

When (:meth:`CompactionPolicy.decide`):
- at turn start, mid-turn (between steps) and turn end, compact when ``ctx_used`` passes
  75% of the window (``LOKI_COMPACT_THRESHOLD``), or when 1.2 × the longest recent
  generation no longer fits in what is left — never below half the window;
- after a refusal for lack of reduction, no new try before the context grows 10% more,
  except at 90% of the window; the refusal is forgotten when the context drops;
- never more than two compactions between two completion steps;
- ``manual`` and ``reactive`` always try.

How (:meth:`CompactionPolicy.compact`):
- tail (:func:`~.rules.tail_start`): about the last 20% stays verbatim, starting on an
  assistant message; the system prompt is never compacted, the first user message is not
  pinned;
- re-measure first: when even an empty summary would not reduce the context by 20%, nothing
  is summarised (path ``refused``);
- torso parts of at least 800 characters are archived verbatim (``loki.recall.archive``,
  label by :func:`loki_shared.recall_label.recall_label`) and given to the summariser as
  their first 400 characters plus their id; recall unreachable: summarised without ids;
- summary by the continuation path (``COMPACT_CONTINUATION``) when the slot still holds
  the conversation's last request and that request (its size as the engine counted it), the
  messages accepted since less the trailing user messages (:func:`continued`), the demand
  (estimates × 1.05) and the summary budget fit in the window; else by the transcript
  path; a failed or unusable summary falls back to the torso stripped of its big blocks
  (ids kept) — raw reasoning is never installed as memory;
- after: system, the summary message (a user message marked ``loki.injected="summary"``,
  holding the torso's last request re-injected only when the tail has no user request and
  the summary succeeded), then the tail;
- reactive, when the engine still refuses after a compaction (or nothing could be
  summarised): last-resort shrink (:func:`shrink`): big tool results cut (archived first),
  then the oldest exchanges dropped, aiming at 60% of the window corrected by the real size
  read in the error;
- each compaction publishes a :class:`~loki_shared.messages.events.CompactionEvent` on
  ``loki.events.compaction`` (stream ``LOKI_EVENTS``), puts a ``compaction`` marker in the
  display log, and each summary request publishes a ``compact`` perf record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from loki_shared import subjects
from loki_shared.messages.chat import ChatMessage, LokiMeta
from loki_shared.messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.messages.events import CompactionEvent
from loki_shared.messages.perf import PerfRecord
from loki_shared.messages.recall import ArchiveReply, ArchiveRequest
from loki_shared.recall_label import recall_label

from ..context import ContextView, estimate_tokens
from ..request import wire_messages
from . import summariser as S
from .rules import (
    BIG_BLOCK_CHARS,
    SUMMARY_KIND,
    SummaryError,
    big_parts,
    budget_tokens,
    clean_summary,
    excerpt,
    is_real_request,
    last_request,
    tail_start,
    text_of,
)

log = logging.getLogger("loki.chat.compaction")

SUMMARY_HEADER = (
    "[Summary of the earlier conversation, written by Loki when it was "
    "compacted. Archived blocks come back verbatim with recall(id).]\n"
)
REQUEST_HEADER = "\n\n[The request in progress]\n"

#: Generations remembered for the generation guard.
RECENT_GENERATIONS = 8
#: Continuation failures found before any request left (they never count toward suspension).
NOT_SENT = ("view_changed", "sent_view_mismatch", "no_lease", "engine_changed")
#: Max compactions between two accepted completion steps.
MAX_PER_STEP = 2


def continued(after: list[ChatMessage]) -> list[ChatMessage]:
    """The messages accepted since the slot's last request that a continuation request
    carries: all but the trailing user messages — those are not in the slot's cache (they
    would be prefilled for nothing), the demand must not be read as their answer, and a
    strict template never sees two user messages in a row. They stay in the verbatim tail."""
    end = len(after)
    while end and after[end - 1].role == "user":
        end -= 1
    return after[:end]


@dataclass
class Stamp:
    """The slot holds this conversation's prompt: the request ``body`` as sent (decoded),
    ``count`` model-view messages it carried, the engine it went to, and ``tokens``: what
    the slot held after it (``usage.prompt_tokens + completion_tokens``; None when the
    engine did not say)."""

    body: dict[str, Any]
    count: int
    model: str
    n_ctx: int
    id_slot: int | None
    epoch: int
    tokens: int | None = None


@dataclass
class ConvState:
    """What the policy remembers of one conversation (in memory only)."""

    generations: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_GENERATIONS))
    refused_at: int | None = None
    since_step: int = 0
    reactive_done: bool = False
    stamp: Stamp | None = None
    measured_factor: float | None = None


@dataclass
class SummaryOutcome:
    """The result of one summary attempt: ``text`` on success, ``failure`` otherwise."""

    text: str | None = None
    failure: str | None = None
    suspend: bool = False
    prompt_n: int | None = None


class CompactionPolicy:
    """The default :class:`~loki_chat.context.ContextPolicy` of the chat service.

    Args:
        settings: the chat :class:`~loki_chat.settings.Settings` (``compact_threshold``,
            ``compact_continuation``, ``system_prompt``, ``chat_template_kwargs``,
            ``engine_timeout_s``, ``recall_timeout_s``).
    """

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.states: dict[str, ConvState] = {}
        self.epoch = 0
        self.suspended: set[str] = set()
        self.failures: dict[str, int] = {}
        self.n_ctx = 0
        self._info: EngineInfo | None = None
        self._info_at = 0.0
        self._perf_sub: Any = None
        self._perf_retry_at = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        #: ``timings.prompt_n`` of the last summary request and the path it took (figures)
        self.last_prompt_n: int | None = None
        #: ``timings.prompt_n`` of each continuation request answered (figures, tests)
        self.continuation_prompt_n: list[int] = []

    # -- knobs ------------------------------------------------------------------------------
    @property
    def threshold(self) -> float:
        return float(getattr(self.settings, "compact_threshold", 0.75))

    @property
    def continuation_on(self) -> bool:
        return bool(getattr(self.settings, "compact_continuation", False))

    def state(self, cid: str) -> ConvState:
        return self.states.setdefault(cid, ConvState())

    # -- notes from the turn loop -----------------------------------------------------------
    def note_step(
        self,
        cid: str,
        lease: Lease,
        body: bytes,
        usage: dict[str, Any] | None,
        count: int,
        generated_chars: int = 0,
    ) -> None:
        """An accepted completion step of ``cid`` left for the engine with ``body`` and
        ``count`` model-view messages: the slot now holds this conversation's prompt
        (every other conversation's stamp is void), its generation size is remembered, and
        the per-step compaction count restarts."""
        self.epoch += 1
        st = self.state(cid)
        st.since_step = 0
        st.reactive_done = False
        completion = (usage or {}).get("completion_tokens")
        st.generations.append(completion if isinstance(completion, int) else generated_chars // 4)
        if lease.n_ctx:
            self.n_ctx = lease.n_ctx
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        prompt = (usage or {}).get("prompt_tokens")
        held = (
            prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
        )
        st.stamp = (
            None
            if lease.external or not isinstance(decoded, dict)
            else Stamp(decoded, count, lease.model, lease.n_ctx, lease.id_slot, self.epoch, held)
        )

    def _on_perf(self, record: PerfRecord) -> None:
        """Another request left for the engine: a stamp on its slot is void."""
        if record.kind == "main":
            st = self.states.get(record.conversation or "")
            if st is not None and st.stamp is not None and st.stamp.epoch == self.epoch:
                return  # this conversation's own step
        for st in self.states.values():
            if st.stamp is not None and (
                record.slot is None or st.stamp.id_slot is None or record.slot == st.stamp.id_slot
            ):
                st.stamp = None

    async def _subscribe_perf(self, broker: Any) -> None:
        if self._perf_sub is not None or broker is None:
            return
        state = getattr(getattr(broker, "config", None), "connection_state", None)
        nc = getattr(state, "connection", None) if state is not None else None
        if nc is None:
            return

        async def on(msg: Any) -> None:
            try:
                self._on_perf(PerfRecord.model_validate_json(msg.data))
            except Exception:  # noqa: BLE001 - an odd record never breaks compaction
                pass

        # an ordered JetStream consumer on the perf ring (new records only), never a plain
        # subscription on the subject: that would turn a publish into a missing stream into
        # a timeout for every publisher. No stream yet: try again 30 s later.
        if time.monotonic() < self._perf_retry_at:
            return
        try:
            from nats.js.api import DeliverPolicy

            self._perf_sub = await nc.jetstream().subscribe(
                subjects.PERF_RECORD,
                cb=on,
                stream=subjects.STREAM_PERF,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
        except Exception as exc:  # noqa: BLE001
            self._perf_retry_at = time.monotonic() + 30
            log.info("not watching %s yet (%s)", subjects.PERF_RECORD, type(exc).__name__)

    # -- engine facts -----------------------------------------------------------------------
    async def engine_info(self, broker: Any) -> EngineInfo | None:
        """``loki.engine.info`` (cached 30 s; None when the supervisor does not answer)."""
        now = time.monotonic()
        if now - self._info_at < 30 and self._info_at:
            return self._info
        self._info_at = now
        try:
            msg = await broker.request(EngineInfoRequest(), subjects.ENGINE_INFO, timeout=2.0)
            self._info = EngineInfo.model_validate_json(msg.body)
        except Exception:  # noqa: BLE001
            self._info = None
        return self._info

    async def window(self, view: ContextView) -> int:
        if view.n_ctx:
            return view.n_ctx
        if self.n_ctx:
            return self.n_ctx
        info = await self.engine_info(view.extra.get("broker"))
        return info.n_ctx if info and info.n_ctx else 0

    # -- decision ---------------------------------------------------------------------------
    def decide(self, trigger: str, used: int, n_ctx: int, st: ConvState) -> str | None:
        """Why to compact now (``threshold``, ``generation``, ``manual``, ``reactive``), or
        None."""
        if trigger in ("manual", "reactive"):
            return trigger
        if n_ctx <= 0 or st.since_step >= MAX_PER_STEP:
            return None
        if st.refused_at is not None:
            if used < st.refused_at:
                st.refused_at = None
            elif used < st.refused_at * 1.1 and used < 0.9 * n_ctx:
                return None
        if used > self.threshold * n_ctx:
            return "threshold"
        longest = max(st.generations, default=0)
        if used >= 0.5 * n_ctx and 1.2 * longest > n_ctx - used:
            return "generation"
        return None

    # -- entry point ------------------------------------------------------------------------
    async def maybe_compact(self, view: ContextView) -> bool:
        """See :class:`~loki_chat.context.ContextPolicy`. Never raises for engine, recall or
        NATS trouble (a failed summary falls back; a failed fallback changes nothing)."""
        await self._subscribe_perf(view.extra.get("broker"))
        conv = view.conversation
        st = self.state(conv.id)
        n_ctx = await self.window(view)
        why = self.decide(view.trigger, view.ctx_used, n_ctx, st)
        if why is None:
            return False
        log.info(
            "[compact] %s: %s (%s), ctx_used %d of %d",
            conv.id,
            view.trigger,
            why,
            view.ctx_used,
            n_ctx,
        )
        return await self.compact(view, n_ctx, st)

    async def compact(self, view: ContextView, n_ctx: int, st: ConvState) -> bool:
        conv = view.conversation
        t0 = time.monotonic()
        before = view.ctx_used
        system = self.settings.system_prompt
        messages = list(conv.messages)
        if view.trigger == "reactive" and st.reactive_done:
            return await self._shrink(view, n_ctx, st, t0)
        b = tail_start(messages)
        if b is None:
            if view.trigger == "reactive":
                return await self._shrink(view, n_ctx, st, t0)
            return False
        torso, tail = messages[:b], messages[b:]
        request = last_request(torso)
        reinject = request is not None and not any(is_real_request(m) for m in tail)
        wrapper = SUMMARY_HEADER + (REQUEST_HEADER + text_of(request) if reinject else "")
        torso_est = sum(estimate_tokens(m) for m in torso)
        gain = torso_est - estimate_tokens({"role": "user", "content": wrapper})
        if gain < 0.2 * max(before, 1):
            st.refused_at = before
            log.info(
                "[compact] %s: refused, an empty summary would save %d of %d tokens",
                conv.id,
                gain,
                before,
            )
            await self._event(view, "refused", before, before, [], t0)
            if view.trigger == "reactive":
                return await self._shrink(view, n_ctx, st, t0)
            return False
        st.refused_at = None
        # archive the torso's big parts first
        parts = big_parts(torso)
        archived: list[str] = []
        ids: dict[tuple[int, str], str | None] = {}
        reachable = True
        for part in parts:
            block_id = None
            if reachable:
                block_id = await self._archive(view, part.role, part.text, part.tool_name)
                reachable = block_id is not None
            part.id = block_id
            ids[(part.index, part.text)] = block_id
            if block_id:
                archived.append(block_id)
        big = set(ids)
        outcome, path = await self._summarise(view, n_ctx, st, torso, b, ids, big, archived)
        if outcome.text is not None:
            content = SUMMARY_HEADER + outcome.text
            if reinject and request is not None:
                content += REQUEST_HEADER + text_of(request)
            new = [
                ChatMessage(role="user", content=content, loki=LokiMeta(injected=SUMMARY_KIND)),
                *tail,
            ]
        else:
            stripped = strip_torso(torso, ids)
            if stripped == torso:
                log.warning(
                    "[compact] %s: summary failed (%s) and nothing to strip",
                    conv.id,
                    outcome.failure,
                )
                if view.trigger == "reactive":
                    return await self._shrink(view, n_ctx, st, t0)
                return False
            log.warning(
                "[compact] %s: summary failed (%s); torso stripped of big blocks",
                conv.id,
                outcome.failure,
            )
            new = [*stripped, *tail]
            path = "fallback"
        conv.messages[:] = new
        conv.meter.invalidate()
        after = conv.meter.used(system, conv.messages)
        st.since_step += 1
        if view.trigger == "reactive":
            st.reactive_done = True
        await self._mark(
            view, path, before, after, archived, t0, summary=outcome.text, failure=outcome.failure
        )
        if view.trigger == "reactive" and view.overflow is not None:
            factor = _factor(view, before)
            if after * factor > 0.6 * n_ctx:
                await self._shrink(view, n_ctx, st, time.monotonic())
        return True

    # -- summary ----------------------------------------------------------------------------
    async def _summarise(
        self,
        view: ContextView,
        n_ctx: int,
        st: ConvState,
        torso: list[ChatMessage],
        b: int,
        ids: dict[tuple[int, str], str | None],
        big: set[tuple[int, str]],
        archived: list[str],
    ) -> tuple[SummaryOutcome, str]:
        budget = budget_tokens(n_ctx)
        conv = view.conversation
        if self._continuation_allowed(view, st, n_ctx, budget):
            assert st.stamp is not None
            model = st.stamp.model
            outcome = await self._continuation(view, st, b, budget, archived)
            if outcome.prompt_n is not None:
                self.continuation_prompt_n.append(outcome.prompt_n)
            if outcome.text is not None:
                self.failures.pop(model, None)
                return outcome, "continuation"
            if outcome.failure not in NOT_SENT:  # the engine answered or failed: counts
                self.failures[model] = self.failures.get(model, 0) + 1
            if outcome.suspend or self.failures.get(model, 0) >= 2:
                self.suspended.add(model)
                log.warning(
                    "[compact] continuation suspended for %s until restart (%s)",
                    model,
                    outcome.failure,
                )
            log.info(
                "[compact] %s: continuation failed (%s); transcript path", conv.id, outcome.failure
            )
        transcript = S.render_transcript(torso, ids, big)
        return await self._transcript(view, budget, transcript), "summary"

    def _continuation_allowed(
        self, view: ContextView, st: ConvState, n_ctx: int, budget: int
    ) -> bool:
        stamp = st.stamp
        if not self.continuation_on or view.trigger not in ("start", "mid", "end"):
            return False
        if stamp is None or stamp.epoch != self.epoch or stamp.model in self.suspended:
            return False
        if n_ctx and stamp.n_ctx and stamp.n_ctx != n_ctx:
            return False
        messages = view.conversation.messages
        if stamp.count > len(messages):
            return False
        # what the continuation request holds: the slot's prompt (exact when the engine
        # said), the messages accepted since (estimated), the demand; plus its budget
        after = continued(messages[stamp.count :])
        accepted = sum(estimate_tokens(m) for m in after)
        demand = estimate_tokens(S.CONTINUATION_DEMAND) + 40
        if stamp.tokens is not None:
            held = stamp.tokens
        else:  # the whole view, less what was accepted since and the trailing user messages
            left_out = messages[stamp.count + len(after) :]
            held = max(view.ctx_used - sum(estimate_tokens(m) for m in left_out) - accepted, 0)
        return held + (accepted + demand) * 1.05 + budget <= n_ctx

    async def _continuation(
        self, view: ContextView, st: ConvState, b: int, budget: int, archived: list[str]
    ) -> SummaryOutcome:
        stamp = st.stamp
        assert stamp is not None
        conv = view.conversation
        system = self.settings.system_prompt
        sent = stamp.body
        messages = conv.messages
        if stamp.count > len(messages) or b > len(messages):
            return SummaryOutcome(failure="view_changed")
        # the boundary is re-aligned on the view that was sent: messages one for one
        rebuilt = wire_messages(system, messages[: stamp.count])
        sent_msgs = sent.get("messages") or []
        if len(rebuilt) != len(sent_msgs) or any(
            a.get("role") != s.get("role") or a.get("content") != s.get("content")
            for a, s in zip(rebuilt, sent_msgs)
        ):
            return SummaryOutcome(failure="sent_view_mismatch")
        after = wire_messages(system, continued(messages[stamp.count :]))[1:]
        first = messages[b]
        demand = S.CONTINUATION_DEMAND.format(
            boundary=b + 1,
            role=first.role,
            start=S.quote_start(text_of(first) or "(tool call)"),
            kept=len(messages) - b,
            archived=S.archived_line(archived),
        )
        lease = await self._lease(view, continuation=True)
        if lease is None:
            return SummaryOutcome(failure="no_lease")
        try:
            if (
                lease.external
                or lease.model != stamp.model
                or (stamp.n_ctx and lease.n_ctx and lease.n_ctx != stamp.n_ctx)
            ):
                return SummaryOutcome(failure="engine_changed")
            info = await self.engine_info(view.extra.get("broker"))
            kwargs = S.thinking_kwargs(
                sent.get("chat_template_kwargs"), True, _template_knows(info)
            )
            body = S.continuation_request(
                sent,
                after,
                demand,
                budget=budget,
                local=True,
                id_slot=lease.id_slot,
                template_kwargs=kwargs,
            )
            return await self._send(view, lease, body, budget)
        finally:
            await self._release(view, lease)

    async def _transcript(self, view: ContextView, budget: int, transcript: str) -> SummaryOutcome:
        lease = await self._lease(view, continuation=False)
        if lease is None:
            return SummaryOutcome(failure="no_lease")
        try:
            info = await self.engine_info(view.extra.get("broker"))
            kwargs = S.thinking_kwargs(
                self.settings.chat_template_kwargs, not lease.external, _template_knows(info)
            )
            body = S.transcript_request(
                transcript=transcript,
                model=lease.model,
                budget=budget,
                local=not lease.external,
                id_slot=lease.id_slot,
                template_kwargs=kwargs,
            )
            return await self._send(view, lease, body, budget)
        finally:
            await self._release(view, lease)

    async def _send(
        self, view: ContextView, lease: Lease, body: dict[str, Any], budget: int
    ) -> SummaryOutcome:
        """POST one summary request (not streamed); clean the answer; publish its perf
        record."""
        http: httpx.AsyncClient | None = view.extra.get("http")
        if http is None:
            return SummaryOutcome(failure="no_http_client")
        self.epoch += 1  # any other request leaving: the slot no longer holds a prompt
        url = lease.base_url.rstrip("/") + "/v1/chat/completions"
        headers = {"Content-Type": "application/json"}
        if lease.api_key:
            headers["Authorization"] = f"Bearer {lease.api_key}"
        t0 = time.monotonic()
        raw = S.encode(body)
        renew = self._renewer(view, lease)
        try:
            resp = await http.post(
                url,
                content=raw,
                headers=headers,
                timeout=float(getattr(self.settings, "engine_timeout_s", 600)),
            )
        except httpx.HTTPError as exc:
            return SummaryOutcome(failure=f"network: {type(exc).__name__}")
        finally:
            if renew:
                renew.cancel()
        total_ms = (time.monotonic() - t0) * 1000
        if resp.status_code != 200:
            text = resp.text[:300]
            template = "template" in text.lower() or "jinja" in text.lower()
            return SummaryOutcome(failure=f"HTTP {resp.status_code}: {text}", suspend=template)
        try:
            data = resp.json()
            choice = (data.get("choices") or [{}])[0]
            message = choice.get("message") or {}
        except (ValueError, AttributeError, IndexError):
            return SummaryOutcome(failure="undecodable answer")
        self._publish_perf(view, lease, body, data, total_ms)
        timings = data.get("timings") if isinstance(data.get("timings"), dict) else {}
        self.last_prompt_n = (
            timings.get("prompt_n") if isinstance(timings.get("prompt_n"), int) else None
        )
        try:
            cleaned = clean_summary(
                message.get("content"),
                reasoning=message.get("reasoning_content"),
                tool_calls=message.get("tool_calls"),
                finish_reason=choice.get("finish_reason"),
                budget=budget,
            )
        except SummaryError as exc:
            return SummaryOutcome(
                failure=exc.reason, suspend=exc.reason == "tool_call", prompt_n=self.last_prompt_n
            )
        if cleaned.cut:
            log.warning(
                "[compact] %s: summary cut (%s), kept and marked […]",
                view.conversation.id,
                cleaned.cut,
            )
        return SummaryOutcome(text=cleaned.text, prompt_n=self.last_prompt_n)

    # -- last resort ------------------------------------------------------------------------
    async def _shrink(self, view: ContextView, n_ctx: int, st: ConvState, t0: float) -> bool:
        conv = view.conversation
        if n_ctx <= 0:
            return False
        factor = _factor(view, view.ctx_used)
        target = 0.6 * n_ctx / factor
        system = self.settings.system_prompt
        before = conv.meter.used(system, conv.messages)

        async def archive(message: ChatMessage, text: str) -> str | None:
            return await self._archive(
                view, message.role, text, message.name if message.role == "tool" else None
            )

        new, archived = await shrink(conv.messages, system, target, archive)
        if new == conv.messages:
            return False
        conv.messages[:] = new
        conv.meter.invalidate()
        after = conv.meter.used(system, conv.messages)
        st.since_step += 1
        st.reactive_done = True
        await self._mark(view, "shrink", before, after, archived, t0)
        return True

    # -- NATS helpers -----------------------------------------------------------------------
    async def _archive(
        self, view: ContextView, role: str, text: str, tool_name: str | None
    ) -> str | None:
        broker = view.extra.get("broker")
        if broker is None:
            return None
        req = ArchiveRequest(
            label=recall_label(role, text, tool_name),
            role=role,
            tool_name=tool_name,
            content=text,
            conversation=view.conversation.id,
        )
        try:
            msg = await broker.request(
                req,
                subjects.RECALL_ARCHIVE,
                timeout=float(getattr(self.settings, "recall_timeout_s", 5.0)),
            )
            reply = ArchiveReply.model_validate_json(msg.body)
        except Exception as exc:  # noqa: BLE001 - recall unreachable: summarise without ids
            log.warning(
                "[compact] archive failed (%s); summarising without archiving", type(exc).__name__
            )
            return None
        if reply.error is not None or not reply.id:
            log.warning("[compact] archive refused: %s", reply.error)
            return None
        return reply.id

    async def _lease(self, view: ContextView, continuation: bool) -> Lease | None:
        broker = view.extra.get("broker")
        if broker is None:
            return None
        wait = max(1.0, float(getattr(self.settings, "lease_timeout_s", 70.0)) - 5)
        try:
            msg = await broker.request(
                LeaseRequest(
                    kind="compact",
                    conversation=view.conversation.id,
                    wait_s=wait,
                    continuation=continuation,
                ),
                subjects.ENGINE_LEASE,
                timeout=wait + 5,
            )
            lease = Lease.model_validate_json(msg.body)
        except Exception as exc:  # noqa: BLE001
            log.warning("[compact] no lease (%s)", type(exc).__name__)
            return None
        if lease.error is not None or not lease.base_url:
            log.warning("[compact] lease refused: %s", lease.error)
            return None
        return lease

    async def _release(self, view: ContextView, lease: Lease) -> None:
        broker = view.extra.get("broker")
        if broker is None or not lease.lease_id:
            return
        try:
            await broker.request(
                ReleaseRequest(lease_id=lease.lease_id), subjects.ENGINE_RELEASE, timeout=5.0
            )
        except Exception:  # noqa: BLE001 - it expires by itself
            log.warning("[compact] lease %s not released", lease.lease_id)

    def _renewer(self, view: ContextView, lease: Lease) -> asyncio.Task[None] | None:
        broker = view.extra.get("broker")
        if broker is None or not lease.ttl_s or not lease.lease_id:
            return None

        async def loop() -> None:
            while True:
                await asyncio.sleep(max(0.5, lease.ttl_s / 3))
                try:
                    await broker.request(
                        RenewRequest(lease_id=lease.lease_id), subjects.ENGINE_RENEW, timeout=5.0
                    )
                except Exception:  # noqa: BLE001
                    pass

        return asyncio.create_task(loop())

    def _publish_perf(
        self,
        view: ContextView,
        lease: Lease,
        body: dict[str, Any],
        data: dict[str, Any],
        total_ms: float,
    ) -> None:
        broker = view.extra.get("broker")
        if broker is None:
            return
        from loki_shared.perf_publish import build_record, publish_record

        try:
            record = build_record(
                kind="compact",
                messages=body["messages"],
                final=data,
                conversation=view.conversation.id,
                model=lease.model,
                preset="external" if lease.external else "local",
                slot=lease.id_slot,
                total_ms=total_ms,
            )
        except Exception:
            log.warning("[compact] perf record not built", exc_info=True)
            return
        self._spawn(publish_record(broker, record))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark(
        self,
        view: ContextView,
        path: str,
        before: int,
        after: int,
        archived: list[str],
        t0: float,
        summary: str | None = None,
        failure: str | None = None,
    ) -> None:
        """The display-log marker and the audit event of one compaction."""
        meta: dict[str, Any] = {
            "event": "compaction",
            "trigger": view.trigger,
            "path": path,
            "tokens_before": before,
            "tokens_after": after,
            "archived": archived,
        }
        if summary is not None:
            meta["summary"] = summary
        if failure is not None:
            meta["failure"] = failure
        if view.emit is not None:
            try:
                await view.emit({}, meta)
            except Exception:
                log.warning("[compact] marker not emitted", exc_info=True)
        await self._event(view, path, before, after, archived, t0)
        log.info(
            "[compact] %s: %s via %s, %d -> %d tokens, archived %s",
            view.conversation.id,
            view.trigger,
            path,
            before,
            after,
            archived,
        )

    async def _event(
        self, view: ContextView, path: str, before: int, after: int, archived: list[str], t0: float
    ) -> None:
        broker = view.extra.get("broker")
        if broker is None:
            return
        event = CompactionEvent(
            conversation=view.conversation.id,
            ts=time.time(),
            trigger=view.trigger,
            tokens_before=before,
            tokens_after=after,
            archived=archived,
            path=path,
            duration_s=time.monotonic() - t0,
        )
        await publish_event(broker, event)


async def publish_event(broker: Any, event: CompactionEvent) -> bool:
    """Publish ``event`` on ``loki.events.compaction`` into the ``LOKI_EVENTS`` stream
    (created when missing). Best effort: False (logged) when it could not be stored."""
    import nats.errors
    import nats.js.errors

    from loki_shared.perf_publish import jetstream_of

    try:
        js = jetstream_of(broker)
    except Exception:  # noqa: BLE001
        return False
    payload = event.model_dump_json().encode()
    if not _streams_ready.get(id(js)):
        # created when missing (idempotent); a core subscriber on the subject would otherwise
        # turn a missing stream into a timeout instead of a "no stream" answer
        try:
            await js.add_stream(config=_events_config())
        except Exception:  # noqa: BLE001 - exists with another configuration: publish anyway
            pass
        _streams_ready[id(js)] = True
    for attempt in (1, 2):
        try:
            await js.publish(
                subjects.EVENTS_COMPACTION, payload, timeout=2.0, stream=subjects.STREAM_EVENTS
            )
            return True
        except (nats.js.errors.NoStreamResponseError, nats.js.errors.NotFoundError):
            if attempt == 2:
                break
            try:
                await js.add_stream(config=_events_config())
            except Exception as exc:  # noqa: BLE001
                log.warning("compaction event not published: %s", exc)
                return False
        except Exception as exc:  # noqa: BLE001
            log.warning("compaction event not published: %s", exc)
            return False
    return False


_streams_ready: dict[int, bool] = {}


def _events_config() -> Any:
    from loki_shared.nats import events_stream

    return dataclasses.replace(
        events_stream().config, subjects=[subjects.EVENTS_COMPACTION, subjects.EVENTS_ARCHIVE]
    )


def _template_knows(info: EngineInfo | None) -> bool:
    return bool(info and info.chat_template and "enable_thinking" in info.chat_template)


def _factor(view: ContextView, estimate: int) -> float:
    """Real size / estimate, read from an overflow error's ``n_prompt_tokens`` (1 when
    unknown or smaller)."""
    real = view.overflow.n_prompt_tokens if view.overflow else None
    if real and estimate > 0:
        return max(1.0, real / estimate)
    return 1.0


def strip_torso(
    torso: list[ChatMessage],
    ids: dict[tuple[int, str], str | None],
) -> list[ChatMessage]:
    """The torso with each archived big part replaced by its excerpt and id (a part that
    could not be archived stays whole: nothing is lost)."""
    out: list[ChatMessage] = []
    for i, message in enumerate(torso):
        text = text_of(message)
        update: dict[str, Any] = {}
        block = ids.get((i, text))
        if block and isinstance(message.content, str):
            update["content"] = excerpt(text, block)
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                cid = ids.get((i, call.function.arguments))
                if cid:
                    # arguments stay valid JSON (templates re-parse them)
                    args = json.dumps(
                        {"archived": f"recall:{cid}", "excerpt": call.function.arguments[:400]}
                    )
                    call = call.model_copy(
                        update={"function": call.function.model_copy(update={"arguments": args})}
                    )
                calls.append(call)
            update["tool_calls"] = calls
        out.append(message.model_copy(update=update) if update else message)
    return out


async def shrink(
    messages: list[ChatMessage], system: str, target: float, archive: Any
) -> tuple[list[ChatMessage], list[str]]:
    """Last resort: bring the estimate of ``[system, *messages]`` to ``target`` tokens.

    First big tool results (oldest first) are archived and cut to their excerpt and id;
    then the oldest exchanges (from one user message to the next) are dropped, their big
    parts archived first; the last exchange always stays. Returns the new view and the ids
    archived.
    """
    out = list(messages)
    archived: list[str] = []

    def size() -> int:
        return estimate_tokens({"role": "system", "content": system}) + sum(
            estimate_tokens(m) for m in out
        )

    for i, message in enumerate(out):
        if size() <= target:
            break
        text = text_of(message)
        if message.role == "tool" and len(text) >= BIG_BLOCK_CHARS:
            block = await archive(message, text)
            if block:
                archived.append(block)
            out[i] = message.model_copy(update={"content": excerpt(text, block)})
    while size() > target:
        starts = [
            i
            for i, m in enumerate(out)
            if m.role == "user" and i > 0 and not (m.loki and m.loki.injected in ("budget", "act"))
        ]
        if not starts:
            break
        cut = starts[0]
        for message in out[:cut]:
            text = text_of(message)
            if len(text) >= BIG_BLOCK_CHARS and "(archived verbatim as recall:" not in text:
                block = await archive(message, text)
                if block:
                    archived.append(block)
        out = out[cut:]
    return out, archived
