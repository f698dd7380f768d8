"""The whole stack as a user runs it: :class:`loki_cli.stack.Stack` with the real servers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from loki_cli.stack import Stack, StackConfig
from loki_shared import servers


class StackClient:
    """HTTP client of a running stack's gateway."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, timeout=30)

    def send(self, content: str, conversation: str | None = None) -> str:
        body = {"content": content}
        if conversation:
            body["conversation"] = conversation
        r = self.http.post("/api/chat/send", json=body)
        assert r.status_code == 202, r.text
        return r.json()["conversation"]

    def events(
        self,
        conversation: str,
        last_event_id: int | None = None,
        until_turn_ends: int = 1,
        timeout: float = 180.0,
    ) -> list[dict]:
        """Read the SSE stream until ``until_turn_ends`` end-of-turn events arrived
        (0: until the replay is drained and nothing new comes for 2 s)."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        out: list[dict] = []
        ends = 0
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base, timeout=httpx.Timeout(timeout, read=5.0)) as c:
            with connect_sse(
                c, "GET", "/api/chat", params={"conversation": conversation}, headers=headers
            ) as source:
                try:
                    for sse in source.iter_sse():
                        if not sse.data or sse.event != "message":
                            continue  # pings carry no data; `reconnect` frames carry no seq
                        data = json.loads(sse.data)
                        assert sse.id == str(data["seq"]), (sse.id, data)
                        out.append(data)
                        if data["choices"][0].get("finish_reason"):
                            ends += 1
                            if until_turn_ends and ends >= until_turn_ends:
                                break
                        if time.monotonic() > deadline:
                            break
                except httpx.ReadTimeout:
                    if until_turn_ends:
                        raise
        return out

    def wait_idle(self, conversation: str, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.http.get("/api/chat/state", params={"conversation": conversation}).json()
            if not state.get("generating") and not state.get("queued"):
                return state
            time.sleep(0.3)
        raise AssertionError("turn did not end")


def make_stack(home: Path, port: int) -> Stack:
    config = StackConfig(home=home, web_port=port, env={"LOKI_CTX": "4096"}, echo=False)
    return Stack(config)


@pytest.fixture(scope="module")
def stack_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loki-home")


@pytest.fixture(scope="module")
def running_stack(stack_home: Path) -> Iterator[Stack]:
    stack = make_stack(stack_home, servers.free_port())
    stack.start()
    try:
        stack.wait_engine_ready(timeout=240)
        yield stack
    finally:
        stack.stop()
