"""Deleting a conversation (or a project) deletes what it archived; ``recall`` and
``recall_search`` stay inside the caller's scope (issue 28). Real NATS and Redis, the recall
service in-process; the chat service in-process where the deletion starts there."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis

from loki_gateway import errors as gateway_errors
from loki_gateway.bus import Bus
from loki_gateway.routes import chat as chat_routes
from loki_gateway.routes import recall as recall_routes
from loki_recall.archive import BLOCKS_KEY
from loki_recall.owners import Owners, owners
from loki_recall.service import RecallService
from loki_recall.tools import NO_MATCH, not_found_text
from loki_shared import memkey, recall_purge, subjects
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    BlocksReply,
    BlocksRequest,
    PurgeReply,
    PurgeRequest,
    RecallScope,
    ToolReply,
    ToolRequest,
)
from tests.recall.recall_helpers import Client, recall_settings

JOURNAL = json.loads((Path(__file__).parent / "data" / "journal.json").read_text("utf-8"))


async def put(
    client: Client, content: str, conversation: str | None = "c1", project: str | None = None
) -> ArchiveReply:
    return await client.ask(
        subjects.RECALL_ARCHIVE,
        ArchiveRequest(
            label="",
            role="tool",
            tool_name="read_file",
            content=content,
            conversation=conversation,
            project=project,
        ),
        ArchiveReply,
    )


async def seq_of(client: Client, content: str, **kw: Any) -> int:
    reply = await put(client, content, **kw)
    assert reply.error is None, reply.error
    return reply.seq


async def tool(client: Client, name: str, args: Any, scope: RecallScope | None = None) -> str:
    reply = await client.ask(
        subjects.RECALL_TOOL, ToolRequest(name=name, arguments=args, scope=scope), ToolReply
    )
    assert reply.error is None, reply.error
    return reply.text


async def listed(client: Client, **filters: Any) -> list[int]:
    out, after = [], 0
    while after is not None:
        page = await client.ask(
            subjects.RECALL_BLOCKS, BlocksRequest(after=after, **filters), BlocksReply
        )
        assert page.error is None, page.error
        out.extend(b.seq for b in page.blocks)
        after = page.next_after
    return out


async def purge(client: Client, **which: str) -> list[int]:
    reply = await client.ask(subjects.RECALL_PURGE, PurgeRequest(**which), PurgeReply)
    assert reply.error is None, reply.error
    return reply.seqs


def words(service: RecallService) -> set[bytes]:
    """The vocabulary of the service's index of service-key blocks."""
    return set(service.archive._plain._ids)


@pytest.fixture
async def redis(redis_db: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_db)
    yield r
    await r.aclose()


