"""PREWARM (``LOKI_PREWARM``, on by default; issue 21 §2): after a compaction
at turn end, while the user reads, the next request's prefix (system, tools, summary, tail, as
the next turn will send them) goes to the conversation's slot, so the engine has it in its
cache before the user writes.

Rules:

- one ``prewarm`` lease (:meth:`~loki_chat.leases.EngineLeases.prewarm_lease`): low
  priority — the supervisor revokes it for any other request on its slot, the holder sees it
  at its next renewal (every 0.5 s) and cancels the request at once, freeing the slot; with
  SIDE_SLOT it goes to slot 0 (the conversation's);
- the conversation's own next turn (or Continue, a stop, the service closing) cancels it
  before anything else (:meth:`loki_chat.actor.Actor.stop_prewarm`);
- never on an external preset (the lease says so: released unused);
- the request is the next turn's request without the user message to come: the same
  wire messages (COMPACT_TAIL_REUSE's order included, :mod:`loki_chat.compaction.layout`),
  tools and fields, streamed, ``max_tokens: 1`` (the prompt is what matters); its perf
  record has kind ``prewarm``;
- its lease request names the fingerprints of that prefix as it would be sent under the
  turn's last lease (``PrewarmJob.lease``; issue 44: with several engines the slot whose
  last prompt shares the longest prefix is chosen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loki_shared.fingerprint import fingerprints
from loki_shared.lease import LeaseError
from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import Lease
from loki_shared.messages.perf import PerfRecord

from .compaction import layout
from .engine import EngineClient
from .leases import PREWARM_WAIT_S, EngineLeases
from .request import build_payload, encode, wire_messages
from .settings import Settings

log = logging.getLogger("loki.chat.prewarm")

#: How often (s) the holder looks at its lease for a pre-emption while the request runs.
WATCH_S = 0.1


@dataclass
class PrewarmJob:
    """What one prewarm sends: the conversation ``cid``, a snapshot of its model view
    (``messages``), the ``tools`` the next step offers (None: none), whether reasoning is
    echoed (``echo``: the turn's REASONING_ECHO verdict), and the system message and project
    block (``head``) the turn's last request sent (None: the configured system prompt, no
    block), so the prefix is the next request's byte for byte. ``lease``: the lease of the
    turn's last request (None: unknown), under which the prefix is anticipated for the lease
    request (:func:`job_wire`)."""

    cid: str
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None
    echo: bool = False
    system: str | None = None
    head: str | None = None
    lease: Lease | None = None


def job_wire(settings: Settings, job: PrewarmJob, lease: Lease) -> list[dict[str, Any]]:
    """The wire messages ``job`` sends under ``lease`` (its model and template shape the
    order and the reasoning echoed; module rules)."""
    tail_first = layout.applies(settings.compact_tail_reuse, lease.external, lease.template)
    return wire_messages(
        settings.system_prompt if job.system is None else job.system,
        layout.laid_out(job.messages, tail_first),
        echo_model=lease.model if job.echo else None,
        head=job.head,
    )


async def run_prewarm(
    job: PrewarmJob,
    *,
    settings: Settings,
    leases: EngineLeases,
    engine: EngineClient,
    publish: Callable[[PerfRecord], None],
    wait_s: float = PREWARM_WAIT_S,
    check: Callable[[Lease], Awaitable[str | None]] | None = None,
) -> str:
    """Send one prewarm request; never raises for engine or NATS trouble.

    Args:
        wait_s: how long the supervisor may queue the lease (s; past it: ``no_lease``).
        check: asked once the lease is granted, before anything is sent: None to go on,
            else the outcome to return with nothing sent (the lease released unused) —
            PREWARM after an engine restart (:mod:`loki_chat.restart_prewarm`) skips a slot
            that SLOT_PERSIST restored.

    Returns:
        The outcome: ``done`` (the engine answered), ``preempted`` (the supervisor gave the
        slot to a real request: the request was cancelled), ``external`` (an external
        preset: nothing sent), ``no_lease`` (busy, or no engine), ``error`` (the engine
        refused or failed), or what ``check`` returned. A cancelled task raises
        :class:`asyncio.CancelledError` as usual.
    """
    try:
        anticipated = fingerprints(job_wire(settings, job, job.lease or Lease()))
        async with leases.prewarm_lease(job.cid, wait_s, fingerprints=anticipated) as held:
            lease = held.lease
            if lease.external:
                return "external"
            if check is not None:
                skipped = await check(lease)
                if skipped is not None:
                    log.info("[prewarm] %s: not sent (%s)", job.cid, skipped)
                    return skipped
            wire = job_wire(settings, job, lease)
            payload = build_payload(settings, lease, wire, job.tools)
            payload["max_tokens"] = 1
            stop = asyncio.Event()

            async def watch() -> None:
                while not held.lost:  # noqa: ASYNC110 - a flag the lease client sets
                    await asyncio.sleep(WATCH_S)
                stop.set()

            watcher = asyncio.create_task(watch())
            try:
                result = await engine.stream(
                    lease.base_url,
                    encode(payload),
                    api_key=lease.api_key,
                    stop=stop,
                    on_delta=_drop,
                )
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if held.lost or result.stopped:
                log.info("[prewarm] %s: pre-empted by a real request", job.cid)
                return "preempted"
            if result.responded:
                publish(result.perf_record("prewarm", job.cid, lease, wire, job.tools))
            return "error" if result.error is not None else "done"
    except LeaseError as exc:
        log.info("[prewarm] %s: no lease (%s)", job.cid, exc)
        return "no_lease"


async def _drop(_deltas: list[dict[str, Any]]) -> None:
    """Deltas of a prewarm are not shown anywhere."""
