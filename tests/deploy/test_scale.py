"""Issue 9, past one box: what a scaled compose deployment (``--scale chat=2 --scale
gateway=2 --scale recall=2``) does, shown with processes on this machine.

One NATS (JetStream, with its monitoring port to see who served what), one Redis, one engine
supervisor with the real llama-server, one perf service, and two instances each of chat,
gateway and recall sharing one ``LOKI_HOME`` (one volume in compose: one sealing key file).

- two gateways and two chat instances serve one conversation without a double turn (the
  conversation lock: the owner runs the turn, the other instance forwards to it);
- a chat instance killed mid-turn loses nothing persisted, and the other takes over;
- two recall replicas hand out one sequence of block ids, and each serves the other's blocks.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import pytest
import redis

from loki_shared import servers, subjects
from loki_shared.messages.chat import ReplayReply, ReplayRequest
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    BlockReply,
    BlockRequest,
    ToolReply,
    ToolRequest,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LOCK_TTL_S = 5


#: python module -> its NATS user (loki_shared.permissions)
USERS = {
    "loki_supervisor": "engine-supervisor",
    "loki_recall": "recall",
    "loki_perf": "perf",
    "loki_chat": "chat",
    "loki_gateway": "gateway",
}


@dataclass
class Cluster:
    nats_url: str
    monitor: str
    redis_url: str
    home: Path
    env: dict[str, str]
    procs: dict[str, servers.ManagedProcess] = field(default_factory=dict)
    web_ports: dict[str, int] = field(default_factory=dict)

    def start(self, name: str, module: str, **extra: str) -> servers.ManagedProcess:
        from tests.conftest import login_env

        env = {**self.env, **login_env(USERS[module]), **extra}
        proc = servers.ManagedProcess(name, [sys.executable, "-m", module], env=env).start()
        self.procs[name] = proc
        return proc

    def gateway(self, name: str) -> str:
        return f"http://127.0.0.1:{self.web_ports[name]}"

    def connections(self, client_name: str) -> list[dict]:
        """NATS monitoring: the connections named ``client_name`` (``in_msgs`` = messages
        the client published, replies included)."""
        r = httpx.get(f"{self.monitor}/connz", params={"limit": 1024}, timeout=5)
        r.raise_for_status()
        return [c for c in r.json()["connections"] if c.get("name") == client_name]


async def _engine_ready(nats_url: str, timeout: float) -> dict:
    nc = await nats.connect(nats_url)
    try:
        deadline = time.monotonic() + timeout
        info: dict = {}
        while time.monotonic() < deadline:
            try:
                msg = await nc.request(subjects.ENGINE_INFO, b"{}", timeout=2)
                info = json.loads(msg.data)
                if info.get("state") == "ready":
                    return info
            except Exception:  # noqa: BLE001 - supervisor not subscribed yet
                pass
            await asyncio.sleep(0.5)
        raise AssertionError(f"engine not ready: {info}")
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from tests.conftest import plain_url, start_nats, start_redis

    root = tmp_path_factory.mktemp("scale")
    mport = servers.free_port()
    nats_server = start_nats(root / "nats", extra=["-m", str(mport)])
    nats_proc = nats_server.process
    redis_server = start_redis(root / "redis")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        # each process logs in as its own service (Cluster.start): the URLs carry no login
        LOKI_NATS_URL=plain_url(nats_server.url),
        LOKI_REDIS_URL=plain_url(redis_server.url),
        LOKI_HOME=str(root / "home"),  # shared, like the compose volume: one key file
        LOKI_LOCK_TTL_S=str(LOCK_TTL_S),
        LOKI_ENGINE_PORT=str(servers.free_port()),
        LOKI_PERF_METRICS_PORT="0",
        LOKI_CTX="4096",
        # Bounded replies: after the kill the interrupted "count to 300" is sent again with the
        # next message, and the tiny model must not count through the whole window.
        LOKI_MAX_TOKENS="96",
        # Greedy: "count from 1 to 300" then counts (a sampled reply could stop after a few
        # tokens, before the kill the mid-turn test needs)
        LOKI_TEMPERATURE="0",
        PYTHONUNBUFFERED="1",
    )
    c = Cluster(
        nats_server.url,
        f"http://127.0.0.1:{mport}",
        redis_server.url,
        root / "home",
        env,
    )
    try:
        c.start("engine-supervisor", "loki_supervisor")
        for name in ("recall-1", "recall-2"):
            c.start(name, "loki_recall")
        c.start("perf", "loki_perf")
        for name in ("chat-a", "chat-b"):
            c.start(name, "loki_chat", LOKI_INSTANCE_ID=name)
        for name in ("gateway-1", "gateway-2"):
            c.web_ports[name] = servers.free_port()
            c.start(
                name,
                "loki_gateway",
                LOKI_WEB_PORT=str(c.web_ports[name]),
                LOKI_WEB_HOST="127.0.0.1",
            )
        for name, p in c.web_ports.items():
            c.procs[name].wait_port(p, timeout=60)
        asyncio.run(_engine_ready(c.nats_url, 240))
        yield c
    finally:
        for proc in reversed(list(c.procs.values())):
            proc.stop()
        redis_server.process.stop()
        nats_proc.stop()


# --- helpers -----------------------------------------------------------------------------------
async def send(http: httpx.AsyncClient, content: str, conversation: str | None = None) -> str:
    body: dict = {"content": content}
    if conversation:
        body["conversation"] = conversation
    for _ in range(40):
        r = await http.post("/api/chat/send", json=body)
        if r.status_code == 202:
            return r.json()["conversation"]
        await asyncio.sleep(0.5)  # 503 while an owner's lock is waited out
    raise AssertionError(f"send refused: {r.status_code} {r.text}")


async def state(http: httpx.AsyncClient, cid: str) -> dict:
    for _ in range(60):
        r = await http.get("/api/chat/state", params={"conversation": cid})
        if r.status_code == 200:
            return r.json()
        await asyncio.sleep(0.5)
    raise AssertionError(f"state refused: {r.status_code} {r.text}")


async def wait_idle(http: httpx.AsyncClient, cid: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await state(http, cid)
        if not st.get("generating") and not st.get("queued"):
            return st
        await asyncio.sleep(0.3)
    raise AssertionError("the conversation did not become idle")


async def replay(nc: nats.aio.client.Client, cid: str) -> list[dict]:
    events: list[dict] = []
    after = 0
    while True:
        msg = await nc.request(
            subjects.CHAT_REPLAY,
            ReplayRequest(conversation=cid, after_seq=after).model_dump_json().encode(),
            timeout=10,
        )
        reply = ReplayReply.model_validate_json(msg.data)
        assert reply.error is None, reply.error
        events += [e.model_dump() for e in reply.events]
        if not reply.more or not reply.events:
            return events
        after = reply.events[-1].seq


def user_contents(events: list[dict]) -> list[str]:
    return [e["delta"]["content"] for e in events if (e.get("loki") or {}).get("event") == "user"]


def check_log(events: list[dict], contiguous: bool = True) -> None:
    """One display log, one writer at a time: seqs strictly increasing (and without a gap when
    ``contiguous``: a merged event of a compacted turn stands for the seqs from its
    ``merged_from`` to its own), every turn ends once, and no assistant output outside a turn.

    After a crash the log may skip seqs: events the dead owner published live but never
    persisted are dropped, and their seqs are not reused (a client that saw them live must
    never get another event under the same id)."""
    seqs = [e["seq"] for e in events]
    assert all(a < b for a, b in zip(seqs, seqs[1:])), seqs
    if contiguous:
        starts = [e.get("merged_from") or e["seq"] for e in events]
        assert all(start == prev + 1 for prev, start in zip(seqs, starts[1:])), seqs
    open_turn = False
    pending_user = False
    for e in events:
        kind = (e.get("loki") or {}).get("event")
        if kind == "user":
            pending_user = True
        elif kind == "turn_end":
            assert open_turn or pending_user, f"turn_end {e['seq']} without a turn"
            open_turn = pending_user = False
        elif e["delta"].get("role") == "assistant" or e["delta"].get("content"):
            assert open_turn or pending_user, f"assistant output {e['seq']} outside a turn"
            open_turn, pending_user = True, False
    assert not open_turn, "a turn never ended"


# --- tests -------------------------------------------------------------------------------------
async def test_two_gateways_two_chats_one_conversation_no_double_turn(cluster: Cluster) -> None:
    nc = await nats.connect(cluster.nats_url)
    forwards: list[str] = []

    async def on_forward(msg: nats.aio.msg.Msg) -> None:
        forwards.append(msg.subject)

    await nc.subscribe(f"{subjects.CHAT_INSTANCE_PREFIX}.>", cb=on_forward)
    g1 = httpx.AsyncClient(base_url=cluster.gateway("gateway-1"), timeout=30)
    g2 = httpx.AsyncClient(base_url=cluster.gateway("gateway-2"), timeout=30)
    try:
        cid = await send(g1, "Reply with one word: one")
        contents = [
            "Reply with one word: two",
            "Reply with one word: three",
            "Reply with one word: four",
            "Reply with one word: five",
        ]
        # Sends through both gateways at once, and state reads that land on either chat
        # instance (NATS queue group): the non-owner forwards to the owner.
        await asyncio.gather(
            *(send((g2, g1)[i % 2], c, cid) for i, c in enumerate(contents)),
            *(state((g1, g2)[i % 2], cid) for i in range(12)),
        )
        final = await wait_idle(g2, cid)
        final_1 = await wait_idle(g1, cid)
        assert final_1["messages"] == final["messages"]
        events = await replay(nc, cid)
    finally:
        await g1.aclose()
        await g2.aclose()
        await nc.close()

    sent = ["Reply with one word: one", *contents]
    assert sorted(user_contents(events)) == sorted(sent), user_contents(events)
    check_log(events)
    turn_ends = [e for e in events if (e.get("loki") or {}).get("event") == "turn_end"]
    assert 1 <= len(turn_ends) <= len(sent)
    roles = [m["role"] for m in final["messages"] if m["role"] != "system"]
    # A double turn would leave two answers in a row (queued sends may leave user messages
    # in a row: the chat joins them into one when it builds the request).
    assert all(not (a == b == "assistant") for a, b in zip(roles, roles[1:])), roles
    assert roles[0] == "user" and roles[-1] == "assistant", roles
    text = "\n".join(m["content"] or "" for m in final["messages"] if m["role"] == "user")
    for c in sent:
        assert text.count(c) == 1, (c, text)
    # Both chat instances took part: requests reached the non-owner and were forwarded.
    assert forwards, "no request was forwarded between the chat instances"
    owners = {s.rsplit(".", 1)[1] for s in forwards}
    assert owners <= {"chat-a", "chat-b"}, owners


async def test_chat_killed_mid_turn_loses_nothing_persisted(cluster: Cluster) -> None:
    nc = await nats.connect(cluster.nats_url)
    g1 = httpx.AsyncClient(base_url=cluster.gateway("gateway-1"), timeout=30)
    g2 = httpx.AsyncClient(base_url=cluster.gateway("gateway-2"), timeout=30)
    rdb = redis.Redis.from_url(cluster.redis_url)
    try:
        cid = await send(g1, "Reply with one word: pong")
        before = (await wait_idle(g1, cid))["messages"]
        assert [m["role"] for m in before][-2:] == ["user", "assistant"]

        deltas: list[dict] = []
        ended: list[dict] = []

        async def on_event(msg: nats.aio.msg.Msg) -> None:
            data = json.loads(msg.data)
            if data.get("delta", {}).get("content") and (data.get("loki") is None):
                deltas.append(data)
            if (data.get("loki") or {}).get("event") == "turn_end":
                ended.append(data)

        await nc.subscribe(subjects.chat_events(cid), cb=on_event)
        long_prompt = "Count from 1 to 300, one number per line, nothing else."
        await send(g2, long_prompt, cid)
        deadline = time.monotonic() + 120
        while len(deltas) < 2:
            assert time.monotonic() < deadline, "the turn did not stream"
            await asyncio.sleep(0.05)
        from loki_chat.store import lock_key

        owner = (rdb.get(lock_key(cid)) or b"").decode().split("|")[0]
        assert owner in ("chat-a", "chat-b"), owner
        assert not ended, "the turn ended before the kill: nothing was tested mid-turn"
        cluster.procs[owner].kill()  # SIGKILL mid-turn

        after = (await wait_idle(g2, cid, timeout=120))["messages"]
        assert after[: len(before)] == before, "a persisted message changed or vanished"
        users = [m["content"] for m in after if m["role"] == "user"]
        assert users.count(long_prompt) == 1, users
        # The survivor serves the conversation on: a new turn completes.
        await send(g1, "Reply with one word: ok", cid)
        final = await wait_idle(g1, cid)
        roles = [m["role"] for m in final["messages"] if m["role"] != "system"]
        assert roles[-1] == "assistant"
        assert all(not (a == b == "assistant") for a, b in zip(roles, roles[1:])), roles
        check_log(await replay(nc, cid), contiguous=False)
        survivor = ({"chat-a", "chat-b"} - {owner}).pop()
        new_owner = (rdb.get(lock_key(cid)) or b"").decode().split("|")[0]
        assert new_owner == survivor
    finally:
        await g1.aclose()
        await g2.aclose()
        await nc.close()
        rdb.close()
    # Bring the killed instance back for the tests after this one.
    cluster.start(owner, "loki_chat", LOKI_INSTANCE_ID=owner)


async def test_recall_two_replicas_one_sequence(cluster: Cluster) -> None:
    nc = await nats.connect(cluster.nats_url)
    try:
        before = {c["cid"]: c["in_msgs"] for c in cluster.connections("loki-recall")}
        assert len(before) == 2, before
        n = 30
        marker = f"zanzibar{os.getpid()}"

        async def archive(i: int) -> ArchiveReply:
            req = ArchiveRequest(
                label="",
                role="tool",
                tool_name="shell",
                content=f"block {i} {marker}{i} " + "x" * 200,
            )
            msg = await nc.request(
                subjects.RECALL_ARCHIVE, req.model_dump_json().encode(), timeout=20
            )
            reply = ArchiveReply.model_validate_json(msg.data)
            assert reply.error is None, reply.error
            return reply

        replies = await asyncio.gather(*(archive(i) for i in range(n)))
        seqs = sorted(r.seq for r in replies)
        assert len(set(seqs)) == n and seqs[-1] - seqs[0] == n - 1, seqs
        assert all(r.id == f"r{r.seq}" for r in replies)
        after = {c["cid"]: c["in_msgs"] for c in cluster.connections("loki-recall")}
        served = {cid: after[cid] - before[cid] for cid in before}
        assert all(v > 0 for v in served.values()), f"one replica served nothing: {served}"

        # Every block reads back, whichever replica answers.
        by_seq = {r.seq: i for i, r in enumerate(replies)}
        for seq, i in by_seq.items():
            msg = await nc.request(
                subjects.RECALL_BLOCK, BlockRequest(seq=seq).model_dump_json().encode(), timeout=10
            )
            block = BlockReply.model_validate_json(msg.data).block
            assert block and f"{marker}{i} " in block.content, (seq, block)
        # Both replicas' search indexes know the blocks the other one archived.
        for i in range(0, n, 3):
            req = ToolRequest(name="recall_search", arguments={"query": f"{marker}{i}"})
            msg = await nc.request(subjects.RECALL_TOOL, req.model_dump_json().encode(), timeout=10)
            reply = ToolReply.model_validate_json(msg.data)
            seq = next(r.seq for r in replies if by_seq[r.seq] == i)
            assert f"r{seq}" in reply.text, (i, reply.text[:300])
    finally:
        await nc.close()