async def test_delete_conversation_blocks_gone_everywhere(
    nats_url: str,
    redis_db: str,
    tmp_path: Path,
    client: Client,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three instances: one applies the deletion, one running learns it at its next
    catch-up, one stopped meanwhile restarts from a snapshot that still named the blocks."""
    settings = recall_settings(nats_url, redis_db, tmp_path / "home")
    away_settings = recall_settings(nats_url, redis_db, tmp_path / "away")
    first, second = RecallService(settings), RecallService(settings)
    away = RecallService(away_settings)
    for s in (first, second, away):
        await s.start()
    try:
        r1 = await seq_of(client, "password hunter2 for the zebracorn box", conversation="c1")
        r2 = await seq_of(client, "zebracorn notes of another conversation", conversation="c2")
        r3 = await seq_of(client, "second block of c1: hunter2 again", conversation="c1")
        r4 = await seq_of(client, "unrelated", conversation=None)
        for s in (first, second, away):  # every instance has indexed every block
            await s.archive.sync()
            assert b"hunter2" in words(s)
        await away.stop()  # its snapshot names r1 and r3

        assert await purge(client, conversation="c1") == [r1, r3]
        assert await redis.hmget(BLOCKS_KEY, [str(r1), str(r3)]) == [None, None]
        for s in (first, second):
            await s.archive.sync()
            assert b"hunter2" not in words(s) and s.archive.stats()["blocks"] == 2
        assert await tool(client, "recall", {"id": f"r{r1}"}) == not_found_text(f"r{r1}")
        assert await tool(client, "recall_search", {"query": "hunter2"}) == NO_MATCH
        found = await tool(client, "recall_search", {"query": "zebracorn"})
        assert [x for x in found.splitlines() if x.startswith("- ")] == [
            f"- r{r2} · read_file: zebracorn notes of another conversation"
        ]
        assert await listed(client) == [r2, r4]
        assert await listed(client, conversation="c1") == []
        assert await purge(client, conversation="c1") == []  # idempotent

        # The sequence goes on; an archive still in flight for c1 is refused, never stored.
        assert await seq_of(client, "after the delete", conversation="c3") == r4 + 1
        late = await put(client, "late compaction of c1", conversation="c1")
        assert late.error is not None and late.error.type == "not_found"
        assert await seq_of(client, "next", conversation="c3") == r4 + 3
        assert not await redis.hexists(BLOCKS_KEY, str(r4 + 2))

        caplog.clear()
        caplog.set_level(logging.INFO, logger="loki.recall.archive")
        away = RecallService(away_settings)
        await away.start()
        assert "index snapshot restored" in caplog.text
        assert b"hunter2" not in words(away) and b"zebracorn" in words(away)
        assert away.archive.stats()["blocks"] == 4
    finally:
        for s in (first, second, away):
            await s.stop()

    # The snapshot saved at stop holds no word of them, and a restart does not bring them back.
    third = RecallService(settings)
    await third.start()
    try:
        assert b"hunter2" not in words(third) and b"zebracorn" in words(third)
        assert await tool(client, "recall_search", {"query": "hunter2"}) == NO_MATCH
        assert await tool(client, "recall", {"id": f"r{r3}"}) == not_found_text(f"r{r3}")
        assert await listed(client) == [r2, r4, r4 + 1, r4 + 3]
        assert await seq_of(client, "once more", conversation="c3") == r4 + 4
    finally:
        await third.stop()


async def test_scoped_search_stays_in_its_project(
    recall: RecallService, client: Client, redis: Redis
) -> None:
    """Within the default project a scoped call answers exactly today's texts (the journal,
    with the same blocks copied into another project at higher seqs that would otherwise win
    every tie); from another project those blocks are "no archived block"."""
    n = len(JOURNAL["blocks"])
    for b in JOURNAL["blocks"]:
        assert (
            await client.ask(subjects.RECALL_ARCHIVE, ArchiveRequest(**b), ArchiveReply)
        ).error is None
    for b in JOURNAL["blocks"]:
        req = ArchiveRequest(**{**b, "project": "p2"})
        assert (await client.ask(subjects.RECALL_ARCHIVE, req, ArchiveReply)).seq > n
    for call in JOURNAL["calls"]:
        got = await tool(client, call["name"], call["arguments"], RecallScope())
        assert got == call["text"], call["arguments"]
    # From p2: r1 is outside the scope; the copies are found instead.
    assert await tool(client, "recall", {"id": "r1"}, RecallScope(project="p2")) == (
        not_found_text("r1")
    )
    back = await tool(client, "recall", {"id": f"r{n + 1}"}, RecallScope(project="p2"))
    assert back.startswith(f"[r{n + 1} · ")
    hits = await tool(
        client, "recall_search", {"query": "the", "limit": 20}, RecallScope(project="p2")
    )
    seqs = [int(x[3:].split(" ")[0]) for x in hits.splitlines() if x.startswith("- r")]
    assert seqs and all(s > n for s in seqs)
    assert (
        await tool(client, "recall_search", {"query": "zzqx"}, RecallScope(project="p3"))
        == NO_MATCH
    )
    # Without scope (tests, admin): the whole archive, as before.
    assert await tool(client, "recall", {"id": "r1"}) == await tool(
        client, "recall", {"id": "r1"}, RecallScope()
    )
    assert await listed(client, project="p2") == list(range(n + 1, 2 * n + 1))
    assert await listed(client, project="default") == list(range(1, n + 1))

    # Deleting a project deletes its blocks and nothing else.
    assert await purge(client, project="p2") == list(range(n + 1, 2 * n + 1))
    assert await listed(client) == list(range(1, n + 1))
    assert await tool(client, "recall", {"id": f"r{n + 1}"}) == not_found_text(f"r{n + 1}")
    bad = await client.ask(subjects.RECALL_PURGE, PurgeRequest(), PurgeReply)
    assert bad.error is not None and bad.error.type == "invalid_request"


# --- through the chat service and the gateway's routes -----------------------------------


@pytest.fixture
async def http(nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's chat and recall routers on a real bus (the app wiring in miniature)."""
    app = FastAPI()
    app.include_router(chat_routes.router)
    app.include_router(recall_routes.router)
    gateway_errors.install(app)
    app.state.bus = await Bus.connect(nats_url)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway"
    ) as client:
        yield client
    await app.state.bus.close()


