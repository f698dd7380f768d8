"""Issue 28 as a user meets it: pasted files compacted (archived verbatim), then the
conversation deleted — its blocks go with it, and another conversation's recall tools no
longer find them. Chat service with the default policy, scripted fake engine, fake
supervisor, the real NATS, Redis and recall service."""

from __future__ import annotations

from loki_shared import subjects
from loki_shared.messages.recall import (
    BlocksReply,
    BlocksRequest,
    RecallScope,
    ToolReply,
    ToolRequest,
)
from tests.fakes.fake_engine import text_reply

from .test_compaction_policy import SUMMARY
from .test_compaction_service import three_blocks


async def ask(nc, message, reply_type, subject):
    msg = await nc.request(subject, message.model_dump_json().encode(), timeout=10)
    return reply_type.model_validate_json(msg.data)


async def search(nc, query: str) -> str:
    req = ToolRequest(name="recall_search", arguments={"query": query}, scope=RecallScope())
    reply = await ask(nc, req, ToolReply, subjects.RECALL_TOOL)
    assert reply.error is None
    return reply.text


async def test_deleting_a_compacted_conversation_deletes_its_archive(
    chat_runner, supervisor, client, fake_engine, recall, nc
):
    await chat_runner.start()
    cid = await three_blocks(client, fake_engine, last_prompt=1800)
    fake_engine.push(text_reply(SUMMARY))
    assert (await client.control(cid, "compact")).ok
    listed = await ask(nc, BlocksRequest(conversation=cid), BlocksReply, subjects.RECALL_BLOCKS)
    seqs = [b.seq for b in listed.blocks]
    assert seqs and all(b.conversation == cid for b in listed.blocks)
    assert "design_0" in await search(nc, "design_0 component")

    reply = await client.conversations("delete", conversation=cid)
    assert reply.error is None
    assert (await ask(nc, BlocksRequest(), BlocksReply, subjects.RECALL_BLOCKS)).blocks == []
    assert await search(nc, "design_0 component") == "[no archived block matches]"
    for seq in seqs:
        req = ToolRequest(name="recall", arguments={"id": f"r{seq}"}, scope=RecallScope())
        text = (await ask(nc, req, ToolReply, subjects.RECALL_TOOL)).text
        assert text.startswith(f'[error] no archived block "r{seq}"')
