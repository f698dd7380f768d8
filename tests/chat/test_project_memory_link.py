"""The chat service wired to the memory service's contract (``loki.projects.*``), against a
small in-test NATS responder that answers like the memory service (the block, the active
project, page writes and reads, a locked memory): the service's own client, block mapping
and memory tools, on the scripted fake engine."""

from __future__ import annotations

import json
from typing import Any

from loki_chat.project.memory_link import block_view, memory_call
from loki_chat.tools import default_toolbox
from loki_shared import subjects
from loki_shared.errors import Locked
from loki_shared.messages import projects as m
from tests.fakes.fake_engine import text_reply, tool_reply


class MemoryResponder:
    """Answers ``loki.projects.*`` requests on a real NATS connection."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.subs: list[Any] = []
        self.pages: dict[str, m.Page] = {}
        self.trackers: dict[str, str] = {"weight": "- weight: 81.2 kg (2026-11-30)"}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.locked = False

    def block(self) -> m.ProjectBlock:
        index = [f"- [{p.title}]({p.file}) — {p.description}" for p in self.pages.values()]
        return m.ProjectBlock(
            project_id="health",
            name="Health",
            description="Getting fit.",
            index=sorted(index),
            trackers=dict(self.trackers),
        )

    async def handle(self, subject: str, data: dict[str, Any]) -> m.Reply:
        self.requests.append((subject, data))
        if self.locked and subject != subjects.PROJECTS_ACTIVE:
            return m.PageReply(error=Locked("the memory is locked").info())
        if subject == subjects.PROJECTS_ACTIVE:
            return m.ProjectReply(project=m.Project(id="health", name="Health"))
        if subject == subjects.PROJECTS_BLOCK:
            return m.ProjectBlockReply(block=self.block())
        if subject == subjects.PROJECTS_PAGE_WRITE:
            req = m.PageWriteRequest.model_validate(data)
            page = m.Page(
                file=req.page,
                title=req.page[:-3].title(),
                description=req.description or "",
                content=req.content,
            )
            created = req.page not in self.pages
            self.pages[req.page] = page
            return m.PageReply(page=page, created=created)
        if subject == subjects.PROJECTS_PAGE_READ:
            req = m.PageReadRequest.model_validate(data)
            return m.PageReply(page=self.pages[req.page])
        raise AssertionError(subject)

    async def start(self) -> MemoryResponder:
        for subject in (
            subjects.PROJECTS_ACTIVE,
            subjects.PROJECTS_BLOCK,
            subjects.PROJECTS_PAGE_WRITE,
            subjects.PROJECTS_PAGE_READ,
        ):

            async def cb(msg: Any, subject: str = subject) -> None:
                reply = await self.handle(subject, json.loads(msg.data or b"{}"))
                await msg.respond(reply.model_dump_json().encode())

            self.subs.append(await self.nc.subscribe(subject, cb=cb))
        await self.nc.flush()
        return self


def test_the_contract_block_maps_to_the_view():
    block = m.ProjectBlock(
        project_id="p",
        name="P",
        description="d",
        instructions="i",
        index=["- [A](a.md) — x", "- [B](b.md)"],
        trackers={"weight": "- weight: 80 kg (2026-11-30)"},
    )
    view = block_view(block)
    assert list(view.pages()) == ["](a.md)", "](b.md)"]
    assert [t.line() for t in view.trackers] == ["- weight: 80 kg (2026-11-30)"]
    assert (view.project, view.name, view.description, view.instructions) == ("p", "P", "d", "i")


async def test_the_service_asks_the_memory_service_for_the_block_and_runs_the_tools(
    chat_runner, supervisor, client, fake_engine, nc
):
    memory = await MemoryResponder(nc).start()
    svc = await chat_runner.start(system_prompt="S.", proj_snapshot=True)
    svc.toolbox = default_toolbox(svc.bus, svc.settings, memory=memory_call(svc.projects))
    svc.shared.project.clock = lambda: "2026-12-01 10:00 UTC"
    write = json.dumps({"page": "plan.md", "content": "# Plan", "description": "the plan"})
    fake_engine.push(
        tool_reply([("c1", "memory_write", write)]), text_reply("Saved."), text_reply("Yes.")
    )
    cid, _ = await client.turn("Remember the plan")
    await client.turn("Is it saved?", cid)
    first = fake_engine.requests[0].json
    names = [t["function"]["name"] for t in first["tools"]]
    assert names == [
        "recall",
        "recall_search",
        "memory_read",
        "memory_write",
        "memory_search",
        "tracker_log",
        "tracker_read",
    ]
    assert "- weight: 81.2 kg (2026-11-30)" in first["messages"][1]["content"]
    msgs = fake_engine.requests[-1].json["messages"]
    assert msgs[3]["content"] == "Page plan.md created; the memory index lists it."
    assert "+ [Plan](plan.md) — the plan" in msgs[-1]["content"]
    assert msgs[1] == first["messages"][1]  # the copy, byte for byte
    writes = [d for s, d in memory.requests if s == subjects.PROJECTS_PAGE_WRITE]
    assert writes[0]["project_id"] == "health"  # the conversation's project (the active one)


async def test_a_locked_memory_is_the_tool_result_and_no_block(
    chat_runner, supervisor, client, fake_engine, nc
):
    memory = await MemoryResponder(nc).start()
    memory.locked = True
    svc = await chat_runner.start(system_prompt="S.")
    svc.toolbox = default_toolbox(svc.bus, svc.settings, memory=memory_call(svc.projects))
    fake_engine.push(tool_reply([("c1", "memory_read", '{"page": "a.md"}')]), text_reply("ok"))
    cid, end = await client.turn("Read a")
    assert end.finish_reason == "stop"
    msgs = fake_engine.requests[-1].json["messages"]
    assert msgs[1]["content"] == "Read a"  # locked: no block
    assert msgs[3]["content"] == "Error: the memory is locked"


async def test_no_memory_service_unreachable_tool_result_and_default_project(
    chat_runner, supervisor, client, fake_engine
):
    svc = await chat_runner.start(system_prompt="S.", memory_timeout_s=0.3)
    svc.toolbox = default_toolbox(svc.bus, svc.settings, memory=memory_call(svc.projects))
    fake_engine.push(tool_reply([("c1", "memory_read", '{"page": "a.md"}')]), text_reply("ok"))
    cid, end = await client.turn("Read a")
    assert end.finish_reason == "stop"
    msgs = fake_engine.requests[-1].json["messages"]
    assert msgs[1]["content"] == "Read a"
    assert msgs[3]["content"].startswith("The project memory (memory service) is unreachable")
