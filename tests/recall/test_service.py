"""The recall service over real NATS and Redis: archive, reads, listing, the tools, the global
sequence under concurrency, restarts, and the real ``python -m loki_recall`` process."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats

from loki_recall.archive import BLOCKS_KEY
from loki_recall.service import RecallService
from loki_recall.text import keywords
from loki_recall.tools import reference_search
from loki_shared import subjects
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    BlockReply,
    BlockRequest,
    BlocksReply,
    BlocksRequest,
    ToolReply,
    ToolRequest,
)
from tests.recall.recall_helpers import Client, recall_settings


async def archive(
    client: Client,
    content: str,
    label: str = "",
    role: str = "tool",
    tool_name: str | None = "read_file",
    conversation: str | None = "c1",
) -> int:
    reply = await client.ask(
        subjects.RECALL_ARCHIVE,
        ArchiveRequest(
            label=label, role=role, tool_name=tool_name, content=content, conversation=conversation
        ),
        ArchiveReply,
    )
    assert reply.error is None, reply.error
    assert reply.id == f"r{reply.seq}"
    return reply.seq


async def tool(client: Client, name: str, arguments: object) -> str:
    reply = await client.ask(
        subjects.RECALL_TOOL, ToolRequest(name=name, arguments=arguments), ToolReply
    )
    assert reply.error is None, reply.error
    return reply.text


async def list_blocks(client: Client, max_bytes: int = 512_000) -> list:
    out, after = [], 0
    while after is not None:
        page = await client.ask(
            subjects.RECALL_BLOCKS, BlocksRequest(after=after, max_bytes=max_bytes), BlocksReply
        )
        assert page.error is None
        out.extend(page.blocks)
        after = page.next_after
    return out


async def test_archive_and_read_back_verbatim(recall: RecallService, client: Client) -> None:
    contents = ["line 1\r\nline 2\n\n  ", "", "émoji 🎉 \u0000 nul \ud7ff", "x" * 100_000]
    seqs = [await archive(client, c, label=f"read_file: {i}") for i, c in enumerate(contents)]
    assert seqs == [1, 2, 3, 4]
    for seq, content in zip(seqs, contents):
        reply = await client.ask(subjects.RECALL_BLOCK, BlockRequest(seq=seq), BlockReply)
        assert reply.block is not None and reply.block.content == content
        assert reply.block.conversation == "c1" and reply.block.tool_name == "read_file"
        assert reply.block.created > time.time() - 60
    assert await tool(client, "recall", {"id": "r2"}) == "[r2 · read_file: 1 · verbatim]\n"
    for seq in (0, 5, 2**64, -1):
        reply = await client.ask(subjects.RECALL_BLOCK, BlockRequest(seq=seq), BlockReply)
        assert reply.error is None and reply.block is None
    # An empty label is built with the label rule.
    seq = await archive(client, "\n  first line  \nrest", label="", tool_name="web_fetch")
    block = await recall.archive.get(seq)
    assert block is not None and block.label == "web_fetch: first line"
    # Sealed at rest: the content is not readable in Redis.
    raw = await recall.redis.hget(BLOCKS_KEY, "1")
    assert raw is not None and b"line 1" not in raw


async def test_blocks_pages_in_seq_order(recall: RecallService, client: Client) -> None:
    for i in range(30):
        await archive(client, f"block {i} " + "z" * 300)
    small = await list_blocks(client, max_bytes=1500)
    assert [b.seq for b in small] == list(range(1, 31))
    assert [b.seq for b in await list_blocks(client)] == list(range(1, 31))
    page = await client.ask(subjects.RECALL_BLOCKS, BlocksRequest(after=28), BlocksReply)
    assert [b.seq for b in page.blocks] == [29, 30] and page.next_after is None


async def test_unknown_tool_is_an_error_reply(recall: RecallService, client: Client) -> None:
    reply = await client.ask(
        subjects.RECALL_TOOL, ToolRequest(name="shell", arguments={}), ToolReply
    )
    assert reply.error is not None and reply.error.type == "invalid_request"
    for subject in (subjects.RECALL_TOOL, subjects.RECALL_ARCHIVE, subjects.RECALL_BLOCK):
        msg = await client.nc.request(subject, b'{"nonsense": true', timeout=10)
        reply = ToolReply.model_validate_json(msg.data)
        assert reply.error is not None and reply.error.type == "invalid_request"


async def test_indexed_search_equals_full_scan(recall: RecallService, client: Client) -> None:
    rng = random.Random(7)
    vocab = [
        "nginx",
        "Config",
        "ÉTÉ",
        "été",
        "İstanbul",
        "ΣΟΦΙΑ",
        "port_80",
        "café",
        "Straße",
        "timeout",
        "proxy",
        "fn",
        "ab",
        "x",
        "Ünïcode",
        "tab\tsep",
        "<b>&amp;</b>",
        "ÿes",
    ]
    for _ in range(120):
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 25)))
        label = "tool: " + " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 3)))
        await archive(client, text, label=label)
    blocks = await list_blocks(client)
    queries = [
        "nginx",
        "été ETE",
        "istanbul",
        "σοφια",
        "port",
        "80",
        "or",
        "ab fn",
        "amp",
        "b",
        "straße stra",
        "x ab",
        "COnfig proxy timeout",
        "ÿe",
        "nic",
    ]
    for q in queries:
        for limit in (1, 5, 20):
            want = reference_search(blocks, keywords(q), limit)
            got = await recall.archive.search(keywords(q), limit)
            assert [b.seq for b in got] == [b.seq for b in want], (q, limit)
            text = await tool(client, "recall_search", {"query": q, "limit": limit})
            assert text.count("\n- r") == len(want) if want else text.startswith("[no")


async def test_global_sequence_under_concurrency(
    nats_url: str, redis_db: str, tmp_path: Path
) -> None:
    """200 concurrent archives from 4 connections, served by 2 recall instances: 200
    distinct ids, exactly 1..200, each stored under its own seq, each instance lists all."""
    services = [
        RecallService(recall_settings(nats_url, redis_db, tmp_path / f"h{i}")) for i in range(2)
    ]
    for s in services:
        await s.start()
    conns = [Client(await nats.connect(nats_url)) for _ in range(4)]
    try:
        seqs = await asyncio.gather(
            *(
                archive(conns[i % 4], f"concurrent block {i}", label=f"tool: {i}")
                for i in range(200)
            )
        )
        assert len(set(seqs)) == 200 and sorted(seqs) == list(range(1, 201))
        for i, seq in enumerate(seqs):
            block = await services[i % 2].archive.get(seq)
            assert block is not None and block.content == f"concurrent block {i}"
        # each instance catches up with the blocks the other stored
        for s in services:
            hits = await s.archive.search({"concurrent"}, 20)
            assert [b.seq for b in hits] == list(range(200, 180, -1))
            assert s.archive.stats()["blocks"] == 200
        # later archives keep increasing
        assert await archive(conns[0], "after") == 201
    finally:
        for c in conns:
            await c.nc.drain()
        for s in services:
            await s.stop()


async def test_restart_on_existing_archive(
    nats_url: str, redis_db: str, tmp_path: Path, client: Client
) -> None:
    settings = recall_settings(nats_url, redis_db, tmp_path / "home")
    first = RecallService(settings)
    await first.start()
    for i in range(20):
        await archive(client, f"persisted {i} kiwi")
    await first.stop()
    snap = tmp_path / "home" / "recall-index.snap"
    assert snap.exists() and b"kiwi" not in snap.read_bytes()  # sealed
    second = RecallService(settings)
    await second.start()
    try:
        assert second.archive.stats()["blocks"] == 20
        text = await tool(client, "recall_search", {"query": "kiwi", "limit": 2})
        assert text.splitlines()[1] == "- r20 · read_file: persisted 19 kiwi"
        assert await archive(client, "next kiwi") == 21
        text = await tool(client, "recall_search", {"query": "kiwi", "limit": 2})
        assert text.splitlines()[1] == "- r21 · read_file: next kiwi"
    finally:
        await second.stop()
    # A snapshot never serves another archive: after Redis is emptied, nothing is found.
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_db)
    await r.flushall()
    await r.aclose()
    third = RecallService(settings)
    await third.start()
    try:
        assert third.archive.stats()["blocks"] == 0
        assert await tool(client, "recall_search", {"query": "kiwi"}) == (
            "[no archived block matches]"
        )
    finally:
        await third.stop()


def _wait_answering(nats_url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    async def probe() -> None:
        nc = await nats.connect(nats_url)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert proc.poll() is None, "recall service exited"
                try:
                    await nc.request(subjects.RECALL_BLOCK, b'{"seq": 1}', timeout=0.5)
                    return
                except Exception:  # noqa: BLE001 - not serving yet
                    await asyncio.sleep(0.1)
            raise AssertionError("recall service did not answer")
        finally:
            await nc.drain()

    asyncio.run(probe())


def test_real_process_serves_restarts_and_stops(
    service_env: dict[str, str], redis_db: str, nats_url: str
) -> None:
    """``python -m loki_recall`` as a container runs it: serves, stops on SIGTERM with exit 0,
    and a new process serves the same archive."""

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "loki_recall"],
            env=service_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    async def scenario(before: bool) -> str:
        nc = await nats.connect(nats_url)
        c = Client(nc)
        try:
            if before:
                await archive(c, "the quick brown fox", label="user: fox")
            return await tool(c, "recall", {"id": "r1"})
        finally:
            await nc.drain()

    proc = start()
    try:
        _wait_answering(nats_url, proc)
        assert asyncio.run(scenario(True)) == "[r1 · user: fox · verbatim]\nthe quick brown fox"
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    assert "serving" in out and "the quick brown fox" not in out
    proc = start()
    try:
        _wait_answering(nats_url, proc)
        assert asyncio.run(scenario(False)).endswith("\nthe quick brown fox")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
