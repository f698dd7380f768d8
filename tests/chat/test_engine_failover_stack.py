"""Issue 44: the whole stack (``loki up``'s processes) with the supervisor following two real
llama-servers that share one ``--slot-save-path`` (``LOKI_ENGINE_URLS``,
``LOKI_ENGINE_SLOT_DIR``). A conversation's turn runs on engine X; once X's slot went idle
its state is saved; X is killed; the next turn ends normally on the other engine, which got
the saved slot restored first: the turn's perf record says ``engine`` = the other,
``moved_from`` = X, ``transfer`` = ``restored``, and its ``timings.cache_n`` covers the first
turn's prompt."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy

from loki_cli.stack import Stack, StackConfig
from loki_shared import servers, subjects
from loki_shared.nats import nats_servers
from loki_supervisor import slot_files
from tests.e2e.conftest import StackClient

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECRET = "engine-failover-secret-key-0123456789abcdef"
#: Tokens a cache hit may miss at the edge of the restored prompt (the template's tail).
EDGE = 4


def question() -> str:
    """A first message of a few hundred tokens."""
    rows = " ".join(
        f"Shelf {i} holds {['maps', 'lamps', 'bells', 'coins'][i % 4]} from {1900 + i * 3}."
        for i in range(45)
    )
    return f"Here is the shop's list. {rows} Which shelf holds the oldest lamps?"


@pytest.fixture
def slot_dir(tmp_path: Path) -> Path:
    path = tmp_path / "slots"
    path.mkdir()
    return path


@pytest.fixture
def engines(slot_dir: Path) -> Iterator[dict[str, servers.RunningServer]]:
    started: dict[str, servers.RunningServer] = {}
    try:
        for name in ("a", "b"):
            started[name] = servers.start_llama(
                ctx=8192, parallel=2, extra=["--slot-save-path", str(slot_dir)]
            )
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def stack(
    tmp_path: Path, slot_dir: Path, engines: dict[str, servers.RunningServer]
) -> Iterator[Stack]:
    urls = ",".join(f"{name}={server.url}" for name, server in engines.items())
    stack = Stack(
        StackConfig(
            home=tmp_path / "home",
            web_port=servers.free_port(),
            echo=False,
            env={
                "LOKI_ENGINE_URLS": urls,
                "LOKI_ENGINE_SLOT_DIR": str(slot_dir),
                "LOKI_SECRET_KEY": SECRET,
                "LOKI_MAX_TOKENS": "16",
            },
        ),
        log=lambda line: None,
    )
    stack.start()
    try:
        stack.wait_engine_ready(timeout=120)
        yield stack
    finally:
        stack.stop()


def perf_records(stack: Stack) -> list[dict[str, Any]]:
    """Every record of the perf stream so far (read as the ``bench`` user may)."""

    async def read() -> list[dict[str, Any]]:
        nc = await nats.connect(nats_servers(stack.nats_url), **stack.nats_login("bench"))
        try:
            js = nc.jetstream()
            last = (await js.stream_info(subjects.STREAM_PERF)).state.last_seq
            out: list[dict[str, Any]] = []
            if last == 0:
                return out
            done = asyncio.Event()

            async def on(msg: Any) -> None:
                out.append(json.loads(msg.data))
                if msg.metadata.sequence.stream >= last:
                    done.set()

            sub = await js.subscribe(
                subjects.PERF_RECORD,
                stream=subjects.STREAM_PERF,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                cb=on,
            )
            await asyncio.wait_for(done.wait(), 30)
            await sub.unsubscribe()
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def main_records(stack: Stack, conversation: str, count: int, timeout: float = 60) -> list[dict]:
    """The conversation's ``main`` records, once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    found: list[dict] = []
    while time.monotonic() < deadline:
        found = [
            r
            for r in perf_records(stack)
            if r.get("conversation") == conversation and r.get("kind") == "main"
        ]
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{len(found)} main records of {conversation}, wanted {count}")


def wait_until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def engine_state(stack: Stack, engine: str) -> str | None:
    info = stack.engine_info() or {}
    for e in info.get("engines") or []:
        if e.get("id") == engine:
            return str(e.get("state"))
    return None


def test_engine_killed_after_the_idle_save_the_next_turn_restores_on_the_other(
    stack: Stack, engines: dict[str, servers.RunningServer], slot_dir: Path
) -> None:
    client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
    cid = client.send(question())
    first = client.events(cid, until_turn_ends=1, timeout=180)
    assert first[-1]["choices"][0]["finish_reason"], first[-1:]
    client.wait_idle(cid, timeout=60)

    (rec1,) = main_records(stack, cid, 1)
    x = rec1["engine"]
    assert x in engines, rec1
    (y,) = set(engines) - {x}
    t1 = rec1["timings"]
    prompt1 = t1["prompt_n"] + t1["cache_n"]
    assert prompt1 > 300, t1

    # the idle-save: the conversation's file appears in the shared directory
    conversation = slot_files.conversation_key(cid)
    wait_until(
        "the idle-save of the first turn",
        lambda: any(
            (k := slot_files.parse(f.name)) is not None and k.conversation == conversation
            for f in slot_files.list_dir(slot_dir)
        ),
        timeout=60,
    )

    engines[x].process.kill()
    wait_until(f"engine {x} no longer ready", lambda: engine_state(stack, x) != "ready", 60)

    client.send("And which shelf holds the newest bells?", cid)
    second = client.events(cid, last_event_id=first[-1]["seq"], until_turn_ends=1, timeout=180)
    assert second[-1]["choices"][0]["finish_reason"] in ("stop", "length"), second[-1:]
    state = client.wait_idle(cid, timeout=60)
    roles = [m["role"] for m in state["messages"]]
    assert roles[-4:] == ["user", "assistant", "user", "assistant"], roles

    rec2 = main_records(stack, cid, 2)[-1]
    assert rec2["engine"] == y, rec2
    assert rec2["moved_from"] == x, rec2
    assert rec2["transfer"] == "restored", rec2
    assert rec2["timings"]["cache_n"] >= prompt1 - EDGE, (rec2["timings"], t1)
