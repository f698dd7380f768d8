"""``loki_shared.nats.publish_durable``: into a JetStream stream, created when missing, the
publish retried once with the same headers; a message that cannot be stored is logged, never
raised (real NATS, and one stand-in for a stream that stays missing)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig

from loki_shared.nats import publish_durable

LOG = logging.getLogger("loki.test.durable")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.drain()


async def test_a_missing_stream_is_created_and_a_retry_stored_once(nc: NATS) -> None:
    name = f"TEST_DURABLE_{uuid.uuid4().hex[:8].upper()}"
    subject = f"test.durable.{name.lower()}"
    config = StreamConfig(name=name, subjects=[subject], max_msgs=10)
    js = nc.jetstream()
    try:
        headers = {"Nats-Msg-Id": "one"}
        assert await publish_durable(js, subject, b"a", config, what="t", log=LOG, headers=headers)
        assert await publish_durable(js, subject, b"a", config, what="t", log=LOG, headers=headers)
        assert await publish_durable(js, subject, b"b", config, what="t", log=LOG)
        info = await js.stream_info(name)
        assert info.state.messages == 2  # the second "one" was a duplicate
    finally:
        await js.delete_stream(name)


class _NoStream:
    """A JetStream context whose stream never appears (and, when told, cannot be made)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.published = 0

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        self.published += 1
        raise nats.js.errors.NoStreamResponseError

    async def add_stream(self, config: StreamConfig) -> None:
        if self.refuse:
            raise nats.errors.TimeoutError


async def test_a_stream_still_missing_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOG.name)
    config = StreamConfig(name="NOPE", subjects=["nope"])
    missing, refused = _NoStream(), _NoStream(refuse=True)
    assert not await publish_durable(missing, "nope", b"x", config, what="event", log=LOG)  # type: ignore[arg-type]
    assert not await publish_durable(refused, "nope", b"x", config, what="event", log=LOG)  # type: ignore[arg-type]
    assert (missing.published, refused.published) == (2, 1)
    assert [r.getMessage() for r in caplog.records if r.name == LOG.name] == [
        "event not published: no NOPE stream",
        "event not published: cannot create stream: nats: timeout",
    ]
