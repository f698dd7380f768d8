"""Issue 44: the whole stack (``loki up``'s processes) with two engine supervisors
(``LOKI_SUPERVISOR_REPLICATED``) following the scripted engine as a pool (``LOKI_ENGINE_URLS``),
and the leading supervisor SIGKILLed in the middle of a streaming turn while another lease
request waits for the engine's one slot: the turn ends (finish ``stop``), the conversation reads
back whole, the waiting request is granted by the survivor (not lost), and the next turn runs,
granted by the survivor."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from loki_cli.stack import Stack, StackConfig
from loki_shared import servers
from loki_shared.lease import lease
from loki_shared.messages.engine import LeaseRequest
from tests.e2e.conftest import StackClient
from tests.fakes.fake_engine import FakeEngine, text_reply

SECRET = "replicas-stack-secret-key-0123456789abcdef"
ANSWER = "The leader fell over mid-sentence and yet this answer arrives whole, piece by piece."


@pytest.fixture
def fake_engine() -> Iterator[FakeEngine]:
    with FakeEngine() as engine:
        yield engine


@pytest.fixture
def replicas_stack(tmp_path: Path, fake_engine: FakeEngine) -> Iterator[tuple[Stack, Any]]:
    """The stack (its supervisor leads: it starts alone) and a second supervisor process."""
    stack = Stack(
        StackConfig(
            home=tmp_path / "home",
            web_port=servers.free_port(),
            echo=False,
            env={
                "LOKI_ENGINE_URLS": f"fake0={fake_engine.url}",
                "LOKI_SUPERVISOR_REPLICATED": "true",
                "LOKI_SUPERVISOR_LEADER_TTL_S": "1.5",
                "LOKI_SECRET_KEY": SECRET,
            },
        ),
        log=lambda line: None,
    )
    second: servers.ManagedProcess | None = None
    stack.start()
    try:
        stack.wait_engine_ready(timeout=90)
        first = _info(stack, lambda i: bool(i.get("leader")))
        second = servers.ManagedProcess(
            "engine-supervisor-2",
            [sys.executable, "-m", "loki_supervisor"],
            env=stack.service_env("engine-supervisor"),
            own_session=True,
        ).start()
        # the second one answers too (its own instance id), and follows the same leader
        _info(stack, lambda i: i.get("instance") not in (None, "", first["instance"]))
        yield stack, second
    finally:
        if second is not None:
            second.stop(grace=10)
        stack.stop()


def _info(stack: Stack, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    info: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        info = stack.engine_info()
        if info is not None and predicate(info):
            return info
        time.sleep(0.1)
    raise AssertionError(f"engine info never matched: {info}")


async def _waiting_lease(stack: Stack, started: threading.Event) -> tuple[bool, bool]:
    """A ``foreign`` lease asked (as the chat service) while the turn holds the one slot:
    (granted, released)."""
    nc = await nats.connect(stack.nats_url, **stack.nats_login("chat"))
    try:
        held = lease(nc, LeaseRequest(kind="foreign", conversation=None, wait_s=60))
        started.set()
        async with held:
            pass
        return True, held.released
    finally:
        await nc.close()


def test_leader_killed_mid_turn_the_turn_ends_and_no_lease_request_is_lost(
    replicas_stack: tuple[Stack, Any], fake_engine: FakeEngine
) -> None:
    stack, second = replicas_stack
    before = _info(stack, lambda i: bool(i.get("leader")))
    leader = before["leader"]
    client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
    fake_engine.push(text_reply(ANSWER, pieces=24, delay_s=0.25), text_reply("Second."))
    cid = client.send("Tell me about replicas.")
    fake_engine.wait_requests(1, timeout=30)  # the turn is streaming now, its lease held

    started = threading.Event()
    outcome: dict[str, Any] = {}

    def wait_in_thread() -> None:  # its own event loop, running while the test blocks
        try:
            outcome["result"] = asyncio.run(_waiting_lease(stack, started))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    waiter = threading.Thread(target=wait_in_thread, daemon=True)
    waiter.start()
    assert started.wait(10)
    time.sleep(0.5)  # queued at the leader behind the turn
    assert outcome == {} and fake_engine.active_streams == 1  # it waits: the slot is taken
    stack.stop_service("engine-supervisor", kill=True)  # the leader (it started alone)

    try:
        events = client.events(cid, until_turn_ends=1, timeout=90)
        assert events and events[-1]["choices"][0]["finish_reason"] == "stop", events[-1:]
        state = client.wait_idle(cid, timeout=60)
        texts = [m.get("content") for m in state["messages"][1:]]
        assert texts == ["Tell me about replicas.", ANSWER], texts

        waiter.join(60)
        assert outcome.get("result") == (True, True), (
            outcome
        )  # the queued request was served by the survivor
        after = _info(stack, lambda i: i.get("leader") not in (None, leader))
        assert after["boot"] != before["boot"] and second.alive()

        # the next turn runs, granted by the survivor, and both turns read back
        client.send("And after?", cid)
        more = client.events(cid, last_event_id=events[-1]["seq"], until_turn_ends=1, timeout=60)
        assert more[-1]["choices"][0]["finish_reason"] == "stop"
        state = client.wait_idle(cid, timeout=60)
        texts = [m.get("content") for m in state["messages"][1:]]
        assert texts == ["Tell me about replicas.", ANSWER, "And after?", "Second."], texts
        assert _info(stack, lambda i: True)["leader"] == after["leader"]
    finally:
        waiter.join(10)
