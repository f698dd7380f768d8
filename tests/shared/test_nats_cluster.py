"""NATS as a three-node cluster with JetStream replicas 3 (issue 44), real nats-servers on
loopback: the perf ring is declared with ``LOKI_JETSTREAM_REPLICAS`` copies, the clients take
``LOKI_NATS_URL`` as a comma-separated list, and killing the node that leads the stream (and
that the publisher is connected to) loses no perf record, while requests are answered again
after the client reconnects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from loki_shared import servers, subjects
from loki_shared.credentials import redact, with_userinfo, without_userinfo
from loki_shared.nats import nats_servers, perf_stream, stream_replicas
from loki_shared.perf_publish import build_record, ensure_perf_stream, publish_record
from tests.conftest import start_nats_cluster

N_RECORDS = 60
SUBJECT = "loki.test.cluster.echo"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, servers.RunningServer]]:
    nodes = start_nats_cluster(tmp_path)
    yield nodes
    for node in nodes.values():
        node.stop(grace=2)


def test_urls_and_replicas_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nats_servers("nats://a:4222") == ["nats://a:4222"]
    assert nats_servers(" nats://a:1 , nats://b:2,") == ["nats://a:1", "nats://b:2"]
    with pytest.raises(ValueError, match="LOKI_NATS_URL"):
        nats_servers(" , ")
    # the backup's login goes into every node's URL, and is hidden in every one
    both = with_userinfo("nats://a:1,nats://b:2", "backup", "pw")
    assert nats_servers(both) == ["nats://backup:pw@a:1", "nats://backup:pw@b:2"]
    assert redact(both) == "nats://backup:***@a:1,nats://backup:***@b:2"
    assert without_userinfo(both) == "nats://a:1,nats://b:2"
    # a sentinel URL's commas are inside one URL
    assert with_userinfo("redis+sentinel://h1,h2/loki/0", "chat", "pw") == (
        "redis+sentinel://chat:pw@h1,h2/loki/0"
    )
    monkeypatch.delenv("LOKI_JETSTREAM_REPLICAS", raising=False)
    assert stream_replicas() == 1 and perf_stream().config.num_replicas == 1
    monkeypatch.setenv("LOKI_JETSTREAM_REPLICAS", "3")
    assert perf_stream().config.num_replicas == 3
    monkeypatch.setenv("LOKI_JETSTREAM_REPLICAS", "seven")
    with pytest.raises(ValueError, match="1 to 5"):
        stream_replicas()


async def _ready_stream(url: str, deadline: float) -> str:
    """Declare the perf ring (the cluster elects its meta leader first) and return the
    name of the server leading it."""
    nc = await nats.connect(nats_servers(url))
    try:
        js = nc.jetstream()
        while True:
            try:
                await ensure_perf_stream(js)
                info = await js.stream_info(subjects.STREAM_PERF)
                if info.cluster and info.cluster.leader:
                    assert info.config.num_replicas == 3
                    return info.cluster.leader
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.3)
    finally:
        await nc.close()


async def test_node_killed_loses_no_perf_record(
    cluster: dict[str, servers.RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOKI_JETSTREAM_REPLICAS", "3")
    urls = {name: node.url for name, node in cluster.items()}
    leader = await _ready_stream(",".join(urls.values()), time.monotonic() + 30)
    others = [name for name in urls if name != leader]
    # the publisher is on the leader (first in its list), the responder elsewhere
    publisher = await nats.connect(
        nats_servers(",".join([urls[leader], *(urls[o] for o in others)])),
        dont_randomize=True,
        reconnect_time_wait=0.2,
        max_reconnect_attempts=-1,
    )
    responder = await nats.connect(nats_servers(urls[others[0]]))

    async def echo(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"pong:" + msg.data)

    await responder.subscribe(SUBJECT, cb=echo)
    await responder.flush()
    try:
        assert publisher.connected_url is not None
        assert publisher.connected_url.port == cluster[leader].port
        unanswered_after_kill = 0
        for i in range(N_RECORDS):
            if i == N_RECORDS // 2:
                cluster[leader].process.kill()
            record = build_record(kind="main", conversation=f"c{i}", messages=[])
            # once: publish_record itself retries while the cluster elects a new leader
            assert await publish_record(publisher, record, timeout=1.0), f"record {i} lost"
            deadline = time.monotonic() + 30
            while True:
                try:
                    reply = await publisher.request(SUBJECT, str(i).encode(), timeout=1.0)
                    assert reply.data == f"pong:{i}".encode()
                    break
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                    unanswered_after_kill += 1
                    assert i >= N_RECORDS // 2, "a request went unanswered before the kill"
                    assert time.monotonic() < deadline, f"request {i} never answered"
                    await asyncio.sleep(0.2)
        assert publisher.connected_url.port != cluster[leader].port

        js = publisher.jetstream()
        info = await js.stream_info(subjects.STREAM_PERF)
        assert info.cluster is not None and info.cluster.leader != leader
        seen = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            raw = await js.get_msg(subjects.STREAM_PERF, seq)
            seen.append(json.loads(raw.data)["conversation"])
        # every record is there exactly once (a retry carries the same Nats-Msg-Id)
        assert sorted(seen) == sorted(f"c{i}" for i in range(N_RECORDS))
    finally:
        await publisher.close()
        await responder.close()
