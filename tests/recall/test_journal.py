"""The journal: 35 varied blocks (accents and case, İ, Greek, tags and entities, an empty block,
long first lines, twenty-five near-identical blocks) archived through ``loki.recall.archive``,
then 48 recorded ``recall`` / ``recall_search`` calls replayed through ``loki.recall.tool``,
each compared with its exact recorded text (data/journal.json, reviewed by hand against the
rules in docs/behaviour.md (recall))."""

from __future__ import annotations

import json
from pathlib import Path

from loki_recall import tools
from loki_recall.service import RecallService
from loki_shared import subjects
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    Block,
    ToolReply,
    ToolRequest,
)
from loki_shared.recall_label import recall_label
from tests.recall.recall_helpers import Client

JOURNAL = json.loads((Path(__file__).parent / "data" / "journal.json").read_text("utf-8"))


def test_journal_shape() -> None:
    blocks, calls = JOURNAL["blocks"], JOURNAL["calls"]
    assert len(blocks) >= 35 and len(calls) >= 40
    assert any(b["content"] == "" for b in blocks)
    assert {c["name"] for c in calls} == {"recall", "recall_search"}
    for b in blocks:  # the labels are those the chat service builds
        assert b["label"] == recall_label(b["role"], b["content"], b["tool_name"])


async def test_journal_replayed_through_the_service(recall: RecallService, client: Client) -> None:
    for seq, b in enumerate(JOURNAL["blocks"], 1):
        reply = await client.ask(subjects.RECALL_ARCHIVE, ArchiveRequest(**b), ArchiveReply)
        assert (reply.id, reply.seq) == (f"r{seq}", seq)
    for call in JOURNAL["calls"]:
        reply = await client.ask(
            subjects.RECALL_TOOL,
            ToolRequest(name=call["name"], arguments=call["arguments"]),
            ToolReply,
        )
        assert reply.error is None
        assert reply.text == call["text"], call["arguments"]


async def test_journal_replayed_on_a_full_scan() -> None:
    reader = tools.ListReader(
        Block(seq=i, id=f"r{i}", created=0.0, **b) for i, b in enumerate(JOURNAL["blocks"], 1)
    )
    for call in JOURNAL["calls"]:
        run = tools.recall if call["name"] == "recall" else tools.recall_search
        assert await run(call["arguments"], reader) == call["text"], call["arguments"]
