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


async def test_the_state_and_the_list_a_page_opens_with_wait_too(nats_url: str) -> None:
    """The siblings of the replay: what the page asks when it opens (the state, the
    conversation list) waits the same way; a rename (a write) does not — NATS's "no
    responders" means nobody got it, but a service really down is said at once there."""
    from loki_gateway.routes.chat import (
        RenameBody,
        chat_state,
        conversations_list,
        conversations_rename,
    )
    from loki_shared.messages.chat import ConversationsReply, StateReply

    bus = await Bus.connect(nats_url)
    chat = await nats.connect(nats_url)
    try:

        async def state(msg) -> None:
            await msg.respond(StateReply(conversation="c1", last_seq=4).model_dump_json().encode())

        async def listing(msg) -> None:
            await msg.respond(ConversationsReply().model_dump_json().encode())

        async def come_back() -> None:
            await asyncio.sleep(0.6)
            await chat.subscribe(subjects.CHAT_STATE, queue="chat", cb=state)
            await chat.subscribe(subjects.CHAT_CONVERSATIONS, queue="chat", cb=listing)
            await chat.flush()

        back = asyncio.create_task(come_back())
        with pytest.raises(ServiceUnavailable):  # a write: not asked again
            await conversations_rename("c1", RenameBody(title="x"), bus=bus)
        got = await chat_state("c1", bus=bus)
        assert got["last_seq"] == 4
        assert await conversations_list(project=None, kind="main", bus=bus) == {"conversations": []}
        await back
    finally:
        await chat.close()
        await bus.close()
