"""The project memory tools on the scripted fake engine (the bundled model's template has no
tools): arguments checked before anything is sent, results cut at the tool cap, the
project of the conversation sent with each call, withheld from a template without tools,
and a page written by the model arriving as an update with PROJ_SNAPSHOT on. The memory
service is stood in by an in-test function (the contract's transport is wired in
:mod:`loki_chat.tools`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loki_chat.project import BlockView
from loki_chat.tools import ToolBox
from loki_chat.tools.memory import UNREACHABLE, MemoryRefused, check_arguments, memory_tools
from loki_shared.messages.engine import TemplateProbe
from tests.fakes.fake_engine import text_reply, tool_reply


class Memory:
    """Stands in for the memory service: pages per project, the calls it got."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.pages: dict[str, str] = {}
        self.index: list[str] = []
        self.fail: Exception | None = None

    async def call(self, tool: str, args: dict[str, Any], project: str) -> str:
        self.calls.append((tool, args, project))
        if self.fail is not None:
            raise self.fail
        if tool == "memory_write":
            self.pages[args["page"]] = args["content"]
            self.index.append(f"- [{args['page'][:-3]}]({args['page']}) — {args['description']}")
            return f"Page {args['page']} written."
        if tool == "memory_read":
            return self.pages.get(args["page"], "no such page")
        return "ok"

    async def fetch(self, project: str) -> BlockView:
        return BlockView(project=project, name="Default", index="\n".join(self.index))


async def start(chat_runner, memory: Memory, **over):
    svc = await chat_runner.start(tools=False, system_prompt="S.", **over)
    svc.toolbox = ToolBox(memory_tools(memory.call))
    svc.shared.project.fetch = memory.fetch
    svc.shared.project.clock = lambda: "2026-12-01 10:00 UTC"
    return svc


def tool_results(state) -> list[str]:
    return [m.content for m in state.messages if m.role == "tool"]


@pytest.mark.parametrize(
    "tool,args,says",
    [
        ("memory_write", {"page": "notes.md", "content": "x"}, "`description`: missing (required)"),
        ("memory_write", {"page": "../x", "content": "x", "description": "d"}, "`page`: a page"),
        ("memory_read", {"page": "MEMORY.md"}, "MEMORY.md is the index"),
        ("memory_search", {"query": ""}, "`query`"),
        ("tracker_log", {"tracker": "weight", "value": "heavy"}, "`value`"),
        ("tracker_log", {"tracker": "weight", "value": 80, "date": "1/12"}, "YYYY-MM-DD"),
        ("tracker_read", {"tracker": "weight", "level": "week"}, "`level`"),
        ("tracker_read", {"tracker": "weight", "period": "Nov"}, "YYYY-MM"),
        ("memory_read", {"page": "a.md", "pages": 2}, "`pages`: not an argument"),
    ],
)
def test_bad_arguments_say_exactly_what_to_resend(tool, args, says):
    clean, error = check_arguments(tool, args)
    assert clean is None
    assert error.startswith(f"Error: the call to `{tool}` was NOT executed: ")
    assert says in error and "Send it again" in error and "for example {" in error


@pytest.mark.parametrize("page", ["日記.md", "здоровье.md", "مذكرات-يومية.md", "हिन्दी-नोट्स.md"])
def test_page_names_in_any_script_pass(page):
    """Issue 38 §4: the memory tools take the page files the memory service makes of names
    in any script (combining marks included)."""
    clean, error = check_arguments("memory_read", {"page": page})
    assert error == "" and clean == {"page": page}


@pytest.mark.parametrize(
    "page", ["../日記.md", "日記/x.md", "日記 x.md", "日記\x00.md", ".md", "-日記.md", "日記"]
)
def test_page_names_keep_separators_and_control_characters_out(page):
    clean, error = check_arguments("memory_read", {"page": page})
    assert clean is None and "`page`: a page file name" in error


def test_good_arguments_pass_clean():
    clean, error = check_arguments("tracker_log", {"tracker": " weight ", "value": "81.2"})
    assert error == "" and clean == {"tracker": "weight", "value": 81.2}


