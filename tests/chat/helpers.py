"""Helpers of the chat tests, imported by the chat fixtures (``tests/chat/conftest.py``) and by
the compaction, template and recall tests: the secret every in-process service seals with, a
tap on the chat events, a NATS client that talks to the chat service like the gateway does,
the test settings, a tool box with ``ping`` and ``echo``, and a runner of in-process chat
services. Import them as ``tests.chat.helpers`` (never from a conftest)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from loki_chat.context import ContextPolicy
from loki_chat.service import ChatService
from loki_chat.settings import Settings
from loki_chat.store import Store
from loki_chat.tools import ToolBox, ToolSpec, recall_tools
from loki_shared import subjects
from loki_shared.messages.chat import (
    ChatEvent,
    ControlReply,
    ControlRequest,
    ConversationsReply,
    ConversationsRequest,
    ReplayReply,
    ReplayRequest,
    SendReply,
    SendRequest,
    StateReply,
    StateRequest,
)
from loki_shared.nats import make_broker
from loki_shared.sealing import service_sealer

SECRET = "test-secret-key-0123456789"


class EventTap:
    """Collects every ``loki.chat.events.*`` event, per conversation."""

    def __init__(self) -> None:
        self.events: dict[str, list[ChatEvent]] = defaultdict(list)
        self._changed = asyncio.Event()

    async def on(self, msg: Any) -> None:
        event = ChatEvent.model_validate_json(msg.data)
        self.events[event.conversation].append(event)
        self._changed.set()

    async def wait(self, predicate, timeout: float = 20.0) -> None:
        async def loop() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    def turn_ends(self, cid: str) -> list[ChatEvent]:
        return [e for e in self.events[cid] if (e.loki or {}).get("event") == "turn_end"]

    async def wait_turn_ends(self, cid: str, n: int = 1, timeout: float = 20.0) -> list[ChatEvent]:
        await self.wait(lambda: len(self.turn_ends(cid)) >= n, timeout)
        return self.turn_ends(cid)

    def text(self, cid: str) -> str:
        return "".join(
            e.delta.get("content", "")
            for e in self.events[cid]
            if e.delta.get("role") not in ("user", "tool")
        )


@dataclass
class ChatClient:
    """Talks to the chat service over NATS like the gateway does."""

    nc: Any
    tap: EventTap

    async def _req(self, subject: str, msg: Any, reply_type: type, timeout: float = 10.0):
        raw = await self.nc.request(subject, msg.model_dump_json().encode(), timeout=timeout)
        return reply_type.model_validate_json(raw.data)

    async def send(self, content: str, conversation: str | None = None) -> SendReply:
        return await self._req(
            subjects.CHAT_SEND, SendRequest(conversation=conversation, content=content), SendReply
        )

    async def control(
        self,
        conversation: str,
        action: str,
        content: str | None = None,
        timeout: float = 10.0,
    ) -> ControlReply:
        return await self._req(
            subjects.CHAT_CONTROL,
            ControlRequest(conversation=conversation, action=action, content=content),
            ControlReply,
            timeout,
        )

    async def state(self, conversation: str) -> StateReply:
        return await self._req(
            subjects.CHAT_STATE, StateRequest(conversation=conversation), StateReply
        )

    async def replay(self, conversation: str, after_seq: int = 0) -> ReplayReply:
        return await self._req(
            subjects.CHAT_REPLAY,
            ReplayRequest(conversation=conversation, after_seq=after_seq),
            ReplayReply,
        )

    async def conversations(self, action: str, **kw: Any) -> ConversationsReply:
        return await self._req(
            subjects.CHAT_CONVERSATIONS,
            ConversationsRequest(action=action, **kw),
            ConversationsReply,
        )

    async def turn(
        self, content: str, conversation: str | None = None, timeout: float = 20.0
    ) -> tuple[str, ChatEvent]:
        """Send and wait for that turn's end; return (conversation, turn_end event)."""
        before = len(self.tap.turn_ends(conversation)) if conversation else 0
        reply = await self.send(content, conversation)
        assert reply.error is None, reply.error
        ends = await self.tap.wait_turn_ends(reply.conversation, before + 1, timeout)
        return reply.conversation, ends[before]


