"""The preset store on a real Redis: sealing of the external key, empty key keeps it, the
env preset and its override, validation."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from loki_shared.messages.engine import Preset
from loki_shared.sealing import Sealer
from loki_supervisor.errors import InvalidRequest, NotFound
from loki_supervisor.presets import PRESETS_KEY, PresetStore


@pytest.fixture
async def store(redis_db):
    client = Redis.from_url(redis_db)
    yield PresetStore(client, Sealer(b"k" * 32), Preset(id="env", name="Env", ctx=4096))
    await client.aclose()


EXTERNAL = {
    "id": "ext",
    "external": True,
    "base_url": "https://api.example.test/v1",
    "api_model": "m1",
    "api_key": "sk-secret-1",
}


async def test_external_key_is_sealed_and_kept_when_empty(store):
    saved = await store.save(EXTERNAL)
    assert saved.api_key is None and saved.api_key_set
    raw = await store.redis.hget(PRESETS_KEY, "ext")
    assert b"sk-secret-1" not in raw
    assert await store.api_key("ext") == "sk-secret-1"
    await store.save({**EXTERNAL, "api_key": "", "api_model": "m2"})
    assert await store.api_key("ext") == "sk-secret-1"
    assert (await store.get("ext")).api_model == "m2"
    await store.save({**EXTERNAL, "api_key": None})
    assert await store.api_key("ext") == "sk-secret-1"
    await store.save({**EXTERNAL, "api_key": "sk-secret-2"})
    assert await store.api_key("ext") == "sk-secret-2"
    # A sealed key copied under another preset does not open there.
    await store.redis.hset(PRESETS_KEY, "copy", raw.replace(b'"ext"', b'"copy"'))
    assert await store.api_key("copy") is None


async def test_env_preset_listed_overridden_and_restored(store):
    assert [p.id for p in await store.list()] == ["env"]
    assert await store.active_id() == "env"
    await store.save({"id": "env", "name": "Env", "ctx": 1024})
    assert (await store.get("env")).ctx == 1024
    await store.delete("env")
    assert (await store.get("env")).ctx == 4096
    with pytest.raises(NotFound):
        await store.get("nope")
    await store.set_active("gone")
    assert await store.active_id() == "env"


async def test_new_preset_gets_an_id(store):
    saved = await store.save({"name": "Mine", "ctx": 2048})
    assert saved.id and saved.name == "Mine"
    assert saved.id in [p.id for p in await store.list()]


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "a b"},
        {"id": "x", "ctx": 100},
        {"id": "x", "ngl": "lots"},
        {"id": "x", "model": "/no/such/model.gguf"},
        {"id": "x", "features": {"CACHE_RAM": "-5"}},
        {"id": "x", "features": {"CHAT_TEMPLATE_FILE": "/no/such/template.jinja"}},
        {"id": "x", "external": True, "base_url": "ftp://x", "api_model": "m"},
        {"id": "x", "external": True, "base_url": "https://x"},
        {"id": "x", "ctx": "many"},
        {"id": "x", "max_tokens": 0},
    ],
)
async def test_invalid_presets_are_refused(store, bad):
    with pytest.raises(InvalidRequest):
        await store.save(bad)
