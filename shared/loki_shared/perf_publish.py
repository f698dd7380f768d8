"""Build and publish one perf record per completion (chat, summariser, bench, ``/v1`` proxy).

Every publisher uses the same three steps::

    clock = CompletionClock()                  # when the request is sent
    ...                                        # for each streamed chunk with a delta:
    clock.delta()                              #   first delta of any type sets ttft_ms
    ...                                        # the final chunk (timings / usage) arrives
    record = build_record(
        kind="main", conversation=conv_id, model=model, messages=payload["messages"],
        final=final_chunk, clock=clock, cut=stream_was_cut, slot=id_slot,
    )
    await publish_record(broker, record)       # FastStream NatsBroker, nats-py client or js

The record carries the figures only — never any message text: ``fingerprints`` (cumulative
hashes, :func:`loki_shared.fingerprint.fingerprints`) and ``roles`` of the messages *sent*.
``timings`` (llama.cpp) and ``usage`` (OpenAI) are passed through undecoded; the perf service
decodes them tolerantly, so a publisher must not "fix" them (unknown stays absent, never 0).

Publishing is best-effort and read-only for the caller: :func:`publish_record` never raises
for a NATS failure (it logs and returns False), so a perf problem can never fail a turn.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import subjects
from .fingerprint import fingerprints as _fingerprints
from .messages.perf import PerfRecord

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig

    from .messages.engine import Placement

log = logging.getLogger("loki.perf_publish")

#: Header used by JetStream to drop a duplicate publish (a retry) within its window.
MSG_ID_HEADER = "Nats-Msg-Id"


class CompletionClock:
    """Measures one streamed completion in milliseconds on a monotonic clock.

    Create it when the request is sent; call :meth:`delta` for each chunk carrying a delta of
    any type (content, reasoning_content, tool_calls, role). ``ttft_ms`` is the time to the
    first one (None if none came); ``total_ms`` the time until now (or until :meth:`stop`).
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._first: float | None = None
        self._end: float | None = None

    def delta(self) -> None:
        """Note that a delta arrived (only the first one matters)."""
        if self._first is None:
            self._first = time.monotonic()

    def stop(self) -> None:
        """Freeze ``total_ms`` (the stream ended)."""
        if self._end is None:
            self._end = time.monotonic()

    @property
    def ttft_ms(self) -> float | None:
        return None if self._first is None else (self._first - self._t0) * 1000.0

    @property
    def total_ms(self) -> float:
        end = self._end if self._end is not None else time.monotonic()
        return (end - self._t0) * 1000.0


def _dump(message: Any) -> Any:
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    return message


def build_record(
    *,
    kind: str,
    messages: Iterable[Any],
    final: Mapping[str, Any] | None = None,
    timings: Mapping[str, Any] | None = None,
    usage: Mapping[str, Any] | None = None,
    conversation: str | None = None,
    model: str = "",
    preset: str = "local",
    slot: int | None = None,
    clock: CompletionClock | None = None,
    ttft_ms: float | None = None,
    total_ms: float | None = None,
    finish_reason: str | None = None,
    cut: bool = False,
    ts: float | None = None,
    prefix_unstable: bool = False,
    tools_fingerprint: str | None = None,
    placement: Placement | None = None,
) -> PerfRecord:
    """Build the :class:`PerfRecord` of one completion.

    Args:
        kind: ``main``, ``subagent``, ``verify``, ``task``, ``compact``, ``bench``, ``foreign``,
            ``prewarm``.
        messages: the ``messages`` array exactly as sent (dicts or pydantic models); only their
            fingerprints and roles are kept.
        final: the final chunk (or non-streamed response) as received; its ``timings``,
            ``usage`` and ``choices[0].finish_reason`` are used unless given explicitly.
        timings, usage: the engine's objects, passed through as received.
        preset: ``"local"`` or ``"external"``.
        slot: the ``id_slot`` the request was sent with (None: the engine chose).
        clock: a :class:`CompletionClock`; gives ``ttft_ms``/``total_ms`` unless given.
        cut: the stream ended without its final chunk (stop, error, disconnect).
        prefix_unstable: the lease's template probe says ``stable_prefix`` False.
        tools_fingerprint: :func:`loki_shared.fingerprint.tools_fingerprint` of the ``tools``
            sent (None: not said).
        ts: Unix time in seconds of the end of the completion (default: now).
        placement: the lease's :class:`~loki_shared.messages.engine.Placement` (several
            engines, issue 44): its ``engine``, ``moved_from`` and ``transfer`` are copied
            into the record; None (one engine): ``engine`` "", the others None.

    Raises:
        pydantic.ValidationError: ``kind`` is not a request kind.
    """
    sent = [_dump(m) for m in messages]
    if final is not None:
        if timings is None and isinstance(final.get("timings"), Mapping):
            timings = final["timings"]
        if usage is None and isinstance(final.get("usage"), Mapping):
            usage = final["usage"]
        if finish_reason is None:
            choices = final.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
                fr = choices[0].get("finish_reason")
                finish_reason = fr if isinstance(fr, str) else None
    if clock is not None:
        clock.stop()
        ttft_ms = clock.ttft_ms if ttft_ms is None else ttft_ms
        total_ms = clock.total_ms if total_ms is None else total_ms
    return PerfRecord(
        ts=time.time() if ts is None else ts,
        conversation=conversation,
        kind=kind,  # type: ignore[arg-type]
        model=model,
        preset=preset,
        slot=slot,
        timings=dict(timings) if timings is not None else None,
        usage=dict(usage) if usage is not None else None,
        ttft_ms=ttft_ms,
        total_ms=total_ms,
        finish_reason=finish_reason,
        cut=cut,
        fingerprints=_fingerprints(sent),
        roles=[m.get("role", "") if isinstance(m, Mapping) else "" for m in sent],
        prefix_unstable=prefix_unstable,
        tools_fingerprint=tools_fingerprint,
        engine=placement.engine if placement is not None else "",
        moved_from=placement.moved_from if placement is not None else None,
        transfer=placement.transfer if placement is not None else None,
    )


