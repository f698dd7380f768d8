"""SLOT_PERSIST on the real engine: a conversation of a few thousand tokens keeps its cache
across an engine crash (saved when the engine went idle after the turn) and across a planned
stop of the supervisor (saved before the stop): the next turn's ``timings.cache_n`` covers at
least 95% of its prompt. With the key off, the same restart loses it (``cache_n`` ≈ 0) and
the slot directory is emptied at launch, as before the key existed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from loki_shared import subjects
from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import (
    EngineInfo,
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_supervisor import slot_files

from .conftest import request, wait_info

pytestmark = pytest.mark.engine

CONVERSATION = "conv-slot-persist"


def long_text() -> str:
    """About 2,500 tokens of varied text (SmolLM2's tokenizer)."""
    return " ".join(
        f"Note {i}: the {['red', 'blue', 'green', 'amber'][i % 4]} parcel number {i * 7} "
        f"left depot {i % 13} at {i % 24:02d}:{(i * 11) % 60:02d}."
        for i in range(130)
    )


async def turn(nc, base_url: str, messages: list[dict]) -> dict:
    """One ``main`` turn as the chat service does it: lease, completion, release with the
    usage and the prompt's fingerprint. Returns the completion's JSON."""
    lease = await request(
        nc,
        subjects.ENGINE_LEASE,
        # a whole prompt recomputed on a loaded 2-core machine outlasts the default TTL,
        # and this helper does not renew
        LeaseRequest(kind="main", conversation=CONVERSATION, wait_s=60, ttl_s=600),
        Lease,
        timeout=65,
    )
    assert lease.error is None and lease.base_url == base_url, lease
    # claimed at once, as loki_shared.lease does (an unclaimed grant is given back)
    claimed = await request(nc, subjects.ENGINE_RENEW, RenewRequest(lease_id=lease.lease_id), Lease)
    assert claimed.error is None, claimed
    async with httpx.AsyncClient(timeout=300) as client:
        r = await client.post(
            f"{base_url}/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0, "cache_prompt": True},
        )
    r.raise_for_status()
    body = r.json()
    usage = body.get("usage") or {}
    reply = await request(
        nc,
        subjects.ENGINE_RELEASE,
        ReleaseRequest(
            lease_id=lease.lease_id,
            prompt_tokens=usage.get("prompt_tokens"),
            prompt_fingerprint=fingerprints(messages)[-1],
        ),
        ReleaseReply,
    )
    assert reply.ok, reply
    return body


def cached_share(body: dict, what: str = "") -> float:
    """``cache_n / (cache_n + prompt_n)`` of a completion (printed with ``what``: the
    figures ``-s`` shows)."""
    t = body["timings"]
    share = t["cache_n"] / (t["cache_n"] + t["prompt_n"])
    if what:
        print(f"slot-persist {what}: cache_n {t['cache_n']} prompt_n {t['prompt_n']} {share:.3f}")
    return share


def followed(messages: list[dict], body: dict, text: str) -> list[dict]:
    reply = body["choices"][0]["message"].get("content") or ""
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": text}]


def saved(why: str):
    return lambda i: (
        (i.slot_persist or {}).get("action") == "save" and i.slot_persist.get("why") == why
    )


async def test_slot_survives_a_crash_and_a_planned_stop(engine_env, supervisor_factory, nc):
    env = {**engine_env, "LOKI_CTX": "4096", "LOKI_SLOT_PERSIST": "on"}
    slots = Path(env["LOKI_HOME"]) / "slots"
    sup = supervisor_factory(env, "first")
    info = await wait_info(nc, lambda i: i.state == "ready" and i.slot_persist, sup=sup)
    assert info.slot_persist == {"action": "restore", "error": "no slot file to restore"}
    assert any("SLOT_PERSIST on" in n for n in info.notes)

    messages = [{"role": "user", "content": long_text()}]
    first = await turn(nc, info.base_url, messages)
    prompt_n = first["timings"]["prompt_n"]
    assert prompt_n > 2000, first["timings"]  # a conversation of a few thousand tokens
    # saved once the engine stayed idle after the turn
    info = await wait_info(nc, saved("idle"), timeout=60, sup=sup)
    assert info.slot_persist["n_saved"] >= prompt_n
    print(f"slot-persist idle save: {info.slot_persist}")
    (name,) = [p.name for p in slots.iterdir()]
    key = slot_files.parse(name)
    assert key is not None and key.n_ctx == 4096
    assert key.conversation == slot_files.conversation_key(CONVERSATION)
    assert key.fingerprint == fingerprints(messages)[-1][:16]

    # 1. the engine crashes: the restarted one gets the file back before any request
    [pid] = sup.engine_pids()
    os.kill(pid, signal.SIGKILL)
    info = await wait_info(
        nc,
        lambda i: (
            i.state == "ready"
            and i.restarts == 1
            and (i.slot_persist or {}).get("action") == "restore"
        ),
        timeout=120,
        sup=sup,
    )
    assert info.slot_persist.get("n_restored", 0) >= prompt_n, info.slot_persist
    print(f"slot-persist restore after a crash: {info.slot_persist}")
    messages = followed(messages, first, "Which parcel left depot 3 first?")
    second = await turn(nc, info.base_url, messages)
    assert cached_share(second, "after a crash") >= 0.95, second["timings"]

    # 2. a planned stop right after the turn (before the idle save): saved before it stops
    messages = followed(messages, second, "And the last one?")
    third = await turn(nc, info.base_url, messages)
    assert cached_share(third, "same engine") >= 0.95, third["timings"]
    assert sup.stop() == 0
    assert "slot 0 saved (stop)" in sup.log() or "slot 0 saved (idle)" in sup.log()
    files = [slot_files.parse(p.name) for p in slots.iterdir()]
    # one file per conversation: the newest prompt's
    assert [k.fingerprint for k in files if k] == [fingerprints(messages)[-1][:16]]

    sup = supervisor_factory(env, "second")
    # the first "ready" is published before the restore ran (leases wait for it): wait for
    # the restore's own outcome
    info = await wait_info(
        nc,
        lambda i: i.state == "ready" and (i.slot_persist or {}).get("action") == "restore",
        sup=sup,
    )
    assert "error" not in info.slot_persist, info.slot_persist
    messages = followed(messages, third, "Thanks.")
    fourth = await turn(nc, info.base_url, messages)
    assert cached_share(fourth, "after a planned stop") >= 0.95, fourth["timings"]
    assert sup.stop() == 0

    # 3. the key off: nothing restored, the directory emptied at launch (today's behaviour)
    off = supervisor_factory({**env, "LOKI_SLOT_PERSIST": "off"}, "off")
    info = await wait_info(nc, lambda i: i.state == "ready", sup=off)
    assert info.slot_persist is None and list(slots.iterdir()) == []
    messages = followed(messages, fourth, "Bye.")
    fifth = await turn(nc, info.base_url, messages)
    assert cached_share(fifth, "key off, after a stop") < 0.05, fifth["timings"]


async def test_stale_files_go_at_launch(engine_env, supervisor_factory, nc):
    """With SLOT_PERSIST on, a launch keeps only Loki slot files, then deletes those of
    another model or window before it looks for the owner's file."""
    env = {**engine_env, "LOKI_SLOT_PERSIST": "on"}
    slots = Path(env["LOKI_HOME"]) / "slots"
    slots.mkdir(parents=True)
    other_model = slot_files.SlotKey("0" * 12, 2048, "1" * 12, "2" * 16).filename
    (slots / other_model).write_bytes(b"x")
    (slots / "foreign.bin").write_bytes(b"x")
    sup = supervisor_factory(env)
    info: EngineInfo = await wait_info(nc, lambda i: i.state == "ready" and i.slot_persist, sup=sup)
    assert info.slot_persist == {"action": "restore", "error": "no slot file to restore"}
    assert list(slots.iterdir()) == []
    assert f"slot file {other_model} deleted: other model" in sup.log()
