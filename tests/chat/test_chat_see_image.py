"""``see_image``: the tool-name → main-argument table, the tool on the scripted engine (an
image of the conversation shown in a user message for the current turn only, a missing or
non-image path answered with what to resend), offered only when the lease sees images."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import redis.asyncio as aioredis

from loki_chat.image_shelf import ImageShelf, shelf_key
from loki_chat.images import marker
from loki_chat.tools import MAIN_ARGUMENT, default_toolbox, label, main_argument, see_image_tool
from loki_chat.tools.box import CallContext
from loki_shared import subjects
from loki_shared.messages.chat import ImageAttachment, SendReply, SendRequest
from loki_shared.sealing import Sealer
from tests.chat.helpers import SECRET, chat_settings
from tests.fakes.fake_engine import text_reply, tool_reply
from tests.fakes.media import png

URL = "data:image/png;base64," + base64.b64encode(png()).decode()
IMAGE = ImageAttachment(id="b" * 32, name="red.png", url=URL)


def _tool_names(request_json: dict) -> list[str]:
    return [t["function"]["name"] for t in request_json.get("tools") or []]


async def test_every_default_tool_has_its_main_argument_in_the_table(redis_db, tmp_path):
    """The seeds' bug: a tool missing from the name → argument table ran on an empty string
    ("path missing" whatever was passed). Every tool of the default box is in the table, its
    entry is a required parameter, and see_image really reads ``path`` through it."""
    r = aioredis.Redis.from_url(redis_db)
    try:
        shelf = ImageShelf(r, Sealer(b"k" * 32))
        settings = chat_settings("nats://unused", redis_db, tmp_path, secret_key=SECRET)
        box = default_toolbox(SimpleNamespace(request=None), settings, shelf)  # type: ignore[arg-type]
        assert list(box.specs) == ["recall", "recall_search", "see_image"]
        for name, spec in box.specs.items():
            assert name in MAIN_ARGUMENT, name
            assert MAIN_ARGUMENT[name] in (spec.parameters or {}).get("required", []), name
        builtins = {k: MAIN_ARGUMENT[k] for k in ("recall", "recall_search", "see_image")}
        assert builtins == {"recall": "id", "recall_search": "query", "see_image": "path"}
        assert label("see_image", {"path": "red.png"}) == "see_image red.png"
        assert label("recall", {"id": "r7"}) == "recall r7"
        assert label("ping", {"x": 1}) == "ping"  # a tool outside the table: its name only
        assert main_argument("see_image", {"path": ["x"]}) == ""
        await shelf.put("c1", [IMAGE])
        found = await box.execute(
            "see_image", json.dumps({"path": "red.png"}), CallContext("k1", "c1")
        )
        assert found.images == [IMAGE] and "red.png" in found.text
        assert (
            await box.execute("see_image", '{"path": "/home/u/red.png"}', CallContext("k2", "c1"))
        ).images
        missing = await box.execute("see_image", "{}", CallContext("k3", "c1"))
        assert missing.images == [] and "needs `path`" in missing.text and "red.png" in missing.text
        # sealed at rest: the data URL is not readable in Redis
        raw = await r.hgetall(shelf_key("c1"))
        assert raw and all(b"base64" not in v for v in raw.values())
        assert 0 < await r.ttl(shelf_key("c1")) <= 24 * 3600
    finally:
        await r.aclose()


async def _send_image(client, text: str) -> str:
    raw = await client.nc.request(
        subjects.CHAT_SEND,
        SendRequest(content=text, images=[IMAGE]).model_dump_json().encode(),
        timeout=10,
    )
    reply = SendReply.model_validate_json(raw.data)
    assert reply.error is None, reply.error
    await client.tap.wait_turn_ends(reply.conversation, 1, 20)
    return reply.conversation


async def test_see_image_shows_an_earlier_image_for_this_turn_only(
    chat, client, fake_engine, supervisor
):
    supervisor.vision = True
    chat.toolbox.add(see_image_tool(chat.shared.shelf))
    fake_engine.push(
        text_reply("A red square."),
        tool_reply([("c1", "see_image", '{"path": "red.png"}')]),
        text_reply("Still red."),
        tool_reply([("c2", "see_image", '{"path": "notes.txt"}')]),
        text_reply("I cannot see it."),
    )
    cid = await _send_image(client, "Look")
    await client.turn("Look again at the first image", cid)
    step1, step2 = (r.json for r in fake_engine.requests[1:3])
    assert "see_image" in _tool_names(step1)
    # the step after the call: its result, then a user message holding the image
    assert step2["messages"][-2]["role"] == "tool"
    assert "red.png is in the next message" in step2["messages"][-2]["content"]
    assert step2["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "[see_image] red.png"},
            {"type": "image_url", "image_url": {"url": URL}},
        ],
    }
    events = client.tap.events[cid]
    shown = [e for e in events if (e.loki or {}).get("event") == "see_image"]
    assert shown[0].loki["images"] == [{"id": IMAGE.id, "name": "red.png"}]
    results = [e for e in events if (e.loki or {}).get("event") == "tool_result"]
    assert results[0].loki["label"] == "see_image red.png"
    # ephemeral: after the turn the image is its marker, and the next turn sends no image
    await client.turn("And a text file?", cid)
    step3, step4 = (r.json for r in fake_engine.requests[3:5])
    assert "base64" not in json.dumps(step3)
    assert f"[see_image] red.png\n\n{marker('red.png')}" in [
        m.get("content") for m in step3["messages"]
    ]
    answer = step4["messages"][-1]
    assert answer["role"] == "tool"
    assert "`notes.txt` is not an image attached to this conversation" in answer["content"]
    assert "Images attached to this conversation: red.png." in answer["content"]
    assert "ask the user to attach the image again" in answer["content"]


async def test_see_image_never_shows_another_conversations_image(
    chat, client, fake_engine, supervisor
):
    """Advisory (issue 38): ``see_image`` in conversation B, given the id or the name of an
    image attached in conversation A, shows nothing and says it is not an image of B."""
    supervisor.vision = True
    chat.toolbox.add(see_image_tool(chat.shared.shelf))
    fake_engine.push(text_reply("A red square."))
    await _send_image(client, "Look")  # conversation A holds red.png (IMAGE.id)
    for path in (IMAGE.id, "red.png"):
        fake_engine.push(
            tool_reply([("c1", "see_image", json.dumps({"path": path}))]),
            text_reply("Nothing to see."),
        )
    other = await client.turn("Show me the earlier image")
    await client.turn("Show me red.png", other[0])
    results = [r.json["messages"][-1] for r in fake_engine.requests[-3::2]]
    for result in results:
        assert (
            result["role"] == "tool"
            and "is not an image attached to this conversation" in (result["content"])
        )
    assert "base64" not in json.dumps([r.json for r in fake_engine.requests[1:]])


async def test_see_image_not_offered_without_vision(chat, client, fake_engine, supervisor):
    supervisor.vision = False
    chat.toolbox.add(see_image_tool(chat.shared.shelf))
    fake_engine.push(text_reply("Hello."))
    await client.turn("Hi")
    tools = _tool_names(fake_engine.requests[0].json)
    assert "see_image" not in tools and "recall" in tools
