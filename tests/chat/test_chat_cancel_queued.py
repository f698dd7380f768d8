"""Cancelling a message queued behind a running turn (issue 17, item 3), against the real chat
service on real NATS and Redis, with the scripted fake engine.

A queued message that has not started is dropped: it never reaches the engine nor the
conversation, and the queue left behind it runs in order. A message whose turn started is
never cancelled: the answer says so and nothing changes.
"""

from __future__ import annotations

from tests.fakes.fake_engine import text_reply


async def test_a_queued_message_is_cancelled_and_never_sent(chat, client, fake_engine):
    fake_engine.push(text_reply("r1", delay_s=0.5), text_reply("r3"))
    first = await client.send("m1")
    cid = first.conversation
    assert (await client.send("m2", cid)).queued
    assert (await client.send("m3", cid)).queued
    assert (await client.state(cid)).pending == ["m2", "m3"]  # shown again after a reload
    reply = await client.control(cid, "cancel_queued", content="m2")
    assert reply.ok and reply.detail == "cancelled"
    assert (await client.state(cid)).queued == 1
    await client.tap.wait_turn_ends(cid, 2)
    users = [m.content for m in (await client.state(cid)).messages if m.role == "user"]
    assert users == ["m1", "m3"]
    assert [r.json["messages"][-1]["content"] for r in fake_engine.requests] == ["m1", "m3"]
    assert not any(e.delta.get("content") == "m2" for e in client.tap.events[cid])


async def test_a_started_message_is_not_cancelled(chat, client, fake_engine):
    fake_engine.push(text_reply("r1", delay_s=0.5))
    cid = (await client.send("m1")).conversation
    await client.tap.wait(
        lambda: any(e.delta.get("role") == "user" for e in client.tap.events[cid])
    )
    reply = await client.control(cid, "cancel_queued", content="m1")
    assert not reply.ok and "already started" in reply.detail
    await client.tap.wait_turn_ends(cid, 1)
    msgs = (await client.state(cid)).messages
    assert [m.content for m in msgs if m.role == "user"] == ["m1"]
    assert msgs[-1].role == "assistant" and msgs[-1].content == "r1"
    # a second identical message queued twice: one cancel drops one of them, not both
    fake_engine.push(text_reply("r2", delay_s=0.5), text_reply("r3"))
    await client.send("go", cid)
    await client.send("again", cid)
    await client.send("again", cid)
    assert (await client.control(cid, "cancel_queued", content="again")).ok
    await client.tap.wait_turn_ends(cid, 3)
    users = [m.content for m in (await client.state(cid)).messages if m.role == "user"]
    assert users == ["m1", "go", "again"]


async def test_cancel_queued_needs_the_content(chat, client, fake_engine):
    fake_engine.push(text_reply("r1"))
    cid, _ = await client.turn("m1")
    reply = await client.control(cid, "cancel_queued")
    assert reply.error is not None and "content" in reply.error.message
