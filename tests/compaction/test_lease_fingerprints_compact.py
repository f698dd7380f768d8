"""Issue 44: the lease requests of a compaction and of PREWARM name the fingerprints of the
messages they send (``LeaseRequest.prompt_fingerprints``): the transcript path and the
prewarm exactly; the continuation path the prefix it continues (the request as the turn
sent it and the messages accepted since; the demand joins or follows it, chosen once the
lease says which template answers)."""

from __future__ import annotations

import asyncio
import time

import pytest

from loki_shared.fingerprint import fingerprints
from tests.fakes.fake_engine import default_usage, text_reply

from .conftest import summary_requests
from .test_compaction_tail_reuse import SUMMARY, point, reply


async def until(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("continuation", [False, True])
async def test_compaction_and_prewarm_leases_name_their_messages(
    chat_runner, supervisor, client, fake_engine, continuation
):
    """Five turns (the fifth compacts at its end, with REASONING_ECHO's reasoning in the
    tail), the prewarm, then one more turn: each lease request names its request's
    messages (the continuation: a prefix of them, all but the last at most)."""
    await chat_runner.start(
        system_prompt="S.", prewarm=True, reasoning_echo=True, compact_continuation=continuation
    )
    fake_engine.push(
        *(
            text_reply(
                f"Noted {i}.",
                reasoning=f"Point {i} read.",
                usage=default_usage(prompt_tokens=700 * i if i < 5 else 3300, completion_tokens=5),
            )
            for i in range(1, 6)
        ),
        text_reply(SUMMARY),
        text_reply("warm", usage=default_usage(prompt_tokens=300, completion_tokens=1)),
    )
    cid, _ = await client.turn(point(1))
    for i in range(2, 6):
        await client.turn(point(i), cid)
    assert len(summary_requests(fake_engine)) == 1
    await until(lambda: fake_engine.requests[-1].json.get("max_tokens") == 1)
    await until(lambda: supervisor.held() == 0)
    fake_engine.push(reply("Sure.", 900))
    await client.turn("Thanks", cid)
    sent = [r.json for r in fake_engine.requests]
    asked = supervisor.requests
    assert [r.kind for r in asked] == ["main"] * 5 + ["compact", "prewarm", "main"]
    assert len(sent) == len(asked)
    compact = asked[5]
    assert compact.continuation is continuation
    for lease, body in zip(asked, sent, strict=True):
        named, actual = lease.prompt_fingerprints, fingerprints(body["messages"])
        assert named, lease.kind
        if lease.kind == "compact" and lease.continuation:
            assert len(named) >= len(actual) - 1 and named == actual[: len(named)]
            assert len(named) > 2  # the whole conversation as the turn sent it
        else:
            assert named == actual, lease.kind
