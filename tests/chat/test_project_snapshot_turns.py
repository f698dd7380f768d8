"""The project block in real turns (real NATS and Redis, the scripted fake engine), with
PROJ_SNAPSHOT off (rebuilt each turn; byte-identical to the frozen copy) and on (a dated
copy sent byte for byte, ``<context_update from="loki">`` blocks, retakes). The memory
service is stood in by a block source set on the service (``shared.project.fetch``)."""

from __future__ import annotations

import json
from pathlib import Path

from loki_chat.context import NoCompaction
from loki_chat.project import BlockView, TrackerLine
from loki_chat.project.head import SNAPSHOT_SYSTEM_LINE
from loki_chat.project.snapshot import UPDATE_KIND
from loki_shared import subjects
from loki_shared.messages.chat import ConversationsReply, ConversationsRequest
from loki_shared.messages.engine import Placement
from tests.fakes.fake_engine import text_reply


class CompactAtStart(NoCompaction):
    """Compacts on ``triggers`` (default: turn start) once there is history (keeps the last
    message)."""

    def __init__(self, triggers: tuple[str, ...] = ("start",)) -> None:
        self.triggers = triggers

    async def maybe_compact(self, view) -> bool:
        if view.trigger in self.triggers and len(view.conversation.messages) > 1:
            del view.conversation.messages[:-1]
            view.conversation.meter.invalidate()
            return True
        return False


FROZEN = Path(__file__).parent / "frozen" / "project_block_off_request.json"
INDEX = "- [Plan](plan.md) — the plan"
WEIGHT = TrackerLine(slug="weight", name="weight", value="81.2", unit="kg", date="2026-11-30")


class Source:
    """Stands in for the memory service: the project as it is now."""

    def __init__(self, view: BlockView | None) -> None:
        self.view = view
        self.calls = 0

    async def fetch(self, project: str) -> BlockView | None:
        self.calls += 1
        if self.view is None:
            raise TimeoutError("no memory service")
        return self.view


def health(**over) -> BlockView:
    values = dict(
        project="default",
        name="Health",
        description="Getting fit.",
        index=INDEX,
        trackers=(WEIGHT,),
    )
    values.update(over)
    return BlockView(**values)


async def start(chat_runner, source: Source, snapshot: bool, **over):
    over.setdefault("system_prompt", "S.")
    svc = await chat_runner.start(tools=False, proj_snapshot=snapshot, **over)
    svc.shared.project.fetch = source.fetch
    svc.shared.project.clock = lambda: "2026-12-01 10:00 UTC"
    return svc


def stored(state) -> list[tuple[str, str | None]]:
    return [(m.role, m.loki.injected if m.loki else None) for m in state.messages]


