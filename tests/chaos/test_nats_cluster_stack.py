"""Issue 44: the whole stack (``loki up``'s processes, the supervisor following the scripted
engine) on a three-node NATS cluster with JetStream replicas 3 — every service given the
three URLs and its own NATS user — and the node leading the perf ring killed in the middle of a
turn: the turn ends, the conversation reads back whole, the next turn runs, and no perf record
is lost (one per engine request of the conversation, in the stream, each once)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from loki_cli.stack import SERVICES, Stack, StackConfig
from loki_shared import permissions, servers, subjects
from tests.conftest import AUTH, plain_url, start_nats_cluster
from tests.e2e.conftest import StackClient
from tests.fakes.fake_engine import FakeEngine, text_reply

SECRET = "nats-cluster-stack-secret-key-0123456789ab"
ANSWER = "An answer streamed slowly enough for a NATS node to die under it."


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, servers.RunningServer]]:
    nodes = start_nats_cluster(tmp_path)
    yield nodes
    for node in nodes.values():
        node.stop(grace=2)


@pytest.fixture
def fake_engine() -> Iterator[FakeEngine]:
    with FakeEngine() as engine:
        yield engine


@pytest.fixture
def cluster_stack(
    tmp_path: Path, cluster: dict[str, servers.RunningServer], fake_engine: FakeEngine
) -> Iterator[Stack]:
    logins = {
        name: {"LOKI_NATS_USER": name, "LOKI_NATS_PASSWORD": AUTH.creds.nats[name]}
        for name, _ in SERVICES
    }
    stack = Stack(
        StackConfig(
            home=tmp_path / "home",
            web_port=servers.free_port(),
            nats_url=",".join(plain_url(node.url) for node in cluster.values()),
            nats_login={
                "user": "cli",
                "password": AUTH.creds.nats["cli"],
                "inbox_prefix": permissions.inbox_prefix("cli"),
            },
            echo=False,
            env={
                "LOKI_ENGINE_URL": fake_engine.url,
                "LOKI_SECRET_KEY": SECRET,
                "LOKI_JETSTREAM_REPLICAS": "3",
            },
            service_env=logins,
        ),
        log=lambda line: None,
    )
    stack.start()
    try:
        stack.wait_engine_ready(timeout=90)
        yield stack
    finally:
        stack.stop()


async def _perf(url: str, conversation: str | None = None) -> tuple[str | None, list[dict]]:
    """The perf ring's leader and its records (of ``conversation`` when given), read as the
    harness's user through the cluster."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.STREAM_PERF)
        assert info.config.num_replicas == 3
        records = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            data = json.loads((await js.get_msg(subjects.STREAM_PERF, seq)).data)
            if conversation is None or data.get("conversation") == conversation:
                records.append(data)
        return (info.cluster.leader if info.cluster else None), records
    finally:
        await nc.close()


def _records(urls: str, conversation: str, want: int, timeout: float = 40.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, records = asyncio.run(_perf(urls, conversation))
        except Exception:  # noqa: BLE001 - the stream is electing its leader: asked again
            records = []
        if len(records) >= want or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_node_killed_mid_turn_the_turn_ends_and_no_perf_record_is_lost(
    cluster_stack: Stack, cluster: dict[str, servers.RunningServer], fake_engine: FakeEngine
) -> None:
    client = StackClient(f"http://127.0.0.1:{cluster_stack.config.web_port}")
    harness = ",".join(node.url for node in cluster.values())  # the `test` user's login

    # a first turn declares the perf ring (three copies); its leader is the node to kill
    fake_engine.push(text_reply("Warm."))
    cid = client.send("Warm up.")
    first = client.events(cid, until_turn_ends=1, timeout=60)
    assert len(_records(harness, cid, 1)) == 1
    leader, _ = asyncio.run(_perf(harness))
    assert leader in cluster

    fake_engine.push(text_reply(ANSWER, pieces=16, delay_s=0.25), text_reply("After."))
    client.send("Now slowly.", cid)
    fake_engine.wait_requests(2, timeout=30)  # the second turn is streaming
    cluster[leader].process.kill()

    events = client.events(cid, last_event_id=first[-1]["seq"], until_turn_ends=1, timeout=90)
    assert events[-1]["choices"][0]["finish_reason"] == "stop", events[-1]
    client.send("And after the kill?", cid)
    more = client.events(cid, last_event_id=events[-1]["seq"], until_turn_ends=1, timeout=90)
    assert more[-1]["choices"][0]["finish_reason"] == "stop", more[-1]
    state = client.wait_idle(cid, timeout=60)
    texts = [m.get("content") for m in state["messages"][1:]]
    assert texts == [
        "Warm up.", "Warm.", "Now slowly.", ANSWER, "And after the kill?", "After.",
    ], texts  # fmt: skip

    alive = ",".join(node.url for name, node in cluster.items() if name != leader)
    records = _records(alive, cid, 3)
    # one record per engine request of the conversation, none lost, none twice
    assert len(records) == len(fake_engine.requests) == 3, records
    new_leader, _ = asyncio.run(_perf(alive))
    assert new_leader not in (None, leader)
