"""The memory key end to end: the gateway's memory routes and MemoryState, the recall service,
and the four reads of a sealed block while locked and after unlock; the recall routes."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis

from loki_gateway.bus import Bus
from loki_gateway.errors import loki_error_handler
from loki_gateway.memory_state import MemoryState
from loki_gateway.routes import memory as memory_routes
from loki_gateway.routes import recall as recall_routes
from loki_recall.archive import BLOCKS_KEY
from loki_recall.service import RecallService
from loki_shared import memkey, subjects
from loki_shared.errors import LokiError
from loki_shared.messages.recall import ArchiveReply, ArchiveRequest, ToolReply, ToolRequest
from tests.recall.recall_helpers import Client, recall_settings


@pytest.fixture
async def gateway(nats_url: str, redis_db: str) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's recall and memory routers on a real bus (the app wiring in miniature)."""
    app = FastAPI()
    app.include_router(recall_routes.router)
    app.include_router(memory_routes.router)
    app.add_exception_handler(LokiError, loki_error_handler)
    app.state.bus = await Bus.connect(nats_url)
    redis = Redis.from_url(redis_db)
    app.state.memory = MemoryState(redis, app.state.bus.client, n=2**12)
    await app.state.memory.start()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway"
    ) as http:
        yield http
    await app.state.memory.stop()
    await app.state.bus.close()
    await redis.aclose()


async def archive(client: Client, content: str, label: str) -> ArchiveReply:
    return await client.ask(
        subjects.RECALL_ARCHIVE,
        ArchiveRequest(label=label, role="tool", content=content),
        ArchiveReply,
    )


async def tool(client: Client, name: str, arguments: dict) -> str:
    reply = await client.ask(
        subjects.RECALL_TOOL, ToolRequest(name=name, arguments=arguments), ToolReply
    )
    assert reply.error is None
    return reply.text


async def four_reads(client: Client, http: httpx.AsyncClient, seq: int) -> tuple:
    recall = await tool(client, "recall", {"id": f"r{seq}"})
    search = await tool(client, "recall_search", {"query": "secret diary"})
    block = await http.get("/api/recall/block", params={"seq": seq})
    blocks = (await http.get("/api/recall/blocks")).json()["blocks"]
    return recall, search, block.status_code, [b["seq"] for b in blocks]