@pytest.fixture
async def chat(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[Any]:
    from tests.chat.helpers import ChatRunner

    runner = ChatRunner(nats_url, redis_db, tmp_path / "chat-home")
    await runner.start()
    yield runner
    await runner.stop_all()


async def test_delete_while_recall_is_down_completes_when_it_returns(
    nats_url: str,
    redis_db: str,
    tmp_path: Path,
    client: Client,
    redis: Redis,
    chat: Any,
    http: httpx.AsyncClient,
) -> None:
    settings = recall_settings(nats_url, redis_db, tmp_path / "home")
    recall = RecallService(settings)
    await recall.start()
    cid = (await http.post("/api/conversations", json={"title": "pasted log"})).json()[
        "conversation"
    ]["id"]
    kept = (await http.post("/api/conversations", json={})).json()["conversation"]["id"]
    mine = [
        await seq_of(client, "240 lines of log, token kumquat-7781", conversation=cid),
        await seq_of(client, "a customer file: kumquat street", conversation=cid),
    ]
    other = await seq_of(client, "kumquat jam recipe", conversation=kept)

    export = (await http.get(f"/api/conversations/{cid}/export?with_archive=1")).json()
    assert [b["seq"] for b in export["archive"]] == mine
    assert export["archive"][0]["content"] == "240 lines of log, token kumquat-7781"
    assert "archive" not in (await http.get(f"/api/conversations/{cid}/export")).json()
    r = await http.get("/api/recall/blocks", params={"conversation": cid})
    assert [b["seq"] for b in r.json()["blocks"]] == mine
    r = await http.get("/api/recall/blocks", params={"project": "default"})
    assert [b["seq"] for b in r.json()["blocks"]] == [*mine, other]
    r = await http.get("/api/recall/blocks", params={"conversation": "no spaces"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    await recall.stop()  # the snapshot saved now still indexes the two blocks

    r = await http.delete(f"/api/conversations/{cid}")
    assert r.status_code == 200 and r.json() == {"ok": True, "deleted": cid}
    # Recorded in the same write as the conversation's deletion; the blocks await recall.
    assert await redis.smembers(recall_purge.PURGE_KEY) == {f"c:{cid}".encode()}
    assert await redis.hexists(BLOCKS_KEY, str(mine[0]))

    back = RecallService(settings)
    await back.start()
    try:
        assert await redis.hmget(BLOCKS_KEY, [str(s) for s in mine]) == [None, None]
        assert await redis.scard(recall_purge.PURGE_KEY) == 0
        assert b"7781" not in words(back) and b"kumquat" in words(back)
        hits = await tool(client, "recall_search", {"query": "kumquat"}, RecallScope())
        assert [x for x in hits.splitlines() if x.startswith("- ")] == [
            f"- r{other} · read_file: kumquat jam recipe"
        ]
        assert await tool(client, "recall", {"id": f"r{mine[0]}"}) == not_found_text(f"r{mine[0]}")
        assert await seq_of(client, "next", conversation=kept) == other + 1

        # With recall up the deletion is done before the DELETE answers.
        seq = await seq_of(client, "short-lived", conversation=kept)
        assert (await http.delete(f"/api/conversations/{kept}")).status_code == 200
        assert await redis.hmget(BLOCKS_KEY, [str(other), str(seq)]) == [None, None]
    finally:
        await back.stop()
    again = RecallService(settings)
    await again.start()
    try:
        assert await listed(client) == []
        assert b"kumquat" not in words(again)
    finally:
        await again.stop()


async def test_blocks_stored_before_owner_sets_are_deletable(
    nats_url: str, redis_db: str, tmp_path: Path, client: Client, redis: Redis
) -> None:
    """An archive from before this change (no owner sets): the first start completes them
    from the blocks themselves (no snapshot used), then a deletion finds every block."""
    settings = recall_settings(nats_url, redis_db, tmp_path / "home")
    first = RecallService(settings)
    await first.start()
    seqs = [await seq_of(client, f"legacy {i} quince", conversation="old") for i in range(3)]
    await first.stop()
    for key in await redis.keys("loki:recall:owner*"):
        await redis.delete(key)
    second = RecallService(settings)
    await second.start()
    try:
        assert await redis.exists("loki:recall:owners_v1")
        assert await purge(client, conversation="old") == seqs
        assert await tool(client, "recall_search", {"query": "quince"}) == NO_MATCH
    finally:
        await second.stop()


async def test_memory_blocks_deleted_while_the_memory_is_locked(
    recall: RecallService, client: Client, redis: Redis
) -> None:
    """A block sealed with the memory key is deleted with its conversation even while the
    memory is locked (the owner sets name it without opening it), and stays gone after the
    next unlock."""
    params, key = memkey.new_params("pass phrase", n=2**10)
    await redis.set(memkey.KDF_REDIS_KEY, params.to_json())
    await recall.keys.apply("unlocked", memkey.b64(key))
    sealed = await seq_of(client, "diary: the medlar tree secret", conversation="c9")
    kept = await seq_of(client, "diary: the medlar jam", conversation="c8")
    await recall.keys.apply("locked", None)
    assert await purge(client, conversation="c9") == [sealed]
    assert not await redis.hexists(BLOCKS_KEY, str(sealed))
    await recall.keys.apply("unlocked", memkey.b64(key))
    await recall.archive.wait_loaded()
    hits = await tool(client, "recall_search", {"query": "medlar"})
    assert [x for x in hits.splitlines() if x.startswith("- ")] == [
        f"- r{kept} · read_file: diary: the medlar jam"
    ]


async def test_chat_recall_tools_send_the_scope() -> None:
    """The chat service's recall tools put the scope (the default project, every
    conversation's until projects exist) on each ``loki.recall.tool`` request."""
    from loki_chat.tools import recall_tools

    sent: list[ToolRequest] = []

    async def request(subject: str, message: Any, reply_type: Any, timeout: float) -> Any:
        assert subject == subjects.RECALL_TOOL
        sent.append(message)
        return ToolReply(text="ok")

    specs = recall_tools(request, 1.0)
    for spec in specs:
        assert await spec.run({"id": "r1", "query": "x"}) == "ok"
    assert [m.scope for m in sent] == [RecallScope(project="default")] * 2
    wire = json.loads(sent[0].model_dump_json())
    assert wire["scope"] == {"project": "default"}
    scoped = recall_tools(request, 1.0, RecallScope(project="p7"))
    await scoped[0].run({"id": "r1"})
    assert sent[-1].scope == RecallScope(project="p7")


async def test_the_owner_sets_say_which_names_are_gone(redis_db: str) -> None:
    redis = Redis.from_url(redis_db)
    try:
        store = Owners(redis)
        conv, project = owners("c-deleted", "p1")
        assert await store.gone([]) == []
        assert await store.gone([conv, project]) == [False, False]
        await store.record(conv)  # the deletion of a conversation, before it is applied
        assert await store.gone([conv, project]) == [True, False]
        assert await store.pending() == [conv]
    finally:
        await redis.aclose()
