"""The one client of the engine lease: ``async with lease(...)`` around every engine request.

Protocol (the supervisor's side is ``loki_supervisor.lease_book``; messages in
:mod:`loki_shared.messages.engine`):

1. ``loki.engine.lease`` with a :class:`LeaseRequest` (NATS timeout longer than its
   ``wait_s``); the reply :class:`Lease` says where to send the request (``base_url``,
   ``api_key``, ``id_slot``) and how long it lives unrenewed (``ttl_s``);
2. while held: ``loki.engine.renew`` at once (the claim: the supervisor gives back a grant
   not renewed within its claim window, as one sent to a waiter that died), then every
   ``ttl_s / 3`` (:func:`renew_interval`; two renewals may be lost before the lease
   expires). A renewal answered ``not_found`` (the lease expired: the holder was presumed
   dead and the slot given away) stops the renewals and sets :attr:`EngineLease.lost`; a
   renewal that fails otherwise (no answer, no responders, another error such as
   ``unavailable`` while replicated supervisors change leader) is tried again: only the
   supervisor's answer about this lease counts;
3. on leaving the ``async with``, whatever the way out — the body returned, raised, or was
   cancelled (a client gone, a stop) — ``loki.engine.release`` is sent once, with the
   ``prompt_tokens`` / ``cached_tokens`` given to :meth:`EngineLease.report`. A release that
   cannot be sent is logged: the lease expires by itself after ``ttl_s``. A release answered
   ``unavailable`` (replicated supervisors without a leader for a moment) is asked again
   every :data:`RELEASE_RETRY_S` within the lease's ``ttl_s``.

A task cancelled while it waits for the lease does not leave a lease behind: when the
supervisor grants it after the waiter gave up, it is released at once.

A waiter whose supervisor dies (``kill -9``, a crash; NATS restarted under it) would hear
nothing until its NATS timeout (70 s for a chat turn's step), since the new supervisor knows
nothing of it. So while it waits it asks ``loki.engine.info`` (first after
:data:`ORPHAN_FIRST_S`, then every :data:`ORPHAN_EVERY_S`): an answer whose ``boot`` differs
from an earlier one, or any answer after an ask that failed for lack of a supervisor (no
responders, a broken connection; a timeout is only slowness and does not count, except before
the first answer: the first ``boot`` seen must be that of the process that queued the
request, and a check that timed out may have been asked of a process dying then), means the
process that queued the request is gone; the request is then asked again of the supervisor
that answers now, within what is left of the same timeout (a grant of the old request that
still comes is released at once). Issue 22's chaos run found turns that waited the whole
70 s after a supervisor kill. With replicated supervisors ``boot`` is the leader's epoch: a
new leader is a new ``boot``.

Usage::

    async with lease(nc, LeaseRequest(kind="foreign", wait_s=60)) as held:
        url = held.lease.base_url + "/v1/chat/completions"
        ...                                   # the engine request
        held.report(prompt_tokens=..., cached_tokens=...)   # optional ("main" leases)

Raises (on entry): :class:`LeaseError` (no answer, refused, or a reply without
``base_url``), :class:`LeaseStopped` (the ``stop`` event fired while waiting).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from . import subjects
from .messages.base import ErrorType
from .messages.engine import (
    EngineInfo,
    EngineInfoRequest,
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)

log = logging.getLogger("loki.lease")

#: Renew every ``ttl_s * RENEW_FRACTION``: the one renewal rule (a lease survives two lost
#: renewals before its TTL runs out).
RENEW_FRACTION = 1 / 3
#: Pause between tries of a lease's first renewal (its claim) while they fail (s).
CLAIM_RETRY_S = 0.25
#: NATS timeout of a renew or release request (s).
CONTROL_TIMEOUT_S = 5.0
#: Pause before a release answered ``unavailable`` (no leader yet) is asked again (s).
RELEASE_RETRY_S = 0.25
#: Seconds of waiting for a grant before the waiter first checks that its supervisor lives.
ORPHAN_FIRST_S = 0.1
#: Seconds between two of those checks (``loki.engine.info``) while the waiter waits.
ORPHAN_EVERY_S = 1.0

Request = Callable[[str, bytes, float], Awaitable[bytes]]

#: Releases still running after their holder was cancelled (kept referenced until done).
_BACKGROUND: set[asyncio.Task[Any]] = set()


def renew_interval(ttl_s: float) -> float | None:
    """Seconds between renewals of a lease living ``ttl_s`` unrenewed: ``ttl_s / 3``; None
    (no renewal) when ``ttl_s`` is not positive."""
    return ttl_s * RENEW_FRACTION if ttl_s and ttl_s > 0 else None


#: Why a lease was not had: the supervisor's reply ``error.type``, or the client's own
#: ``no_answer`` (nobody answered in time) and ``bad_reply`` (a malformed reply).
LeaseErrorType = ErrorType | Literal["no_answer", "bad_reply"]


class LeaseError(Exception):
    """No lease. ``type``: a :data:`LeaseErrorType` (``busy``, ``unavailable``, ...,
    ``no_answer``, ``bad_reply``). A client-side failure, not a reply: whoever holds the
    lease for a request turns it into that request's own error (the ``/v1`` exchange answers
    503 ``engine_<type>``)."""

    def __init__(self, message: str, type_: LeaseErrorType = "unavailable") -> None:
        super().__init__(message)
        self.type = type_
        self.message = message


class LeaseStopped(Exception):
    """The ``stop`` event fired while the lease was awaited (nothing is held)."""


def requester(target: Any) -> Request:
    """A ``request(subject, payload, timeout) -> reply bytes`` over ``target``: a nats-py
    ``Client`` or a started FastStream ``NatsBroker`` (its nats-py connection is used, so
    the payload travels as the raw JSON bytes in both cases).

    Raises:
        TypeError: ``target`` is neither.
    """
    from nats.aio.client import Client

    if isinstance(target, Client):
        client: Client = target

        async def request(subject: str, payload: bytes, timeout: float) -> bytes:
            return (await client.request(subject, payload, timeout=timeout)).data

        return request
    if getattr(getattr(target, "config", None), "connection_state", None) is None:
        raise TypeError(f"no NATS connection in a {type(target).__name__}")

    async def via_broker(subject: str, payload: bytes, timeout: float) -> bytes:
        # looked up at each request: a broker not connected (yet, or any more) fails this
        # request (no lease: LeaseError "no_answer"), not the code that built the lease
        connection: Client = target.config.connection_state.connection
        return (await connection.request(subject, payload, timeout=timeout)).data

    return via_broker


def _is_function(value: Any) -> bool:
    return inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, partial)


def _encode(message: BaseModel) -> bytes:
    return message.model_dump_json().encode()


def _spawn(coro: Awaitable[Any]) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


class EngineLease:
    """One engine lease, as an async context manager (see the module docstring).

    Args:
        nats: a nats-py ``Client`` or a started FastStream ``NatsBroker``, or a request
            function (:data:`Request`).
        request: what to ask (``kind``, ``conversation``, ``wait_s``, ...).
        timeout: NATS timeout of the lease request (default ``wait_s + 5``).
        stop: when set while the lease is awaited, entry gives up with :class:`LeaseStopped`.
        detach: asked at the exit; when it answers True the release goes on in the
            background and the holder goes on at once (a process that is stopping persists
            its partial replies before its budget runs out, whether the supervisor answers
            or not: the lease's TTL covers a release that never arrives).

    Attributes:
        renewals: renewals the supervisor accepted.
        lost: a renewal was answered ``not_found`` (the lease had expired); the request may
            go on, but the slot is no longer reserved for it.
        released: the release was acknowledged.
        release_reply: the supervisor's answer to the release (``slot_erased``,
            ``advice``), None when it did not answer.
    """

    def __init__(
        self,
        nats: Any,
        request: LeaseRequest,
        *,
        timeout: float | None = None,
        stop: asyncio.Event | None = None,
        detach: Callable[[], bool] | None = None,
    ) -> None:
        self._request: Request = nats if _is_function(nats) else requester(nats)
        self._detach = detach
        self.request = request
        self.timeout = timeout if timeout is not None else float(request.wait_s) + 5.0
        self._stop = stop
        self._lease: Lease | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._usage: tuple[int | None, int | None] = (None, None)
        self._job_done = False
        self._fingerprint: str | None = None
        self._exited = False
        self.renewals = 0
        self.lost = False
        self.released = False
        self.release_reply: ReleaseReply | None = None

    @property
    def lease(self) -> Lease:
        """The lease granted (only inside the ``async with``)."""
        if self._lease is None:
            raise RuntimeError("the lease is not held")
        return self._lease

    def report(
        self,
        prompt_tokens: int | None = None,
        cached_tokens: int | None = None,
        *,
        job_done: bool = False,
        prompt_fingerprint: str | None = None,
    ) -> None:
        """What the release will tell the supervisor: ``usage.prompt_tokens`` and
        ``prompt_tokens_details.cached_tokens`` of a ``main`` completion; ``job_done``: the
        last request of a side job (the supervisor may then erase slot 0);
        ``prompt_fingerprint``: the last :func:`loki_shared.fingerprint.fingerprints` value of
        the messages a ``main`` request sent (names the saved slot file with SLOT_PERSIST)."""
        self._usage = (prompt_tokens, cached_tokens)
        self._job_done = job_done
        self._fingerprint = prompt_fingerprint

    async def __aenter__(self) -> EngineLease:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        margin = max(0.0, self.timeout - float(self.request.wait_s))  # NATS past the queue
        request = self.request
        while True:
            asking = asyncio.ensure_future(
                self._request(
                    subjects.ENGINE_LEASE, _encode(request), max(0.1, deadline - loop.time())
                )
            )
            watcher = asyncio.ensure_future(self._orphaned())
            stopper = asyncio.ensure_future(self._stop.wait()) if self._stop is not None else None
            waits: set[asyncio.Future[Any]] = {asking, watcher}
            if stopper is not None:
                waits.add(stopper)
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                self._abandon(asking)
                raise
            finally:
                watcher.cancel()
                if stopper is not None:
                    stopper.cancel()
            if asking in done:
                break
            self._abandon(asking)
            if stopper is not None and stopper in done:
                raise LeaseStopped("stopped while waiting for the engine lease")
            left = deadline - loop.time()
            if left <= margin + 0.5:
                raise LeaseError(
                    "the engine supervisor restarted while the lease was awaited", "no_answer"
                )
            log.info("lease waiter's supervisor is gone: asking the new one (%.1f s left)", left)
            request = request.model_copy(update={"wait_s": left - margin})
        lease = self._granted(asking)
        self._lease = lease
        every = renew_interval(lease.ttl_s)
        if every is not None:
            self._renewer = asyncio.create_task(self._renew_loop(lease.lease_id, every))
        return self

    async def _orphaned(self) -> None:
        """Return once the supervisor that queued this waiter is known to be gone (see the
        module docstring); runs until cancelled otherwise."""
        body = _encode(EngineInfoRequest())
        boot: str | None = None
        absent = False
        await asyncio.sleep(ORPHAN_FIRST_S)
        while True:
            try:
                raw = await self._request(subjects.ENGINE_INFO, body, ORPHAN_EVERY_S)
                seen = EngineInfo.model_validate_json(raw).boot
            except TimeoutError:
                if boot is None:  # no baseline yet: the process asked may be dying
                    absent = True
            except Exception:  # noqa: BLE001 - no responders, a broken connection: gone
                absent = True
            else:
                if absent or (boot is not None and seen != boot):
                    return
                boot = seen
            await asyncio.sleep(ORPHAN_EVERY_S)

    def _granted(self, asking: asyncio.Future[bytes]) -> Lease:
        try:
            raw = asking.result()
        except Exception as exc:  # every transport failure means "no answer"
            raise LeaseError(
                f"no lease from the engine supervisor ({type(exc).__name__})", "no_answer"
            ) from exc
        try:
            lease = Lease.model_validate_json(raw)
        except ValidationError as exc:
            raise LeaseError(f"bad lease reply: {exc.errors()[:1]}", "bad_reply") from exc
        if lease.error is not None:
            raise LeaseError(lease.error.message, lease.error.type)
        if not lease.base_url:
            if lease.lease_id:
                _spawn(self._send_release(lease.lease_id))
            raise LeaseError("lease without base_url", "bad_reply")
        return lease

    def _abandon(self, asking: asyncio.Future[bytes]) -> None:
        """The waiter gave up: a lease granted after that is released at once."""

        def late(fut: asyncio.Future[bytes]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            try:
                lease = Lease.model_validate_json(fut.result())
            except ValidationError:
                return
            if lease.lease_id and lease.error is None:
                log.info("lease %s granted after its waiter left: released", lease.lease_id)
                _spawn(self._send_release(lease.lease_id))

        asking.add_done_callback(late)

    async def _renew_loop(self, lease_id: str, every: float) -> None:
        payload = _encode(RenewRequest(lease_id=lease_id))
        pause = 0.0  # the claim goes at once, and is tried again soon while it fails
        while True:
            await asyncio.sleep(pause)
            try:
                reply = Lease.model_validate_json(
                    await self._request(subjects.ENGINE_RENEW, payload, CONTROL_TIMEOUT_S)
                )
            except Exception as exc:  # noqa: BLE001 - supervisor away: try again next time
                log.warning("lease %s renewal failed: %s", lease_id, type(exc).__name__)
                pause = every if self.renewals else min(every, CLAIM_RETRY_S)
                continue
            pause = every
            if reply.error is not None and reply.error.type != "not_found":
                # no leader now (replicated supervisors changing leader), a supervisor
                # stopping: not an answer about this lease, so it is asked again
                log.warning("lease %s renewal refused for now: %s", lease_id, reply.error.message)
                pause = every if self.renewals else min(every, CLAIM_RETRY_S)
                continue
            if reply.error is not None:
                self.lost = True
                log.warning("lease %s lost: %s", lease_id, reply.error.message)
                return
            self.renewals += 1

    async def _send_release(self, lease_id: str) -> bool:
        prompt_tokens, cached_tokens = self._usage
        req = ReleaseRequest(
            lease_id=lease_id,
            job_done=self._job_done,
            prompt_fingerprint=self._fingerprint,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
        )
        loop = asyncio.get_running_loop()
        ttl = self._lease.ttl_s if self._lease is not None else 0.0
        deadline = loop.time() + max(CONTROL_TIMEOUT_S, ttl)
        while True:
            try:
                reply = ReleaseReply.model_validate_json(
                    await self._request(subjects.ENGINE_RELEASE, _encode(req), CONTROL_TIMEOUT_S)
                )
            except Exception as exc:  # noqa: BLE001 - the lease expires by itself
                log.warning("lease %s not released (%s)", lease_id, type(exc).__name__)
                return False
            retry = reply.error is not None and reply.error.type == "unavailable"
            if not retry or loop.time() + RELEASE_RETRY_S >= deadline:
                break
            # no supervisor leads right now (replicated supervisors changing leader): the
            # release is asked again within the lease's TTL, so the slot is freed at once
            await asyncio.sleep(RELEASE_RETRY_S)
        self.release_reply = reply
        if reply.error is not None:
            log.info("lease %s release: %s", lease_id, reply.error.message)
            return False
        return True

    async def __aexit__(self, *exc_info: object) -> None:
        if self._exited or self._lease is None:
            return
        self._exited = True
        if self._renewer is not None:
            self._renewer.cancel()
        releasing = _spawn(self._send_release(self._lease.lease_id))
        if self._detach is not None and self._detach():
            return  # kept referenced in _BACKGROUND until it is answered or times out
        # Shielded: a cancelled holder (client gone, stop) still releases; the release
        # goes on in the background when the cancellation arrives during it.
        self.released = await asyncio.shield(releasing)


def lease(
    nats: Any,
    request: LeaseRequest,
    *,
    timeout: float | None = None,
    stop: asyncio.Event | None = None,
    detach: Callable[[], bool] | None = None,
) -> EngineLease:
    """An engine lease to hold with ``async with`` (see :class:`EngineLease`)."""
    return EngineLease(nats, request, timeout=timeout, stop=stop, detach=detach)


__all__ = [
    "RENEW_FRACTION",
    "EngineLease",
    "LeaseError",
    "LeaseStopped",
    "lease",
    "renew_interval",
    "requester",
]
