"""Following the memory key (:class:`loki_shared.memkey.MemoryKeyFollower`) on a real NATS and
Redis: ``loki.memory.key`` events and ``loki.memory.status`` answers are applied once per
change, a key that does not match the stored check value is refused, and no answer keeps the
state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import nats
import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from redis.asyncio import Redis

from loki_shared import memkey, subjects
from loki_shared.messages.memory import MemoryKeyEvent, MemoryStatusReply

LOG = "loki.test.memkey"


@dataclass
class Seen:
    """What ``on_key`` was handed, in order."""

    keys: list[bytes | None] = field(default_factory=list)

    async def __call__(self, key: bytes | None) -> None:
        self.keys.append(key)


@dataclass
class Rig:
    follower: memkey.MemoryKeyFollower
    seen: Seen
    nc: NATS
    key: bytes


@pytest.fixture
async def rig(nats_url: str, redis_db: str) -> AsyncIterator[Rig]:
    """A follower subscribed on a started broker, a stored KDF record, its key, and a raw
    NATS connection playing the gateway."""
    redis = Redis.from_url(redis_db)
    params, key = memkey.new_params("correct horse", n=2**10)
    await redis.set(memkey.KDF_REDIS_KEY, params.to_json())
    broker = NatsBroker(nats_url)
    seen = Seen()
    follower = memkey.MemoryKeyFollower(broker, redis, seen, logging.getLogger(LOG))
    follower.subscribe()
    await broker.start()
    nc = await nats.connect(nats_url)
    try:
        yield Rig(follower, seen, nc, key)
    finally:
        await nc.drain()
        await broker.stop()
        await redis.aclose()


async def _event(nc: NATS, state: str, key: bytes | None) -> None:
    event = MemoryKeyEvent(state=state, key_b64=memkey.b64(key) if key else None)  # type: ignore[arg-type]
    await nc.publish(subjects.MEMORY_KEY, event.model_dump_json().encode())
    await nc.flush()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 10 s")


async def _settle() -> None:
    await asyncio.sleep(0.2)  # time for an event that should change nothing to arrive


async def test_events_are_applied_once_per_change(rig: Rig) -> None:
    await _event(rig.nc, "unlocked", rig.key)
    await _until(lambda: rig.seen.keys == [rig.key])
    assert rig.follower.key_id == memkey.key_id(rig.key)
    await _event(rig.nc, "unlocked", rig.key)  # the same key again: nothing changes
    await _event(rig.nc, "locked", None)
    await _until(lambda: len(rig.seen.keys) == 2)
    await _event(rig.nc, "off", None)  # not held before either
    await _settle()
    assert rig.seen.keys == [rig.key, None] and rig.follower.key_id is None


async def test_a_key_that_does_not_match_is_refused_and_the_state_kept(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOG)
    await rig.follower.apply("unlocked", memkey.b64(rig.key))
    await _event(rig.nc, "unlocked", b"w" * 32)
    await _event(rig.nc, "unlocked", b"short")
    await rig.nc.publish(subjects.MEMORY_KEY, b"{not json")
    await _settle()
    await rig.follower.apply("unlocked", "%%% not base64")
    assert rig.seen.keys == [rig.key] and rig.follower.key_id == memkey.key_id(rig.key)
    logged = [r.getMessage() for r in caplog.records if r.name == LOG]
    assert logged.count("memory key refused: it does not match the stored check value") == 2
    assert "memory key refused: Error" in logged  # binascii.Error
    assert "unreadable loki.memory.key event ignored" in logged
    assert "memory unlocked" in logged
    assert not any(memkey.b64(rig.key) in line for line in logged)


async def test_ask_takes_the_gateways_answer_and_no_answer_keeps_the_state(rig: Rig) -> None:
    await rig.follower.ask(timeout=0.2)  # nobody answers: nothing happens, nothing raised
    assert rig.seen.keys == []
    answers = [
        MemoryStatusReply(state="unlocked", key_b64=memkey.b64(rig.key)),
        MemoryStatusReply(state="locked", error={"type": "unavailable", "message": "x"}),  # type: ignore[arg-type]
        MemoryStatusReply(state="locked"),
    ]

    async def gateway(msg: Msg) -> None:
        await msg.respond(answers.pop(0).model_dump_json().encode())

    sub = await rig.nc.subscribe(subjects.MEMORY_STATUS, cb=gateway)
    await rig.nc.flush()
    try:
        await rig.follower.ask(timeout=10)
        assert rig.seen.keys == [rig.key]
        await rig.follower.ask(timeout=10)  # an error reply keeps the state
        assert rig.seen.keys == [rig.key]
        await rig.follower.ask(timeout=10)
        assert rig.seen.keys == [rig.key, None]
    finally:
        await sub.unsubscribe()


async def test_follow_asks_and_catches_up_until_cancelled(rig: Rig) -> None:
    asked: list[int] = []

    async def gateway(msg: Msg) -> None:
        asked.append(1)
        reply = MemoryStatusReply(state="unlocked", key_b64=memkey.b64(rig.key))
        await msg.respond(reply.model_dump_json().encode())

    sub = await rig.nc.subscribe(subjects.MEMORY_STATUS, cb=gateway)
    await rig.nc.flush()
    caught_up: list[int] = []

    async def then() -> None:
        caught_up.append(len(asked))

    follow: Awaitable[None] = rig.follower.follow(0.01, then=then)
    task = asyncio.ensure_future(follow)
    try:
        await _until(lambda: len(caught_up) >= 3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.unsubscribe()
    assert caught_up[:3] == [1, 2, 3]  # each catch-up after its question
    assert rig.seen.keys == [rig.key]  # the same answer each time: one change
    assert task.cancelled()
