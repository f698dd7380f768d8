"""KEEP_TURN_IMAGES on the real llama-server (the bundled SmolLM2 plus the random-weight
projector of :mod:`fakes.mmproj`): the same three turns with the key off and on. Off, the
image leaves after its turn (the next turn reuses the cache up to where it was only); on,
it is sent again in every later turn, its cost measured by the engine, and each turn reuses
the whole previous prompt, the image's tokens included."""

from __future__ import annotations

import pytest

from loki_chat.images import marker

from .test_chat_vision_engine import IMAGE, _send, vision_engine, vision_supervisor

pytestmark = pytest.mark.engine
__all__ = ["vision_engine", "vision_supervisor"]  # fixtures shared with the ephemeral test

#: what the test reports (pytest -s prints it)
FIGURES: dict[str, dict[str, int]] = {}


def image_part(message) -> dict | None:
    content = message.content
    parts = [p for p in content if p["type"] == "image_url"] if isinstance(content, list) else []
    return parts[0] if parts else None


async def three_turns(chat_runner, client, keep: bool) -> tuple[str, list]:
    service = await chat_runner.start(
        tools=False,
        max_tokens=4,
        temperature=0.0,
        keep_turn_images=keep,
        tokenize_timeout_s=10.0,
    )
    cid, first = await _send(client, "What colour is this?", [IMAGE])
    _, second = await _send(client, "And now?", [], cid)
    _, third = await _send(client, "Once more.", [], cid)
    state = await client.state(cid)
    await chat_runner.stop(service)
    ends = [first, second, third]
    for end in ends:
        assert end.finish_reason in ("stop", "length"), end.loki
    FIGURES["on" if keep else "off"] = {
        **{f"turn{n}_prompt": e.usage["prompt_tokens"] for n, e in enumerate(ends, 1)},
        **{f"turn{n}_cache_n": e.timings["cache_n"] for n, e in enumerate(ends, 1)},
    }
    return cid, [state, *ends]


async def test_keep_turn_images_on_and_off_cost_and_cache(
    chat_runner, vision_supervisor, vision_engine, client
):
    _, image_tokens = vision_engine
    # off: the marker from the next turn on; the cache is cut where the image was
    _, (state, first, second, third) = await three_turns(chat_runner, client, keep=False)
    assert state.messages[1].content == "What colour is this?\n\n" + marker(IMAGE.name)
    assert second.timings["cache_n"] < first.usage["prompt_tokens"]
    assert third.timings["cache_n"] >= second.usage["prompt_tokens"]

    # on: kept by reference, its cost measured, sent again each turn, cache reused whole
    _, (state, first, second, third) = await three_turns(chat_runner, client, keep=True)
    part = image_part(state.messages[1])
    assert part is not None and part["loki_kept"] is True and part["image_url"] == {"url": ""}
    cost = part["loki_cost"]
    FIGURES["on"]["measured_cost"] = cost
    FIGURES["on"]["projector_tokens"] = image_tokens
    print("kept images figures:", FIGURES)
    assert image_tokens <= cost <= image_tokens + 8, (cost, image_tokens)
    # turn 2 reuses all of turn 1's prompt, image included: it was sent again as it was
    # (with the marker instead, the cache would stop where the image was, as above)
    assert second.timings["cache_n"] >= first.usage["prompt_tokens"]
    assert third.timings["cache_n"] >= second.usage["prompt_tokens"]
