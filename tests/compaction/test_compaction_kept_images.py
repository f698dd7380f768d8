"""KEEP_TURN_IMAGES and compaction: kept images are dropped first (their caption and the
ephemeral marker stay), before any text is summarised."""

from __future__ import annotations

import base64

from loki_chat.images import marker
from loki_chat.kept_images import ref_content
from loki_shared.messages.chat import ImageAttachment
from tests.fakes.fake_engine import text_reply
from tests.fakes.media import png

from .conftest import summary_requests
from .test_compaction_policy import SUMMARY, long_conv, recall_text

IMAGE = ImageAttachment(
    id="d" * 32, name="plan.png", url="data:image/png;base64," + base64.b64encode(png()).decode()
)
COST = 600


def conv_with_kept_image(cid: str):
    conv = long_conv(cid)
    first = conv.messages[0]
    text = first.content
    first.content = ref_content(text, [IMAGE])
    first.content[1].update(loki_cost=COST, loki_kept=True)
    conv.meter.measured, conv.meter.measured_count = 3000, len(conv.messages)
    return conv, text


async def test_threshold_drops_kept_images_before_any_summary(harness, fake_engine, supervisor):
    h = harness()
    for trigger in ("start", "mid", "end"):
        conv, text = conv_with_kept_image(f"k-{trigger}")
        # 3200 of 4096 is past 0.75; without the image's 600 it is not: no summary
        assert await h.policy.maybe_compact(h.view(conv, trigger, ctx_used=3200))
        assert conv.messages[0].content == f"{text}\n\n{marker('plan.png')}"
        assert conv.meter.measured is None  # the measure held the image: invalidated
    assert not fake_engine.requests and not h.markers


async def test_reactive_drops_kept_images_first(harness, fake_engine, supervisor):
    h = harness()
    conv, text = conv_with_kept_image("k-reactive")
    assert await h.policy.maybe_compact(h.view(conv, "reactive", ctx_used=4000))
    assert conv.messages[0].content == f"{text}\n\n{marker('plan.png')}"
    assert not fake_engine.requests  # the step is replayed without the image first


async def test_still_over_after_the_images_the_text_is_summarised(
    harness, fake_engine, supervisor, recall, nc
):
    h = harness()
    conv, _ = conv_with_kept_image("k-both")
    fake_engine.push(text_reply(SUMMARY))
    assert await h.policy.maybe_compact(h.view(conv, "end", ctx_used=3900))
    [req] = summary_requests(fake_engine)
    transcript = req["messages"][1]["content"]
    assert "image_url" not in str(req) and "recall:r1" in transcript
    # the message was archived verbatim as it is now: its caption and the marker
    assert (await recall_text(nc, "r1")).endswith(marker("plan.png"))
    assert h.markers and h.markers[0]["path"] == "summary"
