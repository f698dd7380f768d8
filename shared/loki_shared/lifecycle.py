"""How every service process stops: within ``LOKI_STOP_TIMEOUT_S`` of SIGTERM, whatever the
state of NATS, Redis and the engine.

A service's ``__main__`` runs its coroutine with :func:`run` and stops in named steps::

    async def main(stop: lifecycle.Stop) -> int:
        ...start...
        await stop.wait()                       # SIGTERM / SIGINT
        steps = stop.steps()                    # the stop budget starts at the first signal
        await steps.run("release the locks", service.close(), limit_s=5)
        await steps.run("close NATS", nats.close_broker(broker, steps.left()))
        return 0

    sys.exit(lifecycle.run(main, settings.stop_timeout_s, log))

The rules, each the answer to one way a stop used to hang (issue 25):

- Every step that talks to a peer runs under its own deadline (:meth:`Steps.run`): past it,
  or when it fails, one line says what could not be done and the next step runs. Nothing
  already persisted is touched by a step that gives up.
- The event loop's leftover tasks are cancelled and waited for only until the budget ends
  (:func:`run`). ``asyncio.run`` waits for them forever, and a nats-py client that was
  reconnecting to a NATS that went away can lose that cancellation (on Python 3.11
  ``asyncio.wait_for`` inside its connect attempt returns the attempt's result when both
  arrive together, and the reconnect loop goes on): that was the hang.
- A watchdog thread ends the process (status 1) when the whole stop overruns the budget by
  :data:`WATCHDOG_MARGIN_S` (a blocked event loop); a second SIGTERM/SIGINT ends it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

#: Seconds the watchdog grants past the stop budget before it ends the process.
WATCHDOG_MARGIN_S = 1.0
#: Exit status of a stop forced by a second signal or by the watchdog.
FORCED_EXIT_STATUS = 1
#: Seconds of the budget each step leaves to the steps after it (the last close calls).
RESERVE_S = 0.5

Action = Awaitable[Any] | Callable[[], Awaitable[Any]]


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the first line of the message), for stop logs."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Steps:
    """The stop budget of one process: named steps, each with its own deadline.

    Args:
        budget_s: seconds from now that the whole stop may take.
        log: where a step that gave up is reported (one WARNING line each).
    """

    def __init__(self, budget_s: float, log: logging.Logger) -> None:
        self.deadline = time.monotonic() + budget_s
        self.log = log
        self.failed: list[str] = []

    def left(self) -> float:
        """Seconds left in the budget (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    async def run(self, what: str, action: Action, limit_s: float | None = None) -> bool:
        """Run ``action`` (an awaitable, or a callable returning one) for at most
        ``limit_s`` seconds and never past the budget less :data:`RESERVE_S`.

        Returns True when it finished; False when it failed or ran out of time: it is then
        cancelled (without waiting for it to agree) and one line says ``could not <what>``.
        Never raises (but ``KeyboardInterrupt``/``SystemExit`` pass through).
        """
        room = max(0.05, self.left() - RESERVE_S)
        timeout = room if limit_s is None else max(0.05, min(limit_s, room))
        try:
            awaitable = action() if callable(action) else action
        except Exception as exc:  # noqa: BLE001 - a stop step never stops the stop
            return self._gave_up(what, one_line(exc))
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            # The task may ignore the cancellation (the nats-py reconnect loop does): give it
            # a moment, never more.
            await asyncio.wait({task}, timeout=0.05)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception never retrieved" noise
            return self._gave_up(what, f"no answer within {timeout:.1f} s")
        if task.cancelled():  # by the peer's library itself (nats-py cancels its own waits)
            return self._gave_up(what, "cancelled")
        failure = task.exception()
        if failure is not None:
            return self._gave_up(what, one_line(failure))
        return True

    def _gave_up(self, what: str, why: str) -> bool:
        self.failed.append(what)
        self.log.warning("stop: could not %s (%s)", what, why)
        return False


class Stop:
    """Termination signals of one service process and its stop budget.

    The first SIGTERM or SIGINT sets the stop request (:meth:`wait` returns) and starts the
    watchdog; a second one ends the process at once with :data:`FORCED_EXIT_STATUS`.

    Args:
        timeout_s: the stop budget, ``LOKI_STOP_TIMEOUT_S`` (seconds from the first signal).
        log: the service logger.
    """

    def __init__(self, timeout_s: float, log: logging.Logger) -> None:
        self.timeout_s = timeout_s
        self.log = log
        self.signals = 0
        self.requested_at: float | None = None
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self.on_signal, sig)

    def on_signal(self, signum: int) -> None:
        """Record one termination signal (callable from a signal handler or the loop)."""
        self.signals += 1
        if self.signals > 1:
            self.log.warning("second signal (%s): stopping now", signal.Signals(signum).name)
            _exit_now(FORCED_EXIT_STATUS)
        self.requested_at = time.monotonic()
        self.log.info("stopping (%s; at most %g s)", signal.Signals(signum).name, self.timeout_s)
        self._start_watchdog()
        if self._event is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    @property
    def requested(self) -> bool:
        return self.signals > 0

    async def wait(self) -> None:
        """Return when a termination signal arrived (installs the handlers if needed)."""
        if self._event is None:
            self.install()
        assert self._event is not None
        await self._event.wait()

    async def unless_stopped(self, action: Awaitable[Any]) -> bool:
        """Run ``action`` (a start-up: connect, load) until it finishes or a stop is
        requested, whichever comes first; a start-up overtaken by the stop is cancelled.

        Returns True when ``action`` finished (its exception, if any, is raised).
        """
        if self._event is None:
            self.install()
        assert self._event is not None
        task = asyncio.ensure_future(action)
        stopped = asyncio.ensure_future(self._event.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if task.done() and not task.cancelled():
            task.result()
            return True
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
        return False

    async def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a stop was requested meanwhile."""
        if self._event is None:
            self.install()
        assert self._event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)
        return self._event.is_set()

    def left(self) -> float:
        """Seconds left of the stop budget (the whole budget before any signal)."""
        if self.requested_at is None:
            return self.timeout_s
        return max(0.0, self.requested_at + self.timeout_s - time.monotonic())

    def steps(self) -> Steps:
        """The :class:`Steps` of this stop, with what is left of the budget."""
        return Steps(self.left(), self.log)

    def _start_watchdog(self) -> None:
        def expire() -> None:
            self.log.error(
                "stop took longer than LOKI_STOP_TIMEOUT_S=%g s: exiting now", self.timeout_s
            )
            _exit_now(FORCED_EXIT_STATUS)

        timer = threading.Timer(self.timeout_s + WATCHDOG_MARGIN_S, expire)
        timer.daemon = True
        timer.start()


def _exit_now(status: int) -> None:
    """End the process without waiting for anything (logs and stdio flushed first)."""
    # exiting now: a handler or stream that fails to flush must not keep the process alive
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def run(
    main: Callable[[Stop], Awaitable[int | None]], timeout_s: float, log: logging.Logger
) -> int:
    """Run ``main(stop)`` on a new event loop and return its exit status (None counts as 0).

    Unlike ``asyncio.run``, the tasks still pending when ``main`` returns are cancelled and
    waited for only while the stop budget lasts (at least 0.2 s); those that would not end
    are named in one DEBUG line and left behind, so the process exits anyway.
    """
    stop = Stop(timeout_s, log)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    status: int | None = None
    try:
        status = loop.run_until_complete(main(stop))
    finally:
        _finish(loop, max(0.2, stop.left()), log)
    return int(status or 0)


def _finish(loop: asyncio.AbstractEventLoop, within_s: float, log: logging.Logger) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=within_s))
    stuck = [t for t in pending if not t.done()]
    for task in pending:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a failure while cancelling is not news at exit
    if stuck:
        log.debug("left %d task(s) behind at exit: %s", len(stuck), [_name(t) for t in stuck])
        # Their destruction at interpreter exit is expected: say nothing about it.
        loop.set_exception_handler(lambda _loop, _ctx: None)
        return
    with contextlib.suppress(Exception):  # at exit: a generator failing to close is no news
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), 0.5))
    loop.close()


def _name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    qualname = getattr(coro, "__qualname__", None) if inspect.iscoroutine(coro) else None
    return f"{task.get_name()}:{qualname}" if qualname else task.get_name()