async def test_memory_tools_run_on_the_fake_engine_with_the_conversation_project(
    chat_runner, supervisor, client, fake_engine
):
    memory = Memory()
    await start(chat_runner, memory)
    write = json.dumps({"page": "plan.md", "content": "# Plan", "description": "the plan"})
    fake_engine.push(
        tool_reply([("c1", "memory_write", write), ("c2", "memory_write", '{"page": "x.md"}')]),
        text_reply("Saved."),
    )
    cid, end = await client.turn("Remember the plan")
    assert end.finish_reason == "stop"
    assert memory.calls == [
        (
            "memory_write",
            {"page": "plan.md", "content": "# Plan", "description": "the plan"},
            "default",
        )
    ]  # the bad call was never forwarded
    results = tool_results(await client.state(cid))
    assert results[0] == "Page plan.md written."
    assert results[1].startswith("Error: the call to `memory_write` was NOT executed")
    names = [t["function"]["name"] for t in fake_engine.requests[0].json["tools"]]
    assert names == ["memory_read", "memory_write", "memory_search", "tracker_log", "tracker_read"]


async def test_results_over_the_tool_cap_are_cut(chat_runner, supervisor, client, fake_engine):
    memory = Memory()
    memory.pages["big.md"] = "y" * 500
    await start(chat_runner, memory, tool_result_max=100)
    fake_engine.push(tool_reply([("c1", "memory_read", '{"page": "big.md"}')]), text_reply("ok"))
    await client.turn("Read big")
    sent = fake_engine.requests[1].json["messages"][-1]["content"]
    assert sent.startswith("y" * 100 + "\n\n[Result cut at 100 of 500 characters.")


@pytest.mark.parametrize(
    "fail,expected",
    [
        (
            MemoryRefused("the memory is locked: unlock it to read pages"),
            "Error: the memory is locked",
        ),
        (TimeoutError(), UNREACHABLE),
    ],
)
async def test_a_refusal_or_an_unreachable_service_is_the_result(
    chat_runner, supervisor, client, fake_engine, fail, expected
):
    memory = Memory()
    memory.fail = fail
    await start(chat_runner, memory)
    fake_engine.push(tool_reply([("c1", "memory_read", '{"page": "a.md"}')]), text_reply("ok"))
    cid, end = await client.turn("Read a")
    assert end.finish_reason == "stop"
    assert tool_results(await client.state(cid))[0].startswith(expected)


async def test_memory_tools_are_withheld_from_a_template_without_tools(
    chat_runner, supervisor, client, fake_engine
):
    supervisor.template = TemplateProbe(
        template_hash="h",
        supports_tools=False,
        renders_reasoning=False,
        stable_prefix=True,
        strict_alternation=False,
    )
    await start(chat_runner, Memory())
    fake_engine.push(text_reply("ok"))
    await client.turn("Hello")
    assert "tools" not in fake_engine.requests[0].json


async def test_a_page_the_model_writes_arrives_as_an_update_with_the_key_on(
    chat_runner, supervisor, client, fake_engine
):
    memory = Memory()
    await start(chat_runner, memory, proj_snapshot=True)
    write = json.dumps({"page": "plan.md", "content": "# Plan", "description": "the plan"})
    fake_engine.push(
        tool_reply([("c1", "memory_write", write)]), text_reply("Saved."), text_reply("Yes.")
    )
    cid, _ = await client.turn("Remember the plan")
    await client.turn("Is it saved?", cid)
    first, last = (
        fake_engine.requests[0].json["messages"],
        fake_engine.requests[-1].json["messages"],
    )
    assert first[1]["content"] == "Remember the plan"  # an empty project: no block
    assert last[1]["content"] == "Remember the plan"  # the first message does not move
    assert last[-1]["content"] == (
        '<context_update from="loki">\n\nMemory index changes (as of 2026-12-01 10:00 UTC):\n'
        "+ [plan](plan.md) — the plan\n\n</context_update>\n\nIs it saved?"
    )
