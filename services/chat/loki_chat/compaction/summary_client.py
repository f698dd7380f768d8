"""Asking the engine for a summary: lease, request, answer, perf record.

One summary request is one ``compact`` lease (:mod:`loki_chat.leases`: one ``async with``
of the shared lease, renewed every ``ttl_s / 3`` while held), one
``POST {base_url}/v1/chat/completions`` without streaming (the request shapes are
:mod:`.summariser`'s), an answer cleaned by :func:`~.rules.clean_summary`, and a
``compact`` perf record. Nothing here raises for engine, NATS or HTTP trouble: the outcome
says what failed (:class:`SummaryOutcome`) and the policy falls back.

- continuation path: only when the slot still holds the conversation's last request as the
  stored view rebuilds it (``sent_view_mismatch`` otherwise) and the lease goes to the same
  local engine (``engine_changed`` otherwise); the request carries that request, the messages
  accepted since (less the trailing user messages) and the demand; a summary rejected as
  degenerate or empty is asked once more in the same lease with :data:`RETRY_SAMPLING` (the
  slot holds the prompt: only the answer is computed again) before the policy turns to the
  transcript path;
- transcript path: the summariser prompt and the rendered transcript; on a local
  llama-server a degenerate or empty answer is asked once more the same way (an external API
  is asked once).

With COMPACT_TAIL_REUSE (:mod:`.layout`) the turn's request was sent tail first: the sent
view is rebuilt in that order, the demand numbers messages as they were sent and asks for the
earlier summary first (it covers what came before message #1): the story stays chronological.

An HTTP error mentioning the chat template, or a summary that calls a tool, asks for the
continuation path to be suspended for the model (``suspend``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.lease import LeaseError
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, Lease, TemplateProbe
from loki_shared.perf_publish import build_record

from ..bus import ChatBus
from ..conversation import Conversation
from ..leases import EngineLeases
from ..request import wire_messages
from ..settings import Settings
from . import layout
from . import summariser as S
from .decide import continued
from .rules import SummaryError, cites_ids, clean_summary, text_of
from .slot_watch import SlotWatch
from .state import Stamp

log = logging.getLogger("loki.chat.compaction")

#: Continuation failures found before any request left (they never count toward suspension).
NOT_SENT = ("view_changed", "sent_view_mismatch", "no_lease", "engine_changed")
#: Seconds a ``loki.engine.info`` answer is reused.
INFO_TTL_S = 30.0
#: Summaries rejected for these (a small model looping at temperature 0.2) are asked once
#: more, in the same lease, with :data:`RETRY_SAMPLING` (continuation path: always; transcript
#: path: on a local llama-server only).
RETRIED = ("degenerate", "empty")
#: The temperature of that second ask (measured 2026-12-01 on SmolLM2-135M: a continuation
#: that looped 6 times in 6 at 0.2 passed 5 times in 6 at 0.6).
RETRY_TEMPERATURE = 0.6
#: The sampling of that second ask: warmer, and llama.cpp's ``repeat_penalty`` over its
#: default window (``repeat_last_n`` 64 tokens: the answer itself, not the conversation, so
#: names and ids are still copied whole). Measured 2026-12-01 on SmolLM2-135M, five
#: continuation requests that had looped in the headline session, 8 seeds each: temperature
#: 0.6 alone passed 19 of 40, with ``repeat_penalty`` 1.15 40 of 40 (DRY, ``dry_multiplier``
#: 0.8, 37 of 40). llama.cpp-only fields: only ever sent to the local llama-server.
RETRY_SAMPLING: dict[str, Any] = {"temperature": RETRY_TEMPERATURE, "repeat_penalty": 1.15}


@dataclass
class SummaryOutcome:
    """The result of one summary attempt: ``text`` on success, ``failure`` otherwise;
    ``suspend``: the continuation path should be suspended for the model; ``prompt_n``: the
    engine's ``timings.prompt_n`` (tokens prefilled) when it answered; ``model``: the
    lease's model the request went to (None when no request left)."""

    text: str | None = None
    failure: str | None = None
    suspend: bool = False
    prompt_n: int | None = None
    model: str | None = None


def _template_knows(info: EngineInfo | None) -> bool:
    return bool(info and info.chat_template and "enable_thinking" in info.chat_template)


