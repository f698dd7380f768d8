"""Images on the real llama-server: the bundled SmolLM2 model with a tiny random-weight vision
projector written by the test (:mod:`tests.fakes.mmproj`). Answers mean nothing; image
decoding, the image tokens in ``prompt_tokens`` and the prompt cache are the engine's own."""

from __future__ import annotations

import base64

import httpx
import pytest

from loki_shared import servers
from loki_shared.messages.chat import ImageAttachment, SendReply, SendRequest
from loki_supervisor.engine_process import read_props
from tests.fakes.fake_supervisor import FakeSupervisor
from tests.fakes.media import png
from tests.fakes.mmproj import text_embedding_width, write_mmproj

pytestmark = pytest.mark.engine

URL = "data:image/png;base64," + base64.b64encode(png(16, 16, (20, 120, 220))).decode()
IMAGE = ImageAttachment(id="c" * 32, name="blue.png", url=URL)
#: what the test reports (pytest -s prints it; the lead copies the figures into the report)
FIGURES: dict[str, int] = {}


@pytest.fixture(scope="module")
def vision_engine(tmp_path_factory):
    where = tmp_path_factory.mktemp("vision")
    proj = where / "mmproj.gguf"
    tokens = write_mmproj(proj, text_embedding_width(servers.find_bundled_model()))
    server = servers.start_llama(extra=["--mmproj", str(proj)], data_dir=where)
    yield server.url, tokens
    server.process.stop()


@pytest.fixture
async def vision_supervisor(nc, vision_engine):
    sup = await FakeSupervisor(nc, vision_engine[0], n_ctx=4096, model="", vision=True).start()
    yield sup
    await sup.stop()


async def test_engine_with_a_projector_reports_vision(vision_engine):
    async with httpx.AsyncClient() as http:
        props = await read_props(http, vision_engine[0], None)
    assert props.vision is True


async def _send(client, text: str, images: list[ImageAttachment], cid: str | None = None):
    before = len(client.tap.turn_ends(cid)) if cid else 0
    raw = await client.nc.request(
        "loki.chat.send",
        SendRequest(conversation=cid, content=text, images=images).model_dump_json().encode(),
        timeout=10,
    )
    reply = SendReply.model_validate_json(raw.data)
    assert reply.error is None, reply.error
    ends = await client.tap.wait_turn_ends(reply.conversation, before + 1, 180)
    return reply.conversation, ends[-1]


async def test_image_turn_on_the_real_engine_cost_and_cache(
    chat_runner, vision_supervisor, vision_engine, client
):
    """The image reaches the model (its tokens are in ``prompt_tokens``: the measured cost is
    the difference with the same text alone); the next turn sends the marker instead, and the
    turn after it reuses the whole prefix (the marker's text is stable)."""
    _, image_tokens = vision_engine
    await chat_runner.start(tools=False, max_tokens=4, temperature=0.0)
    text = "What colour is this?"
    _, plain = await _send(client, text, [])
    cid, seen = await _send(client, text, [IMAGE])
    assert seen.finish_reason in ("stop", "length"), seen.loki
    cost = seen.usage["prompt_tokens"] - plain.usage["prompt_tokens"]
    FIGURES.update(image_tokens=image_tokens, measured_cost=cost)
    assert image_tokens <= cost <= image_tokens + 8, (cost, image_tokens)
    _, second = await _send(client, "And now?", [], cid)
    _, third = await _send(client, "Once more.", [], cid)
    FIGURES.update(
        turn1_prompt=seen.usage["prompt_tokens"],
        turn2_prompt=second.usage["prompt_tokens"],
        turn2_cache=second.timings["cache_n"],
        turn3_prompt=third.usage["prompt_tokens"],
        turn3_cache=third.timings["cache_n"],
    )
    print("vision figures:", FIGURES)
    # turn 2: the image left the history, so the cache holds up to where it was only
    assert second.timings["cache_n"] < seen.usage["prompt_tokens"]
    # turn 3: everything of turn 2's prompt is reused (the marker is stable text)
    assert third.timings["cache_n"] >= second.usage["prompt_tokens"]
