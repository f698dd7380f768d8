"""Code mode and compaction (issue 43): the criteria's state survives a compaction, rendered
into the summary message (the chat service with its default policy, the scripted summary
engine of the compaction tests, the fake supervisor, the real NATS, Redis, recall and
workspace services)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from loki_chat.compaction.decide import SUMMARY_HEADER
from tests.chat.test_code_turns import code
from tests.compaction.conftest import SummaryEngine
from tests.compaction.test_compaction_policy import SUMMARY
from tests.compaction.test_compaction_service import three_blocks
from tests.fakes.fake_engine import text_reply


@pytest.fixture
def fake_engine() -> Iterator[SummaryEngine]:
    """The compaction tests' engine (it answers summary requests too)."""
    with SummaryEngine() as engine:
        yield engine


@pytest.fixture
async def recall(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[Any]:
    """The real recall service (the compaction archives the big blocks there)."""
    from loki_recall.service import RecallService
    from tests.recall.recall_helpers import recall_settings

    service = RecallService(recall_settings(nats_url, redis_db, tmp_path / "recall-home"))
    await service.start()
    yield service
    await service.stop()


async def test_a_compacted_code_conversation_keeps_its_criteria_in_the_summary(
    chat_runner, supervisor, client, fake_engine, recall, workspace
):
    await chat_runner.start()
    cid = await three_blocks(client, fake_engine, last_prompt=1800)
    assert (await code(client, cid, "mode", mode="code")).error is None
    criteria = [{"text": "tests pass", "command": "pytest -q"}, {"text": "README greets"}]
    assert (await code(client, cid, "criteria", criteria=criteria)).error is None
    fake_engine.push(text_reply(SUMMARY))
    assert (await client.control(cid, "compact")).ok
    summary = (await client.state(cid)).messages[1]
    assert summary.loki.injected == "summary"
    assert summary.content == (
        SUMMARY_HEADER
        + SUMMARY
        + "\n\n[Acceptance criteria of the task, as last checked]\n"
        + "- c1 [pending] tests pass (command: pytest -q)\n- c2 [pending] README greets"
    )


async def test_in_chat_mode_the_summary_is_as_before(
    chat_runner, supervisor, client, fake_engine, recall, workspace
):
    await chat_runner.start()
    cid = await three_blocks(client, fake_engine, last_prompt=1800)
    # criteria kept from an earlier code-mode stretch are not the chat's business
    await code(client, cid, "mode", mode="code")
    await code(client, cid, "criteria", criteria=[{"text": "tests pass"}])
    await code(client, cid, "mode", mode="chat")
    fake_engine.push(text_reply(SUMMARY))
    assert (await client.control(cid, "compact")).ok
    summary = (await client.state(cid)).messages[1]
    assert summary.content == SUMMARY_HEADER + SUMMARY