async def eventually(check, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        if await check():
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_locked_memory_hides_sealed_blocks(
    recall: RecallService,
    client: Client,
    gateway: httpx.AsyncClient,
    redis_db: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    http = gateway
    assert (await http.get("/api/memory")).json() == {"state": "off"}
    plain = await archive(client, "public notes about the diary", "tool: public")
    assert plain.seq == 1

    # first unlock sets the passphrase
    r = await http.post("/api/memory/unlock", json={"passphrase": "correct horse"})
    assert r.status_code == 200 and r.json() == {"state": "unlocked"}
    await eventually(lambda: asyncio.sleep(0, recall.archive.unlocked))
    sealed = await archive(client, "my secret diary entry", "tool: secret diary")
    assert sealed.error is None and sealed.seq == 2

    recall_text, search, status, listed = await four_reads(client, http, 2)
    assert recall_text == "[r2 · tool: secret diary · verbatim]\nmy secret diary entry"
    assert search.splitlines()[1:] == [
        "- r2 · tool: secret diary",
        "  my secret diary entry",
        "- r1 · tool: public",
        "  public notes about the diary",
    ]
    assert status == 200 and listed == [1, 2]
    block = (await http.get("/api/recall/block", params={"seq": 2})).json()
    assert block["content"] == "my secret diary entry" and block["id"] == "r2"

    # lock: the sealed block behaves as absent on all four reads; the plain one stays
    r = await http.post("/api/memory/lock")
    assert r.json() == {"state": "locked"}
    await eventually(lambda: asyncio.sleep(0, not recall.archive.unlocked))
    recall_text, search, status, listed = await four_reads(client, http, 2)
    assert recall_text == (
        '[error] no archived block "r2" — check the id, or find it with recall_search'
    )
    assert search.splitlines()[1:] == ["- r1 · tool: public", "  public notes about the diary"]
    assert status == 404 and listed == [1]
    assert (await http.get("/api/recall/block", params={"seq": 1})).status_code == 200
    # while locked nothing can be archived (it could not be sealed with the memory key)
    refused = await archive(client, "another secret", "tool: x")
    assert refused.error is not None and refused.error.type == "locked"

    # a wrong passphrase is a 403 and changes nothing
    r = await http.post("/api/memory/unlock", json={"passphrase": "wrong horse"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_passphrase"
    assert (await http.get("/api/memory")).json() == {"state": "locked"}
    assert not recall.archive.unlocked

    # unlock again: everything comes back
    r = await http.post("/api/memory/unlock", json={"passphrase": "correct horse"})
    assert r.json() == {"state": "unlocked"}

    async def back() -> bool:
        return (await four_reads(client, http, 2))[2:] == (200, [1, 2])

    await eventually(back)
    await recall.archive.wait_loaded()
    recall_text, search, _, _ = await four_reads(client, http, 2)
    assert recall_text.endswith("\nmy secret diary entry")
    assert search.splitlines()[1] == "- r2 · tool: secret diary"

    # the key is in no stored value: only the KDF record (salt, check) is
    redis = Redis.from_url(redis_db)
    try:
        kdf = memkey.KdfParams.from_json(await redis.get(memkey.KDF_REDIS_KEY))
        assert len(kdf.salt) == 16 and len(kdf.check) == 32
        raw = await redis.hget(BLOCKS_KEY, "2")
        assert b"secret" not in raw
    finally:
        await redis.aclose()
    # ... and in no log line of the gateway or the recall service
    key = kdf.unlock("correct horse")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "memory unlocked" in logged
    assert base64.b64encode(key).decode() not in logged and key.hex() not in logged


async def test_restarted_recall_gets_the_key_from_the_gateway(
    nats_url: str, redis_db: str, tmp_path: Path, client: Client, gateway: httpx.AsyncClient
) -> None:
    settings = recall_settings(nats_url, redis_db, tmp_path / "home")
    first = RecallService(settings)
    await first.start()
    await gateway.post("/api/memory/unlock", json={"passphrase": "pw"})
    await eventually(lambda: asyncio.sleep(0, first.archive.unlocked))
    assert (await archive(client, "kept under the memory key", "tool: kept")).seq == 1
    await first.stop()
    second = RecallService(settings)
    await second.start()  # asks loki.memory.status right after it starts serving
    try:
        await eventually(lambda: asyncio.sleep(0, second.archive.unlocked))
        await second.archive.wait_loaded()
        text = await tool(client, "recall_search", {"query": "kept"})
        assert text.splitlines()[1] == "- r1 · tool: kept"
    finally:
        await second.stop()


async def test_recall_routes_errors(recall: RecallService, gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/api/recall/block", params={"seq": "7"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = await gateway.get("/api/recall/block", params={"seq": "r7"})
    assert r.status_code == 400
    r = await gateway.get("/api/recall/blocks")
    assert r.status_code == 200 and r.json() == {"blocks": []}
    r = await gateway.post("/api/memory/unlock", json={"passphrase": ""})
    assert r.status_code == 400
    assert (await gateway.get("/api/memory")).json() == {"state": "off"}


async def test_memory_unavailable_recall_is_503(gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/api/recall/block", params={"seq": "1"})
    assert r.status_code == 503


async def test_gateway_lists_every_block_across_pages(
    recall: RecallService, client: Client, gateway: httpx.AsyncClient
) -> None:
    big = ["é" * 150_000 + str(i) for i in range(6)]  # ~300 kB of JSON each: several pages
    for i, content in enumerate(big):
        assert (await archive(client, content, f"tool: big {i}")).seq == i + 1
    r = await gateway.get("/api/recall/blocks")
    assert r.status_code == 200
    blocks = r.json()["blocks"]
    assert [b["seq"] for b in blocks] == [1, 2, 3, 4, 5, 6]
    assert [b["content"] for b in blocks] == big
    r = await gateway.get("/api/recall/blocks", params={"after": "4"})
    assert [b["seq"] for b in r.json()["blocks"]] == [5, 6]
