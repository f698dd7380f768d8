"""Persistence and ownership: one sealed blob, restarts, kill -9, fenced writes, forwarding."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis.asyncio as aioredis

from loki_chat.conversation import Conversation
from loki_chat.errors import FencedWrite
from loki_chat.store import NO_LOG, Store, conv_key
from loki_shared.messages.chat import (
    REMINDER_KINDS,
    ChatMessage,
    LokiMeta,
    ReplayRequest,
    SendRequest,
    StateRequest,
)
from loki_shared.sealing import service_sealer
from tests.chat.helpers import SECRET
from tests.fakes.fake_engine import Stream, chunk, text_reply, tool_reply


async def test_blob_is_sealed_and_restart_loses_nothing(
    chat_runner, supervisor, client, fake_engine, redis_db
):
    svc = await chat_runner.start()
    fake_engine.push(tool_reply([("c0", "ping", "")], content="Checking"), text_reply("Done"))
    cid, _ = await client.turn("Secret plans")
    before = await client.state(cid)
    events = (await client.replay(cid)).events
    r = aioredis.Redis.from_url(redis_db)
    blob = await r.get(conv_key(cid))
    assert b"Secret plans" not in blob and blob[0] == 1  # sealed (AES-GCM, version 1)
    await r.aclose()
    await chat_runner.stop(svc)
    await chat_runner.start()
    after = await client.state(cid)
    assert [m.model_dump() for m in after.messages] == [m.model_dump() for m in before.messages]
    assert (await client.replay(cid)).events == events
    assert (await client.replay(cid, after_seq=3)).events == events[3:]


async def test_fenced_write_refused_after_lock_taken_over(redis_db, tmp_path):
    sealer = service_sealer(tmp_path, SECRET)
    ra, rb = aioredis.Redis.from_url(redis_db), aioredis.Redis.from_url(redis_db)
    a = Store(ra, sealer, "a", lock_ttl_s=0.6)
    b = Store(rb, sealer, "b", lock_ttl_s=0.6)
    conv = Conversation(id="c1")
    va = await a.try_acquire("c1")
    await a.save(conv, va)
    assert await b.try_acquire("c1") is None and await b.owner("c1") == "a"
    await asyncio.sleep(0.8)  # a is paused past its lock's expiry
    vb = await b.try_acquire("c1")
    assert vb and int(vb.split("|")[1]) > int(va.split("|")[1])  # a newer fencing token
    conv.title = "stale write"
    try:
        await a.save(conv, va)
        raise AssertionError("stale owner wrote")
    except FencedWrite:
        pass
    assert (await b.load("c1")).title == ""
    await ra.aclose()
    await rb.aclose()


async def test_second_instance_forwards_to_the_owner(chat_runner, supervisor, fake_engine, client):
    a = await chat_runner.start()
    b = await chat_runner.start()
    fake_engine.push(
        Stream(frames=[chunk({"content": f"t{i} "}) for i in range(30)], delay_s=0.03),
        text_reply("second"),
    )
    first = await a.send(SendRequest(content="one"))
    cid = first.conversation
    await client.tap.wait(lambda: len(client.tap.text(cid)) > 0)
    state = await b.state(StateRequest(conversation=cid))  # b does not own it: forwarded
    assert state.generating and state.error is None
    queued = await b.send(SendRequest(conversation=cid, content="two"))
    assert queued.queued and queued.error is None
    assert cid in a.actors and cid not in b.actors
    await client.tap.wait_turn_ends(cid, 2)
    users = [m.content for m in (await client.state(cid)).messages if m.role == "user"]
    assert users == ["one", "two"]


async def test_a_replay_asked_of_another_instance_reads_nothing_of_the_stored_log(
    chat_runner, supervisor, fake_engine, client
):
    """A conversation kept for months has a long stored log: an instance that does not own it
    forwards a replay to the owner before reading anything (it used to load the whole
    conversation first, at every SSE resume: a cost that grew with the conversation's age);
    with no owner, a replay after a seq opens only the chunks after it."""
    a = await chat_runner.start()
    b = await chat_runner.start()
    fake_engine.push(text_reply("first answer"), text_reply("second answer"))
    first = await a.send(SendRequest(content="one"))
    cid = first.conversation
    await client.tap.wait_turn_ends(cid, 1)
    await a.send(SendRequest(conversation=cid, content="two"))
    await client.tap.wait_turn_ends(cid, 2)
    assert cid in a.actors and cid not in b.actors
    loads: list[tuple[str, int | None]] = []
    real_load = b.store.load

    async def counted(conv_id: str, log_after: int | None = None):
        loads.append((conv_id, log_after))
        return await real_load(conv_id, log_after)

    b.store.load = counted  # type: ignore[method-assign]
    whole = await a.replay(ReplayRequest(conversation=cid, after_seq=0))
    forwarded = await b.replay(ReplayRequest(conversation=cid, after_seq=3))
    assert forwarded.error is None and loads == []  # the owner answered; b read nothing
    assert [e.seq for e in forwarded.events] == [e.seq for e in whole.events if e.seq > 3]
    state = await b.state(StateRequest(conversation=cid))
    assert state.error is None and [m.content for m in state.messages if m.role == "user"] == [
        "one",
        "two",
    ]
    assert loads == [(cid, NO_LOG)]  # the state needs no event of the log
    # no owner any more (a stopped): b reads the stored conversation, only what is new
    await chat_runner.stop(a)
    loads.clear()
    stored = await b.replay(ReplayRequest(conversation=cid, after_seq=whole.last_seq - 2))
    assert [e.seq for e in stored.events] == [whole.last_seq - 1, whole.last_seq]
    assert loads == [(cid, whole.last_seq - 2)] and cid not in b.actors


async def test_kill_9_mid_turn_loses_nothing_persisted(
    nats_url, redis_db, tmp_path, supervisor, fake_engine, client, chat_runner
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_REDIS_URL=redis_db,
        LOKI_HOME=str(tmp_path / "h"),
        LOKI_SECRET_KEY=SECRET,
        LOKI_LOCK_TTL_S="2",
        LOKI_INSTANCE_ID="doomed",
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "loki_chat"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        fake_engine.push(
            text_reply("first answer"),
            Stream(frames=[chunk({"content": f"p{i} "}) for i in range(400)], delay_s=0.02),
        )
        deadline = time.monotonic() + 20
        while True:  # wait for the subprocess to serve
            try:
                cid, _ = await client.turn("first", timeout=10)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await client.send("second", cid)
        n0 = len(client.tap.events[cid])
        await client.tap.wait(lambda: len(client.tap.events[cid]) > n0 + 5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await chat_runner.start()  # another instance takes over once the lock expires
    state = await client.state(cid)
    assert state.error is None
    roles = [m.role for m in state.messages]
    assert roles == ["system", "user", "assistant", "user"]  # no half-written message
    assert [m.content for m in state.messages[1:]] == ["first", "first answer", "second"]
    replayed = (await client.replay(cid)).events
    ends = [e for e in replayed if (e.loki or {}).get("event") == "turn_end"]
    assert ends[-1].loki.get("interrupted") and not state.generating
    # no seq seen live before the crash is given to another event
    live_seqs = [e.seq for e in client.tap.events[cid]]
    assert len(live_seqs) == len(set(live_seqs))
    fake_engine.push(text_reply("third answer"))
    await client.turn("third", cid)
    sent = fake_engine.requests[-1].json["messages"]
    roles = [m["role"] for m in sent]
    assert all(not (x == y == "user") for x, y in zip(roles, roles[1:]))
    assert sent[-1]["content"] == "second\n\nthird"
    assert json.loads(fake_engine.requests[1].body)["messages"][:3] == sent[:3]


@pytest.mark.parametrize("release_answered", [True, False], ids=["answered", "silent"])
async def test_sigterm_mid_turn_keeps_partial_and_frees_the_lock(
    nats_url, redis_db, tmp_path, supervisor, fake_engine, client, chat_runner, release_answered
):
    """SIGTERM mid-reply: the process exits 0 within its stop budget, the partial reply is
    persisted (``stopped``) and the lock released, whether the supervisor answers the turn's
    lease release or not (silent: a whole stack stopping at once; the release waits 5 s for
    an answer, more than the budget's share for the turns, so it must not come first)."""
    supervisor.silent_release = not release_answered
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_REDIS_URL=redis_db,
        LOKI_HOME=str(tmp_path / "h"),
        LOKI_SECRET_KEY=SECRET,
        LOKI_LOCK_TTL_S="30",
        LOKI_STOP_TIMEOUT_S="6",  # 3 s for the turns: less than a release's 5 s wait
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "loki_chat"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fake_engine.push(
            Stream(frames=[chunk({"content": f"s{i} "}) for i in range(400)], delay_s=0.02)
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                reply = await client.send("go")
                assert reply.error is None
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        cid = reply.conversation
        await client.tap.wait(lambda: len(client.tap.text(cid)) > 10)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 15) == 0  # the fakes answer meanwhile
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await chat_runner.start()
    t0 = time.monotonic()
    state = await client.state(cid)
    assert time.monotonic() - t0 < 5  # the lock was released, not waited out (30 s)
    last = state.messages[-1]
    assert last.role == "assistant" and last.loki.stopped and last.content.startswith("s0 ")
    # the dying process's last event may reach this subscriber a moment after its exit
    assert (await client.tap.wait_turn_ends(cid))[-1].finish_reason == "stopped"


@pytest.mark.parametrize("kind", REMINDER_KINDS)
async def test_takeover_removes_a_reminder_a_dead_owner_left_unanswered(
    chat_runner, supervisor, client, fake_engine, kind
):
    """A turn left open by a dead owner, ending with an injected reminder of any canonical
    kind: the instance that takes the conversation over closes the turn and removes the
    reminder before the next request (a summary, an injected message of another kind,
    stays)."""
    svc = await chat_runner.start()
    store = svc.shared.store
    conv = Conversation(id="dead-owner")
    conv.messages = [
        ChatMessage(role="user", content="Earlier", loki=LokiMeta(injected="summary")),
        ChatMessage(role="assistant", content="ok"),
        ChatMessage(role="user", content="Question"),
        ChatMessage(role="assistant", content="An answer"),
        ChatMessage(role="user", content=f"[Loki] {kind}", loki=LokiMeta(injected=kind)),
    ]
    conv.turn_open = True
    value = await store.try_acquire(conv.id)
    await store.save(conv, value)
    await store.release(conv.id, value)
    fake_engine.push(text_reply("next answer"))
    assert (await client.send("next", conv.id)).error is None
    interrupted, end = await client.tap.wait_turn_ends(conv.id, 2)
    assert interrupted.loki.get("interrupted") and interrupted.finish_reason == "error"
    assert end.finish_reason == "stop"
    sent = [m["content"] for m in fake_engine.requests[0].json["messages"][1:]]
    assert sent == ["Earlier", "ok", "Question", "An answer", "next"]
    stored = (await client.state(conv.id)).messages
    assert [m.content for m in stored[1:]] == [*sent, "next answer"]


async def test_turn_that_raises_ends_with_an_error_event_and_the_queue_goes_on(
    chat_runner, supervisor, client, fake_engine
):
    """Issue 22 (chaos run, Redis restarted mid-turn): a persist that raises inside the turn
    loop used to end the turn with no end event at all (a client waited forever). Now the
    turn ends with an error end, written once Redis answers again, and the next turn runs."""
    import redis.exceptions

    svc = await chat_runner.start()
    store = svc.shared.store
    real_save = store.save
    calls = {"n": 0, "failing": 0}

    async def flaky_save(conv, lock_value):
        calls["n"] += 1
        if calls["n"] >= 4 and calls["failing"] < 2:  # after the turn began: a write, a retry
            calls["failing"] += 1
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return await real_save(conv, lock_value)

    store.save = flaky_save
    fake_engine.push(tool_reply([("c0", "ping", "")], content="Checking"), text_reply("Done"))
    cid, end = await client.turn("first", timeout=30)
    assert end.finish_reason == "error"
    assert "turn failed: ConnectionError" in (end.loki or {}).get("error", "")
    assert calls["failing"] == 2
    _, end2 = await client.turn("second", cid, timeout=30)  # gets the reply left queued
    assert end2.finish_reason == "stop"
    ends = [e for e in (await client.replay(cid)).events if e.finish_reason]
    assert [e.finish_reason for e in ends] == ["error", "stop"]  # one end per turn, in the log
    state = await client.state(cid)
    assert state.messages[-1].content == "Done" and not state.generating
