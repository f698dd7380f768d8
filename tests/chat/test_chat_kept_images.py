"""KEEP_TURN_IMAGES on a scripted engine that sees images and counts tokens
(:mod:`fakes.vision_tokens`: 16 tokens an image): images kept by reference, re-read and
checked before each request, measured, within 10% of the window, dropped to the ephemeral
marker when changed, missing or no longer visible to the engine."""

from __future__ import annotations

import base64

import pytest

from loki_chat.image_shelf import ImageShelf
from loki_chat.images import forget_images, marker, user_content
from loki_chat.kept_images import (
    KeptImages,
    drop_kept,
    drop_parts,
    ref_content,
    settle_turn,
    share_cost,
    text_only,
)
from loki_shared import subjects
from loki_shared.messages.chat import ChatMessage, ImageAttachment, SendReply, SendRequest
from tests.fakes.fake_engine import text_reply
from tests.fakes.fake_supervisor import FakeSupervisor
from tests.fakes.media import png
from tests.fakes.vision_tokens import VisionTokenEngine

RED = "data:image/png;base64," + base64.b64encode(png()).decode()
BLUE = "data:image/png;base64," + base64.b64encode(png(8, 8, (0, 0, 255))).decode()
A = ImageAttachment(id="a" * 32, name="red.png", url=RED)
B = ImageAttachment(id="b" * 32, name="blue.png", url=BLUE)


@pytest.fixture
def fake_engine():
    with VisionTokenEngine() as engine:
        yield engine


@pytest.fixture
async def seeing(nc, fake_engine):
    sup = await FakeSupervisor(nc, fake_engine.url, vision=True).start()
    yield sup
    await sup.stop()


async def start(chat_runner, **over):
    return await chat_runner.start(
        **{"tools": False, "keep_turn_images": True, "tokenize_timeout_s": 2.0, **over}
    )


async def send(client, text: str, images: list[ImageAttachment], cid: str | None = None) -> str:
    before = len(client.tap.turn_ends(cid)) if cid else 0
    raw = await client.nc.request(
        subjects.CHAT_SEND,
        SendRequest(conversation=cid, content=text, images=images).model_dump_json().encode(),
        timeout=10,
    )
    reply = SendReply.model_validate_json(raw.data)
    assert reply.error is None, reply.error
    await client.tap.wait_turn_ends(reply.conversation, before + 1, 20)
    return reply.conversation


def sent_user(engine, n: int) -> dict:
    return engine.requests[n].json["messages"][1]


async def test_kept_by_reference_measured_resent_then_changed(
    chat_runner, seeing, fake_engine, client
):
    service = await start(chat_runner)
    fake_engine.push(text_reply("A red square."), text_reply("Still red."), text_reply("Gone."))
    cid = await send(client, "What is this?", [A])
    arriving = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": RED}},
        ],
    }
    assert sent_user(fake_engine, 0) == arriving  # the arriving turn: as the ephemeral rule
    # stored by reference: no data, the hash, the cost the engine's count gave (16 tokens)
    state = await client.state(cid)
    assert "base64" not in state.model_dump_json()
    [part] = [p for p in state.messages[1].content if p["type"] == "image_url"]
    assert part["loki_ref"] == A.id and part["loki_kept"] is True
    assert part["loki_cost"] == VisionTokenEngine.image_tokens
    # the next turn sends the image again, byte for byte (re-read from the shelf)
    await client.turn("And now?", cid)
    assert sent_user(fake_engine, 1) == arriving
    # the shelf's image changed: ephemeral at once, the ephemeral rule's exact text
    shelf: ImageShelf = service.shared.shelf
    await shelf.r.delete(f"loki:chat:img:{cid}")
    await shelf.put(cid, [A.model_copy(update={"url": BLUE})])
    await client.turn("Once more", cid)
    assert sent_user(fake_engine, 2) == {
        "role": "user",
        "content": "What is this?\n\n[image red.png: no longer visible]",
    }
    state = await client.state(cid)
    assert state.messages[1].content == "What is this?\n\n" + marker("red.png")


