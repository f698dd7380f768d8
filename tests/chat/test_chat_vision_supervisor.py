"""End to end with the real engine supervisor: a stored preset whose ``MMPROJ`` is the
random-weight projector of :mod:`fakes.mmproj` is launched as llama-server ``--mmproj``;
``/props`` reports vision, every lease says ``vision``, and an image turn of the chat service
(KEEP_TURN_IMAGES on) goes through it, its cost measured by the engine."""

from __future__ import annotations

import json

import httpx
import pytest
import redis

from loki_shared import servers, subjects
from loki_shared.messages.engine import Lease, LeaseRequest, Preset, ReleaseReply, ReleaseRequest
from loki_supervisor.engine_process import read_props
from loki_supervisor.presets import ACTIVE_KEY, PRESETS_KEY
from tests.engine.conftest import engine_env, supervisor_factory, wait_info
from tests.fakes.mmproj import text_embedding_width, write_mmproj

from .test_chat_vision_engine import IMAGE, _send

pytestmark = pytest.mark.engine
__all__ = ["engine_env", "supervisor_factory"]  # the engine tests' fixtures


async def test_vision_preset_launched_leased_and_used_by_a_turn(
    engine_env, supervisor_factory, chat_runner, client, tmp_path
):
    proj = tmp_path / "mmproj.gguf"
    image_tokens = write_mmproj(proj, text_embedding_width(servers.find_bundled_model()))
    preset = Preset(id="vision", name="Vision test", ctx=2048, features={"MMPROJ": str(proj)})
    with redis.Redis.from_url(engine_env["LOKI_REDIS_URL"]) as r:
        r.hset(
            PRESETS_KEY, "vision", json.dumps(preset.model_dump(exclude={"api_key", "api_key_set"}))
        )
        r.set(ACTIVE_KEY, "vision")
    sup = supervisor_factory(engine_env)
    info = await wait_info(client.nc, lambda i: i.state == "ready", timeout=180, sup=sup)
    argv = info.argv
    assert argv[argv.index("--mmproj") + 1] == str(proj), argv
    assert info.vision is True
    async with httpx.AsyncClient() as http:
        assert (await read_props(http, info.base_url, None)).vision is True
    raw = await client.nc.request(
        subjects.ENGINE_LEASE, LeaseRequest(kind="main", wait_s=30).model_dump_json().encode(), 35
    )
    lease = Lease.model_validate_json(raw.data)
    assert lease.error is None and lease.vision is True
    raw = await client.nc.request(
        subjects.ENGINE_RELEASE, ReleaseRequest(lease_id=lease.lease_id).model_dump_json().encode()
    )
    assert ReleaseReply.model_validate_json(raw.data).ok

    await chat_runner.start(
        tools=False, max_tokens=4, temperature=0.0, keep_turn_images=True, tokenize_timeout_s=10.0
    )
    cid, end = await _send(client, "What colour is this?", [IMAGE])
    assert end.finish_reason in ("stop", "length"), end.loki
    state = await client.state(cid)
    [part] = [p for p in state.messages[1].content if p["type"] == "image_url"]
    assert image_tokens <= part["loki_cost"] <= image_tokens + 8 and part["loki_kept"] is True
    print("supervisor vision figures:", end.usage, end.timings, "cost", part["loki_cost"])
