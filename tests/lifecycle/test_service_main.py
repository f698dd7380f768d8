"""The one service runner (loki_shared.service_main): a start-up that raises is followed by
the service's stop (nothing it opened outlives the process), then the error is raised.
The signal paths (serve until SIGTERM, stop within the budget) are the process tests':
tests/lifecycle/test_stop.py, tests/memory/test_process.py, tests/recall/test_service.py."""

from __future__ import annotations

import logging

import pytest

from loki_shared import lifecycle, service_main


class Recorder:
    """A service that records what the runner asked of it."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.budget: float | None = None

    async def start(self) -> None:
        self.calls.append("start")
        if self.fail:
            raise ConnectionRefusedError("NATS not there")

    async def stop(self, steps: lifecycle.Steps) -> None:
        self.calls.append("stop")
        self.budget = steps.left()


async def test_a_start_that_raises_is_stopped_then_raised() -> None:
    service = Recorder(fail=True)
    stop = lifecycle.Stop(4.0, logging.getLogger("service-main-test"))
    with pytest.raises(ConnectionRefusedError):
        await service_main.serve(stop, service)
    assert service.calls == ["start", "stop"]
    # no signal came: the stop has the whole budget
    assert service.budget is not None and 3.5 < service.budget <= 4.0