def perf_stream_config() -> StreamConfig:
    """The nats-py ``StreamConfig`` of the perf ring (``LOKI_PERF``: ``loki.perf.record``, at
    most 5000 messages, oldest discarded) — the same as :func:`loki_shared.nats.perf_stream`
    declares through FastStream, so either may create it first."""
    from .nats import perf_stream

    return dataclasses.replace(perf_stream().config, subjects=[subjects.PERF_RECORD])


def jetstream_of(target: Any) -> JetStreamContext:
    """The nats-py JetStream context behind ``target``.

    ``target`` is a nats-py ``JetStreamContext``, a connected nats-py ``Client``, or a started
    FastStream ``NatsBroker``.

    Raises:
        TypeError: ``target`` is none of these.
        faststream.exceptions.IncorrectState: the broker is not connected.
    """
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    if isinstance(target, JetStreamContext):
        return target
    if isinstance(target, Client):
        return target.jetstream()
    state = getattr(getattr(target, "config", None), "connection_state", None)
    if state is not None:
        stream: JetStreamContext = state.stream
        return stream
    raise TypeError(f"cannot publish a perf record through {type(target).__name__}")


async def ensure_perf_stream(js: JetStreamContext) -> None:
    """Create the ``LOKI_PERF`` stream if it does not exist (idempotent).

    Raises:
        nats.js.errors.APIError: the server refused (for example the name is in use with a
            different configuration).
    """
    await js.add_stream(config=perf_stream_config())


#: Seconds :func:`publish_record` keeps trying a record JetStream did not acknowledge (a
#: NATS cluster electing a new stream leader takes a few seconds after losing a node).
PERF_RETRY_S = 20.0


async def publish_record(
    target: Any, record: PerfRecord, *, timeout: float = 2.0, retry_s: float = PERF_RETRY_S
) -> bool:
    """Publish ``record`` on ``loki.perf.record`` into the ``LOKI_PERF`` stream and wait for
    JetStream's acknowledgement.

    ``target``: a FastStream ``NatsBroker`` (started), a nats-py ``Client`` or a nats-py
    ``JetStreamContext``. When the stream does not exist yet it is created with
    :func:`perf_stream_config` and the publish is retried once, with the same
    ``Nats-Msg-Id`` so a retry is never stored twice. A publish not acknowledged (timeout, no
    stream leader) is tried again, with the same id, for ``retry_s`` seconds
    (:data:`PERF_RETRY_S`; see :func:`loki_shared.nats.publish_durable`): the callers spawn
    it, so a turn never waits for it.

    Returns:
        True when JetStream stored the record; False when it could not be published (no
        connection, broker not started, timeout, stream refused; logged at WARNING; nothing
        is raised, so a turn never fails for perf).

    Raises:
        TypeError: ``target`` is not one of the accepted types (a programming error).
    """
    from faststream.exceptions import IncorrectState

    from .nats import publish_durable

    try:
        js = jetstream_of(target)
    except IncorrectState as exc:  # a broker not connected (yet, or any more)
        log.warning("perf record not published: no connection (%s)", type(exc).__name__)
        return False
    return await publish_durable(
        js,
        subjects.PERF_RECORD,
        record.model_dump_json().encode(),
        perf_stream_config(),
        what="perf record",
        log=log,
        timeout=timeout,
        headers={MSG_ID_HEADER: uuid.uuid4().hex},
        retry_s=retry_s,
    )
