"""A service's console shows Loki's own lines: FastStream's per-message "Received" /
"Processed" lines are DEBUG (issue 15), and a broken connection is one line."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from loki_shared.logsetup import setup_logging
from loki_shared.nats import make_broker


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    """setup_logging replaces the root handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def one_request(nats_url: str) -> None:
    broker = make_broker(nats_url, "logtest")

    @broker.subscriber("loki.test.logs")
    async def answer(body: dict) -> dict:
        return {"ok": True}

    await broker.start()
    try:
        await broker.config.connection_state.connection.request("loki.test.logs", b"{}", timeout=5)
    finally:
        await broker.stop()


@pytest.mark.parametrize(("level", "shown"), [("INFO", False), ("DEBUG", True)])
async def test_per_message_lines_are_debug(
    nats_url: str, capfd: pytest.CaptureFixture[str], level: str, shown: bool
) -> None:
    setup_logging("logtest", level)
    await one_request(nats_url)
    err = capfd.readouterr().err
    assert ("loki.test.logs: Received" in err) is shown, err
    assert ("loki.test.logs: Processed" in err) is shown, err
    if shown:  # at DEBUG, through the service's own format and logger
        assert "DEBUG logtest loki.logtest.nats: loki.test.logs: Received" in err, err


def test_a_broken_connection_is_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    from loki_shared.logsetup import bus_logger

    setup_logging("logtest", "INFO")
    try:
        raise ConnectionResetError("Connection lost")
    except ConnectionResetError as exc:
        bus_logger("logtest").log(logging.WARNING, "Connection broken with %r", exc, exc_info=exc)
    err = capfd.readouterr().err
    assert "Connection broken with ConnectionResetError" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
