"""Images in the chat service (scripted engine): an image goes to the model as an
``image_url`` part in every step of the turn it arrives, then leaves the history, replaced
by a stable marker, so later turns' requests share their prefix."""

from __future__ import annotations

import base64
import json

from loki_chat.images import forget_images, marker, unpack, user_content
from loki_shared import subjects
from loki_shared.messages.chat import ChatMessage, ImageAttachment, SendReply, SendRequest
from tests.fakes.fake_engine import text_reply, tool_reply
from tests.fakes.media import png

URL = "data:image/png;base64," + base64.b64encode(png()).decode()
IMAGE = ImageAttachment(id="a" * 32, name="red.png", url=URL)


async def _send_with_image(client, text: str, conversation: str | None = None) -> str:
    before = len(client.tap.turn_ends(conversation)) if conversation else 0
    raw = await client.nc.request(
        subjects.CHAT_SEND,
        SendRequest(conversation=conversation, content=text, images=[IMAGE])
        .model_dump_json()
        .encode(),
        timeout=10,
    )
    reply = SendReply.model_validate_json(raw.data)
    assert reply.error is None, reply.error
    await client.tap.wait_turn_ends(reply.conversation, before + 1, 20)
    return reply.conversation


async def test_image_seen_in_its_turn_then_replaced_by_a_stable_marker(chat, client, fake_engine):
    fake_engine.push(
        tool_reply([("c0", "ping", "")], content="Checking."),
        text_reply("A red square."),
        text_reply("Still here."),
        text_reply("Third."),
    )
    cid = await _send_with_image(client, "What is this?")
    first, second = (r.json["messages"] for r in fake_engine.requests[:2])
    expected = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": URL}},  # Loki's marks never sent
    ]
    assert first[1] == {"role": "user", "content": expected}
    assert second[1] == first[1]  # every step of the arriving turn sees the image
    # the display log keeps the text and names the image (thumbnail by id), no data URL
    user_events = [e for e in client.tap.events[cid] if (e.loki or {}).get("event") == "user"]
    assert user_events[0].delta == {"role": "user", "content": "What is this?"}
    assert user_events[0].loki["images"] == [{"id": IMAGE.id, "name": "red.png"}]
    # the history after the turn: the marker, no image
    state = await client.state(cid)
    stored = [m for m in state.messages if m.role == "user"][0]
    assert stored.content == "What is this?\n\n" + marker("red.png")
    assert "base64" not in state.model_dump_json()

    _, _ = await client.turn("And now?", cid)
    _, _ = await client.turn("Once more", cid)
    third, fourth = (r.json["messages"] for r in fake_engine.requests[2:4])
    assert third[1] == {
        "role": "user",
        "content": "What is this?\n\n[image red.png: no longer visible]",
    }
    assert fourth[: len(third)] == third[: len(third)]  # later turns: one stable prefix


def test_forget_images_and_queue_entries() -> None:
    assert unpack("plain") == ("plain", [])
    text, images = unpack({"text": "t", "images": [IMAGE.model_dump()]})
    assert text == "t" and images == [IMAGE]
    only = ChatMessage(role="user", content=user_content("", [IMAGE, IMAGE]))
    kept = ChatMessage(role="user", content=[{"type": "text", "text": "no image"}])
    assert forget_images([only, kept]) == 2
    assert only.content == f"{marker('red.png')}\n\n{marker('red.png')}"
    assert kept.content == [{"type": "text", "text": "no image"}]  # untouched


async def test_vision_read_from_props(fake_engine):
    import httpx

    from loki_supervisor.engine_process import read_props

    async with httpx.AsyncClient() as http:
        assert (await read_props(http, fake_engine.url, None)).vision is False
        fake_engine.vision = True
        assert (await read_props(http, fake_engine.url, None)).vision is True


#: The request of the turn after an image turn, frozen: the image is its marker. A future
#: LOKI_KEEP_TURN_IMAGES (grey zone, off by default) must leave this request byte-identical
#: when off.
FROZEN_AFTER_IMAGE_REQUEST = (
    b'{"messages":[{"content":"You are Loki, a helpful assistant. Answer in the user\'s '
    b"language. Use the tools when they help; `recall` brings back an archived block by its "
    b'id (recall:r<seq>) and `recall_search` finds archived blocks by keywords.",'
    b'"role":"system"},{"content":"What is this?\\n\\n[image red.png: no longer visible]",'
    b'"role":"user"},{"content":"A red square.","role":"assistant"},{"content":"Sure?",'
    b'"role":"user"}],"model":"fake-model","stream":true,"stream_options":{"include_usage":'
    b'true},"tools":[{"function":{"description":"Bring back, verbatim, an archived block cited'
    b' as recall:r<seq> in a summary.","name":"recall","parameters":{"properties":{"id":'
    b'{"description":"the block id, e.g. r12","type":"string"}},"required":["id"],"type":'
    b'"object"}},"type":"function"},{"function":{"description":"Find archived blocks of '
    b'earlier conversation by keywords.","name":"recall_search","parameters":{"properties":'
    b'{"query":{"description":"keywords","type":"string"}},"required":["query"],"type":'
    b'"object"}},"type":"function"},{"function":{"description":"Answers pong.","name":"ping",'
    b'"parameters":{"properties":{},"type":"object"}},"type":"function"},{"function":'
    b'{"description":"Echoes its arguments.","name":"echo","parameters":{"properties":{"text":'
    b'{"type":"string"}},"required":["text"],"type":"object"}},"type":"function"}]}'
)


async def test_turn_after_an_image_is_byte_identical_to_the_frozen_copy(chat, client, fake_engine):
    fake_engine.push(text_reply("A red square."), text_reply("Yes."))
    raw = await client.nc.request(
        subjects.CHAT_SEND,
        SendRequest(content="What is this?", images=[IMAGE]).model_dump_json().encode(),
        timeout=10,
    )
    cid = SendReply.model_validate_json(raw.data).conversation
    await client.tap.wait_turn_ends(cid, 1, 20)
    await client.turn("Sure?", cid)
    assert fake_engine.requests[1].body == FROZEN_AFTER_IMAGE_REQUEST


async def test_an_image_that_is_not_a_data_url_is_refused_before_any_turn(
    chat, client, fake_engine
):
    """Issue 38: a remote image URL never reaches the engine (which would fetch it with no
    address check). The gateway only ever sends data URLs it built from uploaded bytes; a
    peer that sends another URL gets ``invalid_request`` and no turn starts (see_image
    shows only these images, kept)."""
    for url in ("http://127.0.0.1:9/latest/meta-data/", "file:///etc/passwd", "data:text/x,a"):
        body = {"content": "look", "images": [{"id": "e" * 32, "name": "x.png", "url": url}]}
        raw = await client.nc.request(subjects.CHAT_SEND, json.dumps(body).encode(), timeout=10)
        reply = SendReply.model_validate_json(raw.data)
        assert reply.error is not None and reply.error.type == "invalid_request", url
        assert "url" in reply.error.message
    assert fake_engine.requests == []
