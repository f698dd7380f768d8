"""Fixtures of the compaction tests: the scripted fake engine (answering non-streamed summary
requests too), the fake supervisor of the chat tests, the recall service in-process, a
started broker, and a helper that builds a :class:`ContextView` on a conversation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from loki_chat.bus import ChatBus
from loki_chat.compaction import CompactionDeps, CompactionPolicy
from loki_chat.context import ContextView
from loki_chat.conversation import Conversation
from loki_shared import subjects
from loki_shared.nats import make_broker
from tests.chat.helpers import (
    SECRET,
    ChatClient,
    ChatRunner,
    EventTap,
    chat_settings,
)
from tests.fakes.fake_engine import FakeEngine, Stream, default_timings, default_usage
from tests.fakes.fake_supervisor import FakeSupervisor


class SummaryEngine(FakeEngine):
    """The fake engine, also answering ``stream: false`` requests: the scripted
    :class:`Stream` is folded into one ``chat.completion`` JSON (content, reasoning_content,
    tool_calls, finish_reason, usage, timings), as llama-server answers without streaming."""

    async def _play(self, response, record, writer):  # type: ignore[override]
        try:
            request = record.json
        except ValueError:
            request = {}
        if request.get("stream") is not False or not isinstance(response, Stream):
            return await super()._play(response, record, writer)
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        calls: dict[int, dict[str, Any]] = {}
        finish = None
        reasoning = ""
        for frame in response.frames:
            if not isinstance(frame, dict):
                continue
            for choice in frame.get("choices") or []:
                delta = choice.get("delta") or {}
                message["content"] += delta.get("content") or ""
                reasoning += delta.get("reasoning_content") or ""
                for tc in delta.get("tool_calls") or []:
                    entry = calls.setdefault(
                        tc["index"],
                        {
                            "id": tc.get("id"),
                            "type": "function",
                            "function": {"name": "", "arguments": ""},
                        },
                    )
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        entry["function"]["name"] = fn["name"]
                    entry["function"]["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        body = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "fake-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
            "usage": response.usage or default_usage(),
            "timings": response.timings or default_timings(),
        }
        await self._send_json(writer, 200, body)
        return True


@pytest.fixture
def fake_engine() -> Iterator[SummaryEngine]:
    with SummaryEngine() as engine:
        yield engine


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def supervisor(nc: Any, fake_engine: SummaryEngine) -> AsyncIterator[FakeSupervisor]:
    sup = await FakeSupervisor(nc, fake_engine.url).start()
    yield sup
    await sup.stop()


@pytest.fixture
async def recall(nats_url: str, redis_db: str, tmp_path: Path):
    """The real recall service, in-process, on an empty Redis."""
    from loki_recall.service import RecallService
    from tests.recall.recall_helpers import recall_settings

    service = RecallService(recall_settings(nats_url, redis_db, tmp_path / "recall-home"))
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[Any]:
    b = make_broker(nats_url, "compaction-test")
    await b.start()
    yield b
    await b.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
async def client(nc: Any) -> ChatClient:
    tap = EventTap()
    await nc.subscribe(subjects.CHAT_EVENTS_ALL, cb=tap.on)
    await nc.flush()
    return ChatClient(nc, tap)


@pytest.fixture
async def chat_runner(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[ChatRunner]:
    runner = ChatRunner(nats_url, redis_db, tmp_path / "home")
    yield runner
    await runner.stop_all()


class Harness:
    """A policy on a conversation, with the real broker, HTTP client and settings."""

    def __init__(self, broker: Any, http: httpx.AsyncClient, settings: Any) -> None:
        self.broker = broker
        self.http = http
        self.settings = settings
        self.policy = CompactionPolicy(CompactionDeps(settings, ChatBus(broker), http))
        self.markers: list[dict[str, Any]] = []

    def view(
        self,
        conv: Conversation,
        trigger: str = "end",
        n_ctx: int = 4096,
        ctx_used: int | None = None,
        overflow: Any = None,
    ) -> ContextView:
        used = (
            ctx_used
            if ctx_used is not None
            else conv.meter.used(self.settings.system_prompt, conv.messages)
        )

        async def emit(delta: dict[str, Any], loki: dict[str, Any] | None) -> None:
            self.markers.append(loki or {})

        return ContextView(
            conversation=conv,
            trigger=trigger,
            n_ctx=n_ctx,
            ctx_used=used,
            overflow=overflow,
            emit=emit,
        )


@pytest.fixture
def harness(broker: Any, http: httpx.AsyncClient, nats_url: str, tmp_path: Path):
    def make(**over: Any) -> Harness:
        settings = chat_settings(nats_url, "redis://127.0.0.1:1/0", tmp_path / "h", **over)
        return Harness(broker, http, settings)

    return make


async def recall_text(nc: Any, block_id: str) -> str:
    """The text the recall tool gives back for ``block_id`` (over ``loki.recall.tool``)."""
    raw = await nc.request(
        subjects.RECALL_TOOL,
        json.dumps({"name": "recall", "arguments": {"id": block_id}}).encode(),
        timeout=5,
    )
    return str(json.loads(raw.data)["text"])


def summary_requests(engine: FakeEngine) -> list[dict[str, Any]]:
    """The non-streamed (summary) requests the engine received, decoded."""
    return [r.json for r in engine.requests if r.json.get("stream") is False]


__all__ = ["SECRET", "json", "recall_text", "summary_requests"]
