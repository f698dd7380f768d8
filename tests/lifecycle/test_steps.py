"""The stop steps of loki_shared.lifecycle: each bounded, never raising, one line when it
gives up — whatever the step does (finishes, fails, hangs, ignores its cancellation, or is
cancelled by its own library)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from loki_shared.lifecycle import Steps


@pytest.fixture
def steps(caplog: pytest.LogCaptureFixture) -> Steps:
    caplog.set_level(logging.WARNING, logger="steps-test")
    return Steps(5.0, logging.getLogger("steps-test"))


async def test_a_step_that_finishes(steps: Steps, caplog: pytest.LogCaptureFixture) -> None:
    done: list[int] = []

    async def work() -> None:
        done.append(1)

    assert await steps.run("work", work) and done == [1] and not caplog.records


async def test_a_step_that_fails_is_one_line(
    steps: Steps, caplog: pytest.LogCaptureFixture
) -> None:
    async def fail() -> None:
        raise ConnectionRefusedError("Connect call failed\nsecond line")

    assert not await steps.run("close Redis", fail)
    [record] = caplog.records
    assert record.getMessage() == (
        "stop: could not close Redis (ConnectionRefusedError: Connect call failed)"
    )


async def test_a_step_that_hangs_and_ignores_its_cancellation_is_left_behind(
    steps: Steps, caplog: pytest.LogCaptureFixture
) -> None:
    stubborn_for = asyncio.Event()

    async def stubborn() -> None:
        while not stubborn_for.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # what a reconnect loop that lost its cancellation does

    t0 = time.monotonic()
    assert not await steps.run("drain the NATS connection", stubborn, limit_s=0.3)
    assert time.monotonic() - t0 < 1.0
    assert "no answer within 0.3 s" in caplog.records[0].getMessage()
    stubborn_for.set()  # let it end, so this test's event loop can close


async def test_a_step_cancelled_by_its_own_library(
    steps: Steps, caplog: pytest.LogCaptureFixture
) -> None:
    async def cancelled_inside() -> None:
        raise asyncio.CancelledError

    assert not await steps.run("close the NATS connection", cancelled_inside)
    assert "(cancelled)" in caplog.records[0].getMessage()


async def test_the_budget_bounds_every_step() -> None:
    steps = Steps(0.8, logging.getLogger("steps-test"))
    t0 = time.monotonic()
    for _ in range(3):
        await steps.run("wait", asyncio.sleep(10), limit_s=5)
    assert time.monotonic() - t0 < 1.0 and steps.failed == ["wait", "wait", "wait"]
