"""What the memory service stores is sealed: no page, description, instructions, tracker name
or value in the clear in Redis; with the memory encrypted, private records are sealed again
with the memory key, and a locked memory refuses them with ``locked``."""

from __future__ import annotations

import asyncio
import base64

import pytest
from nats.aio.client import Client as NATS
from redis.asyncio import Redis

from loki_memory.service import MemoryService
from loki_shared import errors, memkey, subjects
from loki_shared.messages.memory import MemoryKeyEvent
from loki_shared.projects_client import ProjectsClient

SECRETS = [b"Zanzibar", b"zanzibar", b"Quixotic", b"plumbago", b"tomatoes", b"98.25", b"furlongs"]


async def _fill(client: ProjectsClient, pid: str) -> None:
    await client.update_project(pid, description="Quixotic plans", instructions="plumbago")
    await client.write_page(pid, "Zanzibar", "# Zanzibar\ntomatoes", "Zanzibar trip")
    await client.log_value(pid, "Zanzibar", 98.25, unit="furlongs", note="tomatoes")


async def _everything(redis: Redis) -> bytes:
    out = []
    for key in await redis.keys("*"):
        out.append(key)
        kind = await redis.type(key)
        if kind == b"hash":
            for field, value in (await redis.hgetall(key)).items():
                out += [field, value]
        elif kind == b"list":
            out += await redis.lrange(key, 0, -1)
        elif kind == b"string":
            out.append(await redis.get(key))
    return b"\n".join(out)


async def test_nothing_in_the_clear(client: ProjectsClient, redis: Redis) -> None:
    await _fill(client, "default")
    stored = await _everything(redis)
    assert b"loki:projects:pages:default" in stored
    for secret in SECRETS:
        assert secret not in stored, secret
    block = await client.block("default")
    assert block.description == "Quixotic plans" and block.instructions == "plumbago"


async def _set_key(nc: NATS, memory: MemoryService, state: str, key: bytes | None) -> None:
    event = MemoryKeyEvent(state=state, key_b64=base64.b64encode(key).decode() if key else None)  # type: ignore[arg-type]
    await nc.publish(subjects.MEMORY_KEY, event.model_dump_json().encode())
    for _ in range(100):
        if (memory.store.vault.memory is not None) == (key is not None):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the memory key event was not applied")


async def test_encrypted_memory_seals_with_the_key_and_locked_refuses(
    client: ProjectsClient, memory: MemoryService, nc: NATS, redis: Redis
) -> None:
    await client.write_page("default", "before", "written before encryption")
    params, key = memkey.new_params("correct horse", n=2**10)
    await redis.set(memkey.KDF_REDIS_KEY, params.to_json())

    # encrypted, key not held: locked
    for call in (
        client.read_page("default", "before"),
        client.write_page("default", "x", "y"),
        client.block("default"),
        client.list_pages("default"),
        client.log_value("default", "w", 1),
        client.read_tracker("default", "w"),
        client.update_project("default", description="d"),
        client.export_project("default"),
    ):
        with pytest.raises(errors.Locked, match="unlock"):
            await call
    # names stay readable, renaming and deleting work; the project says it is locked
    listed = await client.list_projects()
    assert [(p.id, p.locked) for p in listed.projects] == [("default", True)]
    assert (await client.create_project("Trip")).locked

    # a key that does not match the check value is refused
    await nc.publish(
        subjects.MEMORY_KEY,
        MemoryKeyEvent(state="unlocked", key_b64=base64.b64encode(b"\0" * 32).decode())
        .model_dump_json()
        .encode(),
    )
    await asyncio.sleep(0.2)
    assert memory.store.vault.memory is None

    await _set_key(nc, memory, "unlocked", key)
    await _fill(client, "trip")
    assert (await client.read_page("default", "before")).content == "written before encryption"
    stored = await _everything(redis)
    for secret in SECRETS:
        assert secret not in stored, secret
    # the trip's records open with the service key only to an inner blob sealed again
    vault = memory.store.vault
    field = vault.field("trip", "zanzibar.md")
    blob = await redis.hget("loki:projects:pages:trip", field)
    inner = vault._sealer.open(blob, f"loki:projects:pages:trip:{field}".encode())
    assert inner[:1] == b"M" and b"Zanzibar" not in inner

    await _set_key(nc, memory, "locked", None)
    with pytest.raises(errors.Locked):
        await client.read_page("trip", "zanzibar")
    with pytest.raises(errors.Locked):
        await client.block("trip")
    await _set_key(nc, memory, "unlocked", key)
    block = await client.block("trip")
    assert block.index == ["- [Zanzibar](zanzibar.md) — Zanzibar trip"]
    line = block.trackers["zanzibar"]
    assert line.startswith("- Zanzibar: 98.25 furlongs (20") and line.endswith(") — tomatoes")
