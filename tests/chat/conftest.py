"""Fixtures of the chat tests: the scripted fake engine, the fake engine supervisor on NATS
(``tests/fakes/fake_supervisor.py``: grants ``main`` leases pointing at an engine URL), an
in-process chat service on the real NATS and Redis, and a NATS client that talks to it like
the gateway does (the classes behind them are in ``tests/chat/helpers.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from loki_chat.service import ChatService
from loki_shared import subjects
from tests.chat.helpers import SECRET, ChatClient, ChatRunner, EventTap
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.fake_supervisor import FakeSupervisor


@pytest.fixture
def fake_engine() -> Iterator[FakeEngine]:
    with FakeEngine() as engine:
        yield engine


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def client(nc: Any) -> ChatClient:
    tap = EventTap()
    await nc.subscribe(subjects.CHAT_EVENTS_ALL, cb=tap.on)
    await nc.flush()
    return ChatClient(nc, tap)


@pytest.fixture
async def supervisor(nc: Any, fake_engine: FakeEngine) -> AsyncIterator[FakeSupervisor]:
    sup = await FakeSupervisor(nc, fake_engine.url).start()
    yield sup
    await sup.stop()


@pytest.fixture
async def chat_runner(
    nats_url: str, redis_db: str, tmp_path: Path, nc: Any
) -> AsyncIterator[ChatRunner]:
    from loki_shared.perf_publish import ensure_perf_stream

    await ensure_perf_stream(nc.jetstream())  # as the perf service does at start
    runner = ChatRunner(nats_url, redis_db, tmp_path / "home")
    yield runner
    await runner.stop_all()


@pytest.fixture
async def chat(chat_runner: ChatRunner, supervisor: FakeSupervisor) -> ChatService:
    """One in-process chat service, with the fake supervisor pointing at the fake engine."""
    return await chat_runner.start()


@pytest.fixture
def fake_stack(tmp_path: Path, fake_engine: FakeEngine) -> Iterator[Any]:
    """The whole stack (``loki up``'s processes) following the scripted engine
    (``LOKI_ENGINE_URL``), once its engine is ready; ``stack.config.web_port`` is the
    gateway's port."""
    from loki_cli.stack import Stack, StackConfig
    from loki_shared import servers

    stack = Stack(
        StackConfig(
            home=tmp_path / "home",
            web_port=servers.free_port(),
            echo=False,
            env={"LOKI_ENGINE_URL": fake_engine.url, "LOKI_SECRET_KEY": SECRET},
        ),
        log=lambda line: None,
    )
    stack.start()
    try:
        stack.wait_engine_ready(timeout=60)
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def workspace(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[Any]:
    """The real workspace service (code mode, issue 43), in process, its workspaces under
    ``tmp_path``; the default project's is made already: by the service where its sandbox
    starts, else as a bare folder (so the file operations work even without a sandbox)."""
    from loki_shared.messages.workspace import CreateRequest
    from loki_workspace.service import WorkspaceService
    from loki_workspace.settings import Settings

    service = WorkspaceService(
        Settings(
            home=tmp_path / "ws-home",
            nats_url=nats_url,
            redis_url=redis_db,
            workspace_root=tmp_path / "workspaces",
        )
    )
    await service.start()
    if service.sandbox.version:
        await service.workspaces.create(CreateRequest(project="default"))
    else:
        (service.workspaces.root / "default").mkdir(parents=True)
    yield service
    await service.stop()
