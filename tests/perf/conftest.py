"""Perf test fixtures: a NATS of the perf tests' own (the LOKI_PERF stream is global to a
server, so no other area's records can land in these tests' ring) and a client on it whose
stream and metrics checkpoint are reset before each test."""

from __future__ import annotations

import nats
import pytest

from .perf_helpers import reset_stream, start_own_nats


@pytest.fixture(scope="session")
def perf_nats(tmp_path_factory):
    proc, url = start_own_nats(tmp_path_factory.mktemp("perf-nats"))
    yield url
    proc.stop()


@pytest.fixture
async def nc(perf_nats):
    client = await nats.connect(perf_nats)
    await reset_stream(client)
    yield client
    await client.drain()
