"""The gateway's requests that are safe to send twice wait a moment for a service that NATS
says nobody serves (a chat instance reconnecting after its NATS node died): an SSE stream
opened in that moment still opens. Real NATS."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from loki_gateway.bus import Bus
from loki_gateway.errors import ServiceUnavailable
from loki_gateway.event_hub import replay_page
from loki_shared import subjects
from loki_shared.messages.chat import ReplayReply, ReplayRequest


async def test_a_replay_waits_for_a_chat_service_coming_back(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    chat = await nats.connect(nats_url)
    try:

        async def answer(msg) -> None:
            req = ReplayRequest.model_validate_json(msg.data)
            await msg.respond(ReplayReply(last_seq=req.after_seq + 1).model_dump_json().encode())

        async def come_back() -> nats.aio.subscription.Subscription:
            await asyncio.sleep(0.8)  # nobody serves the subject meanwhile
            sub = await chat.subscribe(subjects.CHAT_REPLAY, queue="chat", cb=answer)
            await chat.flush()
            return sub

        back = asyncio.create_task(come_back())
        t0 = time.monotonic()
        reply = await replay_page(bus, "c1", 7, 100)
        assert reply.last_seq == 8 and time.monotonic() - t0 >= 0.8
        await (await back).unsubscribe()
        await chat.flush()
        request = ReplayRequest(conversation="c1")
        with pytest.raises(ServiceUnavailable):  # no patience asked: the answer as it is
            await bus.request(subjects.CHAT_REPLAY, request, ReplayReply)
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailable):  # patience has an end
            await bus.request(subjects.CHAT_REPLAY, request, ReplayReply, patience_s=0.6)
        assert 0.4 <= time.monotonic() - t0 < 5.0
    finally:
        await chat.close()
        await bus.close()