async def test_key_off_requests_are_byte_identical_to_the_frozen_copy(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(health())
    await start(chat_runner, source, snapshot=False)
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(index=INDEX + "\n- [Diet](diet.md) — meals")
    await client.turn("And now?", cid)
    frozen = json.loads(FROZEN.read_text())
    assert [r.body.decode() for r in fake_engine.requests] == frozen


async def test_key_off_rebuilds_the_block_each_turn_and_stores_nothing(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(health())
    await start(chat_runner, source, snapshot=False)
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(index=INDEX + "\n- [Diet](diet.md) — meals")
    await client.turn("And now?", cid)
    first, second = (r.json["messages"] for r in fake_engine.requests)
    assert first[0]["content"] == "S."  # no system line with the key off
    assert "[Diet](diet.md)" not in first[1]["content"]
    assert "[Diet](diet.md)" in second[1]["content"]  # rebuilt: the head of the prompt moved
    assert stored(await client.state(cid)) == [
        ("system", None),
        ("user", None),
        ("assistant", None),
        ("user", None),
        ("assistant", None),
    ]


async def test_key_off_without_a_memory_service_sends_no_block(
    chat_runner, supervisor, client, fake_engine
):
    await start(chat_runner, Source(None), snapshot=False)
    fake_engine.push(text_reply("Hi."))
    _, end = await client.turn("Hello")
    assert end.finish_reason == "stop"
    assert fake_engine.requests[0].json["messages"][1]["content"] == "Hello"


async def test_key_on_sends_the_dated_copy_byte_for_byte_and_changes_as_updates(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(health())
    await start(chat_runner, source, snapshot=True)
    fake_engine.push(text_reply("Hi."), text_reply("Fine."), text_reply("Ok."))
    cid, _ = await client.turn("Hello")
    source.view = health(
        index=INDEX + "\n- [Diet](diet.md) — meals",
        trackers=(TrackerLine(slug="weight", name="weight", value="80.9", unit="kg"),),
    )
    await client.turn("And now?", cid)
    await client.turn("Again", cid)
    one, two, three = (r.json["messages"] for r in fake_engine.requests)
    assert one[0]["content"] == f"S.\n\n{SNAPSHOT_SYSTEM_LINE}"
    assert "Memory index (as of 2026-12-01 10:00 UTC):" in one[1]["content"]
    assert two[1] == one[1] and three[1] == one[1]  # the copy, byte for byte
    update = two[3]["content"]
    assert update.startswith('<context_update from="loki">')
    assert "+ [Diet](diet.md) — meals" in update
    assert "- weight: 80.9 kg" in update
    assert update.endswith("</context_update>\n\nAnd now?")
    assert three[3] == two[3] and three[5]["content"] == "Again"  # stored, sent once
    # each request extends the previous one: the prefix stays in the engine's cache
    body2, body3 = (r.body.decode() for r in fake_engine.requests[1:])
    head = json.dumps(two[:4], sort_keys=True, separators=(",", ":"), ensure_ascii=False)[:-1]
    assert body2.startswith('{"messages":' + head) and body3.startswith('{"messages":' + head)
    assert stored(await client.state(cid))[3] == ("user", UPDATE_KIND)


async def test_key_on_the_first_page_of_an_empty_project_arrives_as_an_update(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(BlockView(project="default", name="Default"))
    await start(chat_runner, source, snapshot=True)
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = BlockView(project="default", name="Default", index=INDEX)
    await client.turn("And now?", cid)
    one, two = (r.json["messages"] for r in fake_engine.requests)
    assert one[1]["content"] == "Hello" and two[1]["content"] == "Hello"
    assert two[3]["content"].startswith('<context_update from="loki">')
    assert "+ [Plan](plan.md) — the plan" in two[3]["content"]


async def retake_setup(chat_runner, client, fake_engine, **over):
    source = Source(health())
    svc = await start(chat_runner, source, snapshot=True, **over)
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(description="Getting fit by spring.")
    await client.turn("And now?", cid)
    assert stored(await client.state(cid))[3] == ("user", UPDATE_KIND)
    return svc, source, cid


def assert_retaken(messages, description: str = "Getting fit by spring.") -> None:
    contents = [m["content"] for m in messages[1:]]  # the system line names the block
    assert not any("<context_update" in c for c in contents)
    assert f"Project description:\n{description}" in contents[0]


async def test_key_on_a_model_change_retakes(chat_runner, supervisor, client, fake_engine):
    _, _, cid = await retake_setup(chat_runner, client, fake_engine)
    supervisor.model = "other-model"
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"])
    assert UPDATE_KIND not in [i for _, i in stored(await client.state(cid))]


async def test_key_on_a_move_to_another_engine_of_the_pool_keeps_the_copy(
    chat_runner, supervisor, client, fake_engine
):
    """Issue 44: with several engines (leases with a ``placement``) the snapshot is taken for
    the model, not the endpoint: a conversation moved to another engine keeps its copy (its
    slot may come back from a slot file); a change of model still retakes."""
    supervisor.placement = Placement(engine="e0", id_slot=0, reason="new")
    _, _, cid = await retake_setup(chat_runner, client, fake_engine)
    # the same engine process under another address: another engine to the chat service
    supervisor.base_url = supervisor.base_url.replace("127.0.0.1", "localhost")
    supervisor.placement = Placement(engine="e1", id_slot=0, reason="failover")
    fake_engine.push(text_reply("Ok."), text_reply("Ok."))
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert "<context_update" in last[3]["content"]  # the dated copy and its update, as sent
    assert "Project description:\nGetting fit.\n" in last[1]["content"]
    supervisor.model = "other-model"
    await client.turn("Fourth", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"])


async def test_key_on_a_restart_retakes(chat_runner, supervisor, client, fake_engine):
    svc, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await chat_runner.stop(svc)
    svc2 = await start(chat_runner, source, snapshot=True)
    assert svc2.shared.project.boot != svc.shared.project.boot
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"])


async def test_key_on_a_system_prompt_change_retakes(chat_runner, supervisor, client, fake_engine):
    svc, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await chat_runner.stop(svc)
    await start(chat_runner, source, snapshot=True, system_prompt="S2.")
    svc_boot = chat_runner.running[-1][0].shared.project
    svc_boot.boot = svc.shared.project.boot  # same start token: only the prompt changed
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"])


async def test_key_on_the_same_prompt_after_an_ownership_move_keeps_the_copy(
    chat_runner, supervisor, client, fake_engine
):
    """The control for the two tests above: same prompt, same start token, no retake."""
    svc, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await chat_runner.stop(svc)
    await start(chat_runner, source, snapshot=True)
    chat_runner.running[-1][0].shared.project.boot = svc.shared.project.boot
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert "<context_update" in last[3]["content"]
    assert "Project description:\nGetting fit.\n" in last[1]["content"]


async def test_key_on_a_project_switch_retakes(chat_runner, supervisor, client, fake_engine):
    _, source, cid = await retake_setup(chat_runner, client, fake_engine)
    source.view = health(name="Fitness", description="Getting fit by spring.")
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert_retaken(last)
    assert last[1]["content"].startswith('<project name="Fitness">')


async def test_key_on_past_the_threshold_of_updates_retakes(
    chat_runner, supervisor, client, fake_engine
):
    _, source, cid = await retake_setup(
        chat_runner, client, fake_engine, proj_snapshot_max_updates=1
    )
    source.view = health(description="Getting fit by summer.")
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"], "Getting fit by summer.")


async def test_key_on_a_compaction_retakes_at_once(chat_runner, supervisor, client, fake_engine):
    source = Source(health())
    policy = CompactAtStart()
    svc = await chat_runner.start(
        tools=False, system_prompt="S.", proj_snapshot=True, policy=policy
    )
    svc.shared.project.fetch = source.fetch
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(description="Getting fit by spring.")
    await client.turn("And now?", cid)  # compacted at turn start: the live block is the copy
    last = fake_engine.requests[-1].json["messages"]
    assert [m["role"] for m in last] == ["system", "user"]  # compacted down to the last message
    assert "<context_update" not in last[1]["content"]
    assert "Project description:\nGetting fit by spring." in last[1]["content"]
    assert last[1]["content"].endswith("And now?")


async def test_key_removed_cleans_the_updates_and_the_copy(
    chat_runner, supervisor, client, fake_engine
):
    svc, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await chat_runner.stop(svc)
    await start(chat_runner, source, snapshot=False)
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert last[0]["content"] == "S."
    assert not any("<context_update" in m["content"] for m in last)
    assert UPDATE_KIND not in [i for _, i in stored(await client.state(cid))]


async def test_key_on_reset_drops_the_copy(chat_runner, supervisor, client, fake_engine):
    _, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await client.control(cid, "reset")
    source.view = health(description="Fresh.")
    fake_engine.push(text_reply("Ok."))
    await client.turn("Again", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert len(last) == 2 and "Project description:\nFresh." in last[1]["content"]


async def test_update_blocks_are_left_out_of_the_title_and_the_export(
    chat_runner, supervisor, client, fake_engine
):
    _, _, cid = await retake_setup(chat_runner, client, fake_engine)
    reply = await client._req(
        subjects.CHAT_CONVERSATIONS,
        ConversationsRequest(action="export", conversation=cid),
        ConversationsReply,
    )
    assert reply.conversation.title == "Hello"
    exported = reply.export["messages"]
    assert [m["content"] for m in exported if m["role"] == "user"] == ["Hello", "And now?"]


async def test_a_new_conversation_belongs_to_the_active_project(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(health(project="health"))
    svc = await start(chat_runner, source, snapshot=False)
    seen: list[str] = []

    async def fetch(project: str) -> BlockView:
        seen.append(project)
        return await source.fetch(project)

    async def active() -> str:
        return "health"

    svc.shared.project.fetch = fetch
    svc.shared.project.active = active
    fake_engine.push(text_reply("Hi."))
    cid, _ = await client.turn("Hello")
    assert seen == ["health"]
    listed = await client._req(
        subjects.CHAT_CONVERSATIONS, ConversationsRequest(action="list"), ConversationsReply
    )
    assert [(c.id, c.project) for c in listed.conversations] == [(cid, "health")]


async def test_without_a_memory_service_a_new_conversation_is_in_the_default_project(
    chat_runner, supervisor, client, fake_engine
):
    svc = await start(chat_runner, Source(None), snapshot=False)

    async def active() -> str:
        raise TimeoutError("no memory service")

    svc.shared.project.active = active
    fake_engine.push(text_reply("Hi."))
    cid, end = await client.turn("Hello")
    assert end.finish_reason == "stop"
    state = await client._req(
        subjects.CHAT_CONVERSATIONS, ConversationsRequest(action="list"), ConversationsReply
    )
    assert [(c.id, c.project) for c in state.conversations] == [(cid, "default")]


async def test_key_on_a_tools_change_retakes(chat_runner, supervisor, client, fake_engine):
    from loki_chat.tools import ToolBox, ToolSpec

    svc, source, cid = await retake_setup(chat_runner, client, fake_engine)
    await chat_runner.stop(svc)
    svc2 = await start(chat_runner, source, snapshot=True)
    svc2.shared.project.boot = svc.shared.project.boot  # same start token: only the tools

    async def pong(_args) -> str:
        return "pong"

    svc2.toolbox = ToolBox([ToolSpec(name="ping", description="Answers pong.", run=pong)])
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    assert_retaken(fake_engine.requests[-1].json["messages"])


async def test_key_on_the_no_tools_fallback_keeps_the_copy(
    chat_runner, supervisor, client, fake_engine
):
    """A step's fallback (no tools after two refusals) is not a change of the tools."""
    from loki_chat.tools import ToolBox, ToolSpec
    from tests.fakes.fake_engine import HTTPError

    source = Source(health())
    svc = await start(chat_runner, source, snapshot=True)

    async def pong(_args) -> str:
        return "pong"

    svc.toolbox = ToolBox([ToolSpec(name="ping", description="Answers pong.", run=pong)])
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(description="Getting fit by spring.")
    await client.turn("And now?", cid)
    fake_engine.push(HTTPError(500), HTTPError(500), text_reply("Ok."))
    _, end = await client.turn("Third", cid)
    assert end.finish_reason == "stop"
    last = fake_engine.requests[-1].json
    assert "tools" not in last  # the fallback ran
    assert "<context_update" in last["messages"][3]["content"]  # the copy and update kept
    assert "Project description:\nGetting fit.\n" in last["messages"][1]["content"]


async def test_the_conversation_list_filters_by_project_and_create_takes_one(
    chat_runner, supervisor, client, fake_engine
):
    await start(chat_runner, Source(None), snapshot=False)
    made = await client._req(
        subjects.CHAT_CONVERSATIONS,
        ConversationsRequest(action="create", title="Runs", project="health"),
        ConversationsReply,
    )
    fake_engine.push(text_reply("Hi."))
    other, _ = await client.turn("Hello")

    async def listed(project: str | None) -> list[tuple[str, str]]:
        reply = await client._req(
            subjects.CHAT_CONVERSATIONS,
            ConversationsRequest(action="list", project=project),
            ConversationsReply,
        )
        return sorted((c.id, c.project) for c in reply.conversations)

    cid = made.conversation.id
    assert made.conversation.project == "health"
    assert await listed("health") == [(cid, "health")]
    assert await listed("default") == [(other, "default")]
    assert await listed(None) == sorted([(cid, "health"), (other, "default")])


async def test_key_on_a_manual_compaction_retakes(chat_runner, supervisor, client, fake_engine):
    source = Source(health())
    svc = await chat_runner.start(
        tools=False, system_prompt="S.", proj_snapshot=True, policy=CompactAtStart(("manual",))
    )
    svc.shared.project.fetch = source.fetch
    fake_engine.push(text_reply("Hi."), text_reply("Fine."), text_reply("Ok."))
    cid, _ = await client.turn("Hello")
    source.view = health(description="Getting fit by spring.")
    await client.turn("And now?", cid)
    assert ("user", UPDATE_KIND) in stored(await client.state(cid))
    reply = await client.control(cid, "compact")
    assert reply.ok
    assert UPDATE_KIND not in [i for _, i in stored(await client.state(cid))]
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert [m["role"] for m in last] == ["system", "assistant", "user"]  # compacted
    assert last[2]["content"].startswith('<project name="Health">')
    assert "Project description:\nGetting fit by spring." in last[2]["content"]
    assert "<context_update" not in last[2]["content"]


async def test_key_on_an_end_of_turn_compaction_retakes(
    chat_runner, supervisor, client, fake_engine
):
    source = Source(health())
    svc = await chat_runner.start(
        tools=False, system_prompt="S.", proj_snapshot=True, policy=CompactAtStart(("end",))
    )
    svc.shared.project.fetch = source.fetch
    fake_engine.push(text_reply("Hi."), text_reply("Fine."))
    cid, _ = await client.turn("Hello")
    source.view = health(description="Getting fit by spring.")
    await client.turn("And now?", cid)  # the update is stored, then the end compaction retakes
    assert UPDATE_KIND not in [i for _, i in stored(await client.state(cid))]
    fake_engine.push(text_reply("Ok."))
    await client.turn("Third", cid)
    last = fake_engine.requests[-1].json["messages"]
    assert [m["role"] for m in last] == ["system", "assistant", "user"]  # compacted at the end
    assert "Project description:\nGetting fit by spring." in last[2]["content"]
    assert "<context_update" not in last[2]["content"]