def chat_settings(nats_url: str, redis_url: str, home: Path, **over: Any) -> Settings:
    """The chat service's settings for a test: short retries, lock TTL and timeouts, sealed
    with :data:`SECRET`; ``over`` replaces any field."""
    values: dict[str, Any] = dict(
        home=home,
        nats_url=nats_url,
        redis_url=redis_url,
        secret_key=SECRET,
        retry_delays=[0.05, 0.1, 0.2],
        lock_ttl_s=3.0,
        recall_timeout_s=0.5,
        lease_timeout_s=5.0,
        step_budget=6,
        instance_id=None,
    )
    values.update(over)
    return Settings(**values)


async def ping_tool(args: dict[str, Any]) -> str:
    """The ``ping`` tool: answers ``pong`` whatever it is given."""
    return "pong"


async def echo_tool(args: dict[str, Any]) -> str:
    """The ``echo`` tool: its arguments back, as sorted JSON."""
    return json.dumps(args, sort_keys=True)


def make_tools(svc_request) -> ToolBox:
    """recall + recall_search, plus ``ping`` (no parameters) and ``echo`` (one)."""
    box = ToolBox(recall_tools(svc_request, 0.5))
    box.add(ToolSpec(name="ping", description="Answers pong.", run=ping_tool))
    box.add(
        ToolSpec(
            name="echo",
            description="Echoes its arguments.",
            run=echo_tool,
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        )
    )
    return box


class ChatRunner:
    """Starts and stops in-process chat services (each with its own broker)."""

    def __init__(self, nats_url: str, redis_url: str, home: Path) -> None:
        self.nats_url = nats_url
        self.redis_url = redis_url
        self.home = home
        self.running: list[tuple[ChatService, Any, Any, httpx.AsyncClient]] = []

    async def start(
        self, policy: ContextPolicy | None = None, tools: bool = True, **over: Any
    ) -> ChatService:
        """Start a service; ``tools`` False offers no tool at all."""
        settings = chat_settings(self.nats_url, self.redis_url, self.home, **over)
        from loki_chat.service import instance_id

        sealer = service_sealer(settings.home, SECRET)
        redis_client = aioredis.Redis.from_url(self.redis_url)
        store = Store(redis_client, sealer, instance_id(settings), settings.lock_ttl_s)
        broker = make_broker(self.nats_url, "chat-test")
        http = httpx.AsyncClient()
        service = ChatService(settings, broker, store, http, policy=policy)
        service.toolbox = make_tools(service.request) if tools else ToolBox()
        service.register()
        await broker.start()
        await service.start()
        self.running.append((service, broker, redis_client, http))
        await self._until_served(broker)
        return service

    async def _until_served(self, broker: Any) -> None:
        """Wait until the chat queue group answers (the server may still route to nobody
        for a moment after a previous instance stopped)."""
        nc = broker.config.connection_state.connection
        body = ConversationsRequest(action="list").model_dump_json().encode()
        for _ in range(100):
            try:
                await nc.request(subjects.CHAT_CONVERSATIONS, body, timeout=1)
                return
            except Exception:  # noqa: BLE001 - not routed yet
                await asyncio.sleep(0.02)

    async def stop(self, service: ChatService) -> None:
        for entry in list(self.running):
            if entry[0] is service:
                self.running.remove(entry)
                svc, broker, redis_client, http = entry
                await svc.close()
                await broker.stop()
                await redis_client.aclose()
                await http.aclose()

    async def stop_all(self) -> None:
        for entry in list(self.running):
            await self.stop(entry[0])
