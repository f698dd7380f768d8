"""The chat service without a memory service that answers: a new conversation waits at most
``LOKI_MEMORY_ACTIVE_WAIT_S`` for the active project, then belongs to the default project;
the failure is logged once (again when the service answers); chat goes on without a block.

Against real NATS and Redis, on the scripted fake engine; the "silent" memory service is a
NATS subscriber on the memory service's subjects that never replies."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from loki_shared import subjects
from loki_shared.messages import projects as m
from tests.fakes.fake_engine import text_reply

WARNING = "unavailable"


def warnings(caplog: Any) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "loki.chat.project" and r.levelno >= logging.WARNING and WARNING in r.message
    ]


async def test_no_memory_service_default_project_at_once_and_logged_once(
    chat_runner, supervisor, client, fake_engine, caplog
):
    caplog.set_level(logging.DEBUG, logger="loki.chat.project")
    await chat_runner.start(system_prompt="S.")  # default settings: key off
    started = time.monotonic()
    first = (await client.conversations("create")).conversation
    second = (await client.conversations("create")).conversation
    took = time.monotonic() - started
    assert first is not None and second is not None
    assert (first.project, second.project) == (m.DEFAULT_PROJECT, m.DEFAULT_PROJECT)
    assert took < 1.0  # no responders: answered at once, no wait for a timeout
    fake_engine.push(text_reply("Hello."))
    cid, end = await client.turn("Hi", first.id)
    assert end.finish_reason == "stop"
    assert fake_engine.requests[-1].json["messages"][1]["content"] == "Hi"  # no block
    assert len(warnings(caplog)) == 1  # two creates and a block fetch: one warning


async def test_a_silent_memory_service_bounds_the_wait_then_recovers(
    chat_runner, supervisor, client, fake_engine, nc, caplog
):
    caplog.set_level(logging.INFO, logger="loki.chat.project")
    asked: list[str] = []

    async def silent(msg: Any) -> None:
        asked.append(msg.subject)  # never answers

    subs = [
        await nc.subscribe(s, cb=silent)
        for s in (subjects.PROJECTS_ACTIVE, subjects.PROJECTS_BLOCK)
    ]
    await nc.flush()
    svc = await chat_runner.start(
        system_prompt="S.", memory_active_wait_s=0.3, memory_timeout_s=5.0
    )
    started = time.monotonic()
    conv = (await client.conversations("create")).conversation
    took = time.monotonic() - started
    assert conv is not None and conv.project == m.DEFAULT_PROJECT
    assert 0.3 <= took < 1.5  # bounded by the wait, far below the 5 s request timeout
    fake_engine.push(text_reply("Hello."))
    started = time.monotonic()
    _, end = await client.turn("Hi", conv.id)
    assert end.finish_reason == "stop"
    assert time.monotonic() - started < 2.5  # the block fetch is bounded too while silent
    assert fake_engine.requests[-1].json["messages"][1]["content"] == "Hi"
    assert asked.count(subjects.PROJECTS_BLOCK) == 1
    assert len(warnings(caplog)) == 1
    assert svc.shared.project.unreachable

    for sub in subs:  # the memory service comes up
        await sub.unsubscribe()

    async def answer(msg: Any) -> None:
        await msg.respond(
            m.ProjectReply(project=m.Project(id="health", name="Health")).model_dump_json().encode()
        )

    await nc.subscribe(subjects.PROJECTS_ACTIVE, cb=answer)
    await nc.flush()
    later = (await client.conversations("create")).conversation
    assert later is not None and later.project == "health"
    assert not svc.shared.project.unreachable
    assert any("answers again" in r.message for r in caplog.records)
    listed = (await client.conversations("list", project="health")).conversations
    assert [c.id for c in listed] == [later.id]
    assert json.loads(later.model_dump_json())["project"] == "health"