class SummaryClient:
    """Sends summary requests for the compaction policy.

    Args:
        settings: ``system_prompt``, ``chat_template_kwargs``, ``engine_timeout_s``.
        bus: the NATS bus (engine info, perf records).
        http: the HTTP client for the engine.
        leases: the instance's engine leases.
        slots: the slot watch (a summary request leaving voids every stamp).
    """

    def __init__(
        self,
        settings: Settings,
        bus: ChatBus,
        http: httpx.AsyncClient,
        leases: EngineLeases,
        slots: SlotWatch,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.http = http
        self.leases = leases
        self.slots = slots
        self._info: EngineInfo | None = None
        self._info_at = 0.0
        #: ``timings.prompt_n`` of the last summary request answered (figures)
        self.last_prompt_n: int | None = None
        #: the template probe's verdicts of the last lease seen (a turn's or a summary's;
        #: None: not probed) — whether compaction may cite recall ids (issue 16)
        self.template: TemplateProbe | None = None

    @property
    def cite(self) -> bool:
        """Whether recall ids may be cited to the model (:func:`~.rules.cites_ids`)."""
        return cites_ids(self.template)

    async def engine_info(self) -> EngineInfo | None:
        """``loki.engine.info`` (cached :data:`INFO_TTL_S`; None when the supervisor does
        not answer)."""
        now = time.monotonic()
        if now - self._info_at < INFO_TTL_S and self._info_at:
            return self._info
        self._info_at = now
        try:
            self._info = await self.bus.request(
                subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2.0
            )
        except Exception:  # noqa: BLE001 - unknown: the caller does without
            self._info = None
        return self._info

    async def continuation(
        self, conv: Conversation, stamp: Stamp, boundary: int, budget: int, archived: list[str]
    ) -> SummaryOutcome:
        """The continuation path for ``conv``, cut at ``boundary`` (``archived``: the ids of
        the blocks archived, named in the demand)."""
        system = self.settings.system_prompt
        sent = stamp.body
        messages = conv.messages
        if stamp.count > len(messages) or boundary > len(messages):
            return SummaryOutcome(failure="view_changed")
        # COMPACT_TAIL_REUSE: the turn's request was sent tail first (:mod:`.layout`)
        tail_first = layout.applies(self.settings.compact_tail_reuse, False, self.template)
        # the boundary is re-aligned on the view that was sent: messages one for one
        rebuilt = wire_messages(system, layout.laid_out(messages[: stamp.count], tail_first))
        sent_msgs = sent.get("messages") or []
        if len(rebuilt) != len(sent_msgs) or any(
            a.get("role") != s.get("role") or a.get("content") != s.get("content")
            for a, s in zip(rebuilt, sent_msgs)
        ):
            return SummaryOutcome(failure="sent_view_mismatch")
        kept = continued(messages[stamp.count :])
        moved = tail_first and layout.summary_after(messages[0]) is not None
        if moved:  # the order of the whole view, cut after the messages carried
            full = wire_messages(
                system, layout.laid_out(messages[: stamp.count + len(kept)], tail_first)
            )
            if full[: len(rebuilt)] != rebuilt:
                return SummaryOutcome(failure="sent_view_mismatch")
            after = full[len(rebuilt) :]
        else:
            after = wire_messages(system, kept)[1:]
        first = messages[boundary]
        # the prefix it continues (the demand is joined after it; issue 44's routing key)
        prefix = fingerprints([*sent_msgs, *after])
        try:
            async with self.leases.compact_lease(conv.id, True, prefix) as held:
                lease = held.lease
                self.template = lease.template
                demand = S.CONTINUATION_DEMAND if self.cite else S.CONTINUATION_DEMAND_NO_TOOLS
                number = boundary + 1
                if moved:  # numbered as sent; the earlier summary told first
                    number = layout.wire_number(messages, True, boundary)
                demand = demand.format(
                    boundary=number,
                    role=first.role,
                    start=S.quote_start(text_of(first) or "(tool call)"),
                    kept=len(messages) - boundary,
                    archived=S.archived_line(archived),
                )
                if moved:
                    demand += S.EARLIER_SUMMARY_FIRST.format(
                        at=layout.wire_number(messages, True, 0)
                    )
                if (
                    lease.external
                    or lease.model != stamp.model
                    or (stamp.n_ctx and lease.n_ctx and lease.n_ctx != stamp.n_ctx)
                ):
                    return SummaryOutcome(failure="engine_changed")
                info = await self.engine_info()
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
                outcome = await self._send(conv.id, lease, body, budget)
                return await self._again(conv.id, lease, body, budget, outcome, "continuation")
        except LeaseError as exc:
            log.warning("[compact] no lease (%s)", exc)
            return SummaryOutcome(failure="no_lease")

    async def transcript(
        self, cid: str, budget: int, render: Callable[[bool], str]
    ) -> SummaryOutcome:
        """The transcript path for conversation ``cid``; ``render(cite)`` gives the
        transcript, rendered once the lease says whether the model can call ``recall``."""
        # the request as the last lease's template shapes it (issue 44's routing key); it
        # is rendered again only when the new lease's template changes ``cite``
        cite = self.cite
        transcript = render(cite)
        anticipated = fingerprints(S.transcript_messages(transcript, cite))
        try:
            async with self.leases.compact_lease(cid, False, anticipated) as held:
                lease = held.lease
                self.template = lease.template
                if self.cite != cite:
                    transcript = render(self.cite)
                info = await self.engine_info()
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
                    cite=self.cite,
                )
                outcome = await self._send(cid, lease, body, budget)
                if not lease.external:
                    outcome = await self._again(cid, lease, body, budget, outcome, "transcript")
                outcome.model = lease.model
                return outcome
        except LeaseError as exc:
            log.warning("[compact] no lease (%s)", exc)
            return SummaryOutcome(failure="no_lease")

    async def _again(
        self,
        cid: str,
        lease: Lease,
        body: dict[str, Any],
        budget: int,
        outcome: SummaryOutcome,
        path: str,
    ) -> SummaryOutcome:
        """``outcome`` of ``body``, or — when it was rejected as looping or empty
        (:data:`RETRIED`) — the outcome of the same request asked once more in the same lease
        with :data:`RETRY_SAMPLING` (the slot holds its prompt: only the answer is computed).
        Local llama-server only (callers see to it)."""
        if outcome.failure not in RETRIED or outcome.suspend:
            return outcome
        log.info(
            "[compact] %s: %s summary %s; asked once more (%s)",
            cid,
            path,
            outcome.failure,
            ", ".join(f"{k} {v}" for k, v in RETRY_SAMPLING.items()),
        )
        return await self._send(cid, lease, {**body, **RETRY_SAMPLING}, budget)

    async def _send(
        self, cid: str, lease: Lease, body: dict[str, Any], budget: int
    ) -> SummaryOutcome:
        """POST one summary request (not streamed); clean the answer; publish its perf
        record."""
        self.slots.request_left()  # the slot no longer holds any conversation's prompt
        url = lease.base_url.rstrip("/") + "/v1/chat/completions"
        headers = {"Content-Type": "application/json"}
        if lease.api_key:
            headers["Authorization"] = f"Bearer {lease.api_key}"
        t0 = time.monotonic()
        raw = S.encode(body)
        try:
            resp = await self.http.post(
                url, content=raw, headers=headers, timeout=float(self.settings.engine_timeout_s)
            )
        except httpx.HTTPError as exc:
            return SummaryOutcome(failure=f"network: {type(exc).__name__}")
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
        self._publish_perf(cid, lease, body, data, total_ms)
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
            log.warning("[compact] %s: summary cut (%s), kept and marked […]", cid, cleaned.cut)
        return SummaryOutcome(text=cleaned.text, prompt_n=self.last_prompt_n)

    def _publish_perf(
        self, cid: str, lease: Lease, body: dict[str, Any], data: dict[str, Any], total_ms: float
    ) -> None:
        try:
            record = build_record(
                kind="compact",
                messages=body["messages"],
                final=data,
                conversation=cid,
                model=lease.model,
                preset="external" if lease.external else "local",
                slot=lease.id_slot,
                total_ms=total_ms,
                prefix_unstable=lease.template is not None
                and lease.template.stable_prefix is False,
                placement=lease.placement,
            )
        except Exception:  # a perf record is best effort: building it never fails a summary
            log.warning("[compact] perf record not built", exc_info=True)
            return
        self.bus.publish_perf(record)
