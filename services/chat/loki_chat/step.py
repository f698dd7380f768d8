"""One step's request: built from the lease the step holds, then streamed.

:class:`StepRequest` is the snapshot of what one completion sends (the wire messages, the
payload and its canonical bytes, the tools offered, the system message and project block that
PREWARM reuses). :func:`prepare` builds it from the whole :class:`Lease` (its window, model,
endpoint, template probe, vision and VERIFY feature, kept on the runner for the step's rules)
and :func:`stream` sends it, the deltas and retries going to the display log.

Rules (tests named in docs/behaviour.md (chat)): the configured tools (not this step's
fallback) are part of the project head's prompt identity; a template that drops tools gets
none and the user is told once per turn (``tools_unavailable``, also kept for
``/api/chat/state``); COMPACT_TAIL_REUSE lays out the send order (:mod:`.compaction.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loki_shared.messages.engine import Lease

from . import step_rules
from .code import rules as code_rules
from .compaction import layout
from .engine import StepResult
from .request import build_payload, encode, wire_messages
from .turn_images import model_view

if TYPE_CHECKING:
    from .turn import TurnRunner


@dataclass
class StepPlan:
    """How the next request is shaped: ``mode`` is ``normal``, ``none`` (tool_choice none
    after a 500) or ``no_tools``; ``suffix`` an ephemeral instruction; ``echo`` whether
    reasoning may be sent back."""

    mode: str = "normal"
    suffix: str | None = None
    echo: bool = True
    compactions: int = 0
    pool_replays: int = 0


@dataclass(frozen=True)
class StepRequest:
    """What one completion sends: ``wire`` (the messages as sent), ``payload`` (the request
    body as a dict) and ``body`` (its canonical bytes), ``tools`` (schemas offered, None: no
    ``tools`` key), ``system`` and ``head`` (the system message and project block)."""

    lease: Lease
    wire: list[dict[str, Any]]
    payload: dict[str, Any]
    body: bytes
    tools: list[dict[str, Any]] | None
    system: str
    head: str | None


def adopt(run: TurnRunner, lease: Lease) -> None:
    """Keep what the step's rules read from ``lease`` on the runner (one source: the lease
    of the step); the window also goes to the conversation's meter."""
    run.last_lease = lease
    run.lease_n_ctx = lease.n_ctx
    if lease.n_ctx:
        run.conv.meter.n_ctx = lease.n_ctx
    run.model = lease.model
    run.external = lease.external
    run.template = lease.template
    run.vision = lease.vision
    run.preset_verify = lease.verify


def preview(run: TurnRunner, lease: Lease | None) -> list[dict[str, Any]]:
    """The wire messages the next step would send under ``lease`` — the previous step's
    (``run.last_lease``; None: none yet, a local engine assumed) — built like
    :func:`prepare` without any of its side effects: the lease request names their
    fingerprints (``LeaseRequest.prompt_fingerprints``, issue 44) before its own lease is
    known. Equal to :func:`prepare`'s ``wire`` when the granted lease has the same model,
    endpoint kind and template and no project retake is due; KEEP_TURN_IMAGES' kept
    images are not resolved here (their parts may differ)."""
    lease = lease if lease is not None else Lease()
    settings, project = run.settings, run.host.project
    echo = step_rules.echo_reasoning(settings, lease.external, lease.template)
    echo_model = lease.model if echo and run.plan.echo else None
    tail_first = layout.applies(settings.compact_tail_reuse, lease.external, lease.template)
    system = code_rules.system_prompt(
        project.system_prompt(settings.system_prompt), run.conv.code, run.conv.project
    )
    return wire_messages(
        system,
        layout.laid_out(run.conv.messages, tail_first),
        echo_model=echo_model,
        suffix=run.plan.suffix,
        head=project.peek(run.conv),
    )


async def prepare(run: TurnRunner, lease: Lease) -> StepRequest:
    """Build the step's request under ``lease``; records on the runner what the turn needs
    afterwards (``sent_*``, ``max_tokens_sent``, ``estimate_at_send``)."""
    adopt(run, lease)
    settings, project = run.settings, run.host.project
    echo_model = lease.model if run.echo_reasoning() and run.plan.echo else None
    tail_first = layout.for_lease(settings.compact_tail_reuse, lease)
    tools = run.offered_tools()
    system = code_rules.system_prompt(
        project.system_prompt(settings.system_prompt), run.conv.code, run.conv.project
    )
    configured = run.host.toolbox.schemas()
    head = project.head(run.conv, system, configured, step_rules.snapshot_engine(lease))
    run.sent_system, run.sent_head = system, head
    wire = wire_messages(
        system,
        layout.laid_out(await model_view(run), tail_first),
        echo_model=echo_model,
        suffix=run.plan.suffix,
        head=head,
    )
    await tell_withheld(run)
    payload = build_payload(
        settings, lease, wire, tools, tool_choice="none" if run.plan.mode == "none" else None
    )
    body = encode(payload)
    run.max_tokens_sent = payload.get("max_tokens")
    run.sent_wire = wire
    counter = run.conv.meter.counter
    if counter is not None:  # the engine of this lease counts
        counter.use(lease.base_url, lease.api_key, lease.model, lease.external)
    await run.prime()
    run.estimate_at_send = run.ctx_used()
    run.sent_tools = bool(tools)
    run.sent_echo = any("reasoning_content" in m for m in wire)
    return StepRequest(lease, wire, payload, body, tools, system, head)


async def stream(run: TurnRunner, req: StepRequest) -> StepResult:
    """Stream ``req`` to the lease's endpoint: the first delta carries ``role: assistant``,
    each network retry is a ``retry`` display event; a stop closes the request."""
    host = run.host
    first = True

    async def on_delta(deltas: list[dict[str, Any]]) -> None:
        nonlocal first
        for delta in deltas:
            if first:
                delta = {"role": "assistant", **delta}
                first = False
            await host.emit(delta)

    async def on_retry(attempt: int, delay: float, reason: str) -> None:
        await host.emit(
            {}, loki={"event": "retry", "attempt": attempt, "delay_s": delay, "reason": reason}
        )

    return await host.engine.stream(
        req.lease.base_url,
        req.body,
        api_key=req.lease.api_key,
        stop=host.stop,
        on_delta=on_delta,
        on_retry=on_retry,
    )


async def tell_withheld(run: TurnRunner) -> None:
    """Tell the user, once per turn, that the tools are off for this model (display event
    ``tools_unavailable``; also kept for ``/api/chat/state``)."""
    host = run.host
    if not step_rules.tools_dropped(run.template):
        host.tools_withheld(None)
        return
    names = [t["function"]["name"] for t in host.toolbox.schemas() or []]
    unavailable = {
        "tools": names,
        "model": run.model,
        "reason": "this model's template ignores tools: recall is off for it",
    }
    host.tools_withheld(unavailable)
    if names and not run.withheld_told:
        run.withheld_told = True
        await host.emit({}, loki={"event": "tools_unavailable", **unavailable})
