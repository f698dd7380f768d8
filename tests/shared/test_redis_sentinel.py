"""``redis+sentinel://`` (issue 44) against a real master, replica and three sentinels on
loopback: a service's client writes and reads through the sentinels, and after the master is
killed it reaches the promoted replica by itself within a bounded time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loki_shared.redis_client import (
    RedisUrlError,
    parse_sentinel_url,
    redis_client,
    redis_from_url,
    single_address,
)
from loki_shared.settings import LokiSettings
from tests.conftest import AUTH
from tests.shared.sentinel_topology import SentinelTopology

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_url_parts() -> None:
    parsed = parse_sentinel_url(
        "redis+sentinel://chat:p%40ss@h1:26380,h2/loki/3?sentinel_password=s&socket_timeout=2"
    )
    assert parsed.sentinels == [("h1", 26380), ("h2", 26379)]
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == (
        "loki",
        3,
        "chat",
        "p@ss",
    )
    assert parsed.sentinel_options["password"] == "s"
    assert parsed.socket_timeout == 2.0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379", "/<service>/<db>"),
        ("redis+sentinel://h1:x/loki/0", "port 'x'"),
        ("redis+sentinel://h1/loki/zero", "database 'zero'"),
        ("redis+sentinel://h1/loki/0?password=x", "unknown parameter"),
        ("redis+sentinel://,h2/loki/0", "host is empty"),
    ],
)
def test_bad_url_says_what_to_resend(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError, match="the form is|unknown") as err:
        parse_sentinel_url(url)
    assert says in str(err.value)


def test_tools_needing_one_server_refuse_a_sentinel_url() -> None:
    assert single_address("redis://h:6380/0") == ("h", 6380)
    with pytest.raises(RedisUrlError, match="get-master-addr-by-name"):
        single_address("redis+sentinel://h1,h2/loki/0")


async def test_plain_urls_unchanged(redis_db: str) -> None:
    client = redis_from_url(redis_db)
    try:
        await client.set("loki:plain", "1")
        assert await client.get("loki:plain") == b"1"
    finally:
        await client.aclose()


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[SentinelTopology]:
    topo = SentinelTopology.start(tmp_path / "ha")
    yield topo
    topo.stop()


async def test_service_client_follows_a_failover(
    topology: SentinelTopology, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a service's own settings: the sentinel URL and its ACL user, as `loki up` hands them
    monkeypatch.setenv("LOKI_REDIS_URL", topology.url())
    monkeypatch.setenv("LOKI_REDIS_USER", "chat")
    monkeypatch.setenv("LOKI_REDIS_PASSWORD", AUTH.creds.redis["chat"])
    client = redis_client(LokiSettings())
    try:
        await client.set("loki:chat:conv:1", "before")
        assert await client.get("loki:chat:conv:1") == b"before"
        # the ACL still applies through the sentinel: chat cannot touch recall's keys
        with pytest.raises(Exception, match="NOPERM|permission"):
            await client.set("loki:recall:x", "1")
        # replicated before the kill (WAIT, as the harness: Loki itself does not WAIT)
        assert topology.admin(topology.master).wait(1, 2000) == 1
        old_port = topology.master.port
        topology.master.process.kill()

        t0 = time.monotonic()
        value = None
        while time.monotonic() - t0 < 30:
            try:
                value = await client.get("loki:chat:conv:1")
                await client.set("loki:chat:conv:1", "after")
                break
            except Exception:  # noqa: BLE001 - the failover window: retried
                await asyncio.sleep(0.2)
        assert value == b"before", "the promoted replica lacks a write replicated before the kill"
        assert await client.get("loki:chat:conv:1") == b"after"
        assert topology.master_port() == topology.replica.port != old_port
    finally:
        await client.aclose()