async def test_a_later_image_is_measured_beside_the_kept_ones(
    chat_runner, seeing, fake_engine, client
):
    """An image sent while another is kept costs its own tokens: the kept one's measured
    cost is taken out of the prompt before the new one is measured (16 each, not 32)."""
    await start(chat_runner)
    fake_engine.push(text_reply("A red square."), text_reply("A blue one."))
    cid = await send(client, "What is this?", [A])
    await send(client, "And this?", [B], cid)
    state = await client.state(cid)
    costs = [
        p.get("loki_cost")
        for m in state.messages
        if isinstance(m.content, list)
        for p in m.content
        if p.get("type") == "image_url"
    ]
    assert costs == [VisionTokenEngine.image_tokens] * 2


async def test_budget_is_ten_percent_of_the_window(chat_runner, nc, fake_engine, client):
    """n_ctx 300: 30 tokens for kept images. Two images of 16 in one message: the first is
    kept, the second would exceed (32): it and the rest of the turn stay ephemeral."""
    sup = await FakeSupervisor(nc, fake_engine.url, vision=True, n_ctx=300).start()
    try:
        await start(chat_runner)
        fake_engine.push(text_reply("Two squares."), text_reply("Yes."))
        cid = await send(client, "Compare.", [A, B])
        await client.turn("Sure?", cid)
        assert sent_user(fake_engine, 1)["content"] == [
            {"type": "text", "text": "Compare."},
            {"type": "image_url", "image_url": {"url": RED}},
            {"type": "text", "text": marker("blue.png")},
        ]
        state = await client.state(cid)
        costs = [p.get("loki_cost") for p in state.messages[1].content if p["type"] == "image_url"]
        assert costs == [16]  # the two shared the measured 32 equally
    finally:
        await sup.stop()


async def test_no_vision_or_no_count_means_markers(chat_runner, seeing, fake_engine, client):
    await start(chat_runner)
    fake_engine.push(text_reply("A red square."), text_reply("Blind now."))
    cid = await send(client, "What is this?", [A])
    seeing.vision = False  # the next lease's endpoint no longer sees images
    await client.turn("And now?", cid)
    assert sent_user(fake_engine, 1)["content"] == "What is this?\n\n" + marker("red.png")


async def test_unmeasurable_cost_stays_ephemeral(chat_runner, seeing, fake_engine, client):
    await start(chat_runner, tokenize_timeout_s=0)  # no exact count: nothing measured
    fake_engine.push(text_reply("A red square."), text_reply("Ok."))
    cid = await send(client, "What is this?", [A])
    await client.turn("And now?", cid)
    assert sent_user(fake_engine, 1)["content"] == "What is this?\n\n" + marker("red.png")


def test_rules_without_engine() -> None:
    # a dropped reference leaves the very text the ephemeral rule writes
    ephemeral = ChatMessage(role="user", content=user_content("Look", [A, B]))
    forget_images([ephemeral])
    kept = ChatMessage(role="user", content=ref_content("Look", [A, B]))
    assert drop_parts(kept, lambda p: True) and kept.content == ephemeral.content
    # settle_turn: unknown cost, the budget's first excess and the rest of the turn
    msg = ChatMessage(role="user", content=ref_content("x", [A, B, A]))
    parts = [p for p in msg.content if p["type"] == "image_url"]
    parts[0]["loki_cost"], parts[1]["loki_cost"], parts[2]["loki_cost"] = 20, 90, 5
    assert settle_turn([msg], {A.id, B.id}, n_ctx=1000) == [A.id]  # 20 kept; 90 > 100-20
    assert [p.get("loki_kept") for p in msg.content if p["type"] == "image_url"] == [True]
    assert drop_kept([msg]) == 20 and msg.content == "x\n\n" + "\n\n".join(
        marker(n) for n in ("red.png", "blue.png", "red.png")
    )
    # the measured difference, shared; below one token an image: unmeasurable
    assert share_cost(150, 100, 18, 2) == 16 and share_cost(101, 100, 0, 2) is None
    body = {"messages": [{"role": "user", "content": [{"type": "image_url"}]}], "tools": []}
    assert text_only(body)["messages"][0]["content"] == "" and text_only(body)["tools"] == []


async def test_shelf_read_and_hash_checked_before_each_request() -> None:
    """A kept reference is re-read at each request; a missing image becomes its marker."""
    msg = ChatMessage(role="user", content=ref_content("x", [A]))
    msg.content[1].update(loki_cost=16, loki_kept=True)
    turn = KeptImages()
    reads = []

    async def shelf():
        reads.append(1)
        return {A.id: A} if len(reads) == 1 else {}

    view, changed = await turn.wire_view([msg], shelf, vision=True)
    assert not changed and view[0].content[1]["image_url"] == {"url": RED}
    assert msg.content[1]["image_url"] == {"url": ""}  # the stored view keeps no data
    view, changed = await turn.wire_view([msg], shelf, vision=True)
    assert changed and msg.content == "x\n\n" + marker("red.png") and len(reads) == 2


async def test_see_image_images_are_kept_and_measured_too(chat_runner, seeing, fake_engine, client):
    """An image ``see_image`` shows is one of the turn's images: measured against the kept
    image already in the request (its known cost subtracted), then kept like it."""
    from loki_chat.tools import see_image_tool
    from tests.fakes.fake_engine import tool_reply

    service = await start(chat_runner, tools=True)
    service.toolbox.add(see_image_tool(service.shared.shelf))
    fake_engine.push(
        text_reply("A red square."),
        tool_reply([("c1", "see_image", '{"path": "red.png"}')]),
        text_reply("Still red."),
        text_reply("Both."),
    )
    cid = await send(client, "Look", [A])
    await client.turn("Look again", cid)
    await client.turn("And now?", cid)
    last = fake_engine.requests[-1].json["messages"]
    sent = [p for m in last if isinstance(m["content"], list) for p in m["content"]]
    assert [p["image_url"]["url"] for p in sent if p["type"] == "image_url"] == [RED, RED]
    state = await client.state(cid)
    parts = [
        p
        for m in state.messages
        if isinstance(m.content, list)
        for p in m.content
        if p["type"] == "image_url"
    ]
    assert [(p["loki_cost"], p["loki_kept"]) for p in parts] == [(16, True), (16, True)]


def test_settling_looks_at_every_image_of_a_message() -> None:
    """An image already kept, not the turn's, or not measured does not end the look at the
    next one of the same message."""
    msg = ChatMessage(role="user", content=ref_content("x", [B, A]))
    first, second = [p for p in msg.content if p["type"] == "image_url"]
    first["loki_cost"], second["loki_cost"] = 30, 20
    assert settle_turn([msg], {A.id}, n_ctx=1000) == [A.id]  # B: not the turn's
    msg = ChatMessage(role="user", content=ref_content("x", [B, A]))
    first, second = [p for p in msg.content if p["type"] == "image_url"]
    second["loki_cost"] = 20  # B not measured
    assert settle_turn([msg], {A.id, B.id}, n_ctx=1000) == [A.id]
    msg = ChatMessage(role="user", content=ref_content("x", [B, A]))
    first, second = [p for p in msg.content if p["type"] == "image_url"]
    first["loki_cost"], second["loki_cost"] = 0, 20  # a cost of 0: not measured either
    assert settle_turn([msg], {A.id, B.id}, n_ctx=1000) == [A.id]


async def test_a_message_whose_images_all_went_keeps_its_place_and_the_rest_follows() -> None:
    msg = ChatMessage(role="user", content=ref_content("x", [A]))
    msg.content[1].update(loki_cost=16, loki_kept=True)
    rest = [ChatMessage(role="assistant", content="Red."), ChatMessage(role="user", content="And?")]

    async def shelf():
        return {}  # the image is gone from the shelf

    view, changed = await KeptImages().wire_view([msg, *rest], shelf, vision=True)
    assert changed and [m.content for m in view] == ["x\n\n" + marker("red.png"), "Red.", "And?"]


async def test_a_measured_image_is_not_measured_again_and_a_turn_starts_with_kept_ones_only():
    msg = ChatMessage(role="user", content=ref_content("x", [A, B]))
    first, second = [p for p in msg.content if p["type"] == "image_url"]
    first.update(loki_cost=16, loki_kept=True)  # A kept and measured; B left by a crash

    async def shelf():
        return {A.id: A, B.id: B}

    KeptImages.start([msg])  # B: its marker
    assert [p.get("loki_ref") for p in msg.content if p.get("type") == "image_url"] == [A.id]
    assert marker("blue.png") in "".join(
        p.get("text", "") for p in msg.content if p.get("type") == "text"
    )
    turn = KeptImages()
    view, _ = await turn.wire_view([msg], shelf, vision=True)
    assert turn.new == []  # A's cost is known: nothing to measure
    assert [p["image_url"]["url"] for p in view[0].content if p.get("type") == "image_url"] == [RED]
