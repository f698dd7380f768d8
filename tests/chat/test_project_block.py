"""The project block and PROJ_SNAPSHOT's pure rules: rendering, the update block, the
retake conditions, the removal of update blocks (docs/behaviour.md (projects))."""

from __future__ import annotations

from loki_chat.compaction.summariser import render_transcript
from loki_chat.conversation import Conversation
from loki_chat.project import BlockView, TrackerLine, diff, render, strip_updates
from loki_chat.project.snapshot import (
    UPDATE_KIND,
    ProjSnap,
    prompt_fingerprint,
    retake_reason,
    without_updates,
)
from loki_chat.request import wire_messages
from loki_shared.messages.chat import ChatMessage, LokiMeta

INDEX = "- [Plan](plan.md) — the plan\n- [Diet](diet.md) — what I eat"
WEIGHT = TrackerLine(slug="weight", name="weight", value="81.2", unit="kg", date="2026-11-30")


def view(**over) -> BlockView:
    values = dict(
        project="p1",
        name="Health",
        description="Getting fit.",
        index=INDEX,
        trackers=(WEIGHT,),
        instructions="",
    )
    values.update(over)
    return BlockView(**values)


def test_an_empty_project_renders_no_block():
    assert render(BlockView(project="default", name="Default")) == ""


def test_off_rendering_has_the_original_headers_and_no_date():
    text = render(view())
    assert text.startswith('<project name="Health">')
    assert "Memory index:\n- [Plan](plan.md)" in text
    assert "answer straight from this" in text
    assert "- weight: 81.2 kg (2026-11-30)" in text
    assert "as of" not in text


def test_on_rendering_dates_the_index_and_tracker_headers_without_the_answer_hint():
    text = render(view(instructions="Be brief."), as_of="2026-12-01 10:00 UTC")
    assert "Memory index (as of 2026-12-01 10:00 UTC):" in text
    assert "Tracker values (as of 2026-12-01 10:00 UTC):" in text
    assert "answer straight" not in text
    assert text.endswith("Project instructions (AGENTS.md):\nBe brief.\n</project>")


def test_pages_are_keyed_by_file_with_plus_tilde_minus():
    new_index = "- [Plan](plan.md) — the new plan\n- [Sleep](sleep.md) — hours"
    block = diff(view(), view(index=new_index), "D")
    assert block is not None
    assert block.startswith('<context_update from="loki">') and block.endswith("</context_update>")
    assert "Memory index changes (as of D):" in block
    lines = block.splitlines()
    assert "~ [Plan](plan.md) — the new plan" in lines
    assert "+ [Sleep](sleep.md) — hours" in lines
    assert "- [Diet](diet.md) — what I eat" in lines
    assert "the plan\n" not in block  # only the changed line, never the old text of a page


def test_a_renamed_page_title_is_one_change_of_the_same_key():
    block = diff(view(), view(index=INDEX.replace("[Plan]", "[Road map]")), "D")
    assert block is not None
    assert "~ [Road map](plan.md) — the plan" in block.splitlines()
    assert "+ " not in block and "\n- [" not in block


def test_trackers_get_one_full_line_by_slug():
    budget = TrackerLine(slug="budget", name="Budget", value="1200", unit="EUR", date="2026-12-01")
    new = view(trackers=(WEIGHT.__class__(**{**WEIGHT.__dict__, "value": "80.9"}), budget))
    block = diff(view(), new, "D")
    assert block is not None
    assert "Tracker values (as of D):\n- weight: 80.9 kg (2026-11-30)\n" in block
    assert "- Budget [budget]: 1200 EUR (2026-12-01)" in block
    gone = diff(view(), view(trackers=()), "D")
    assert gone is not None and "- weight: (tracker removed)" in gone


def test_prose_is_never_diffed_description_and_instructions_are_sent_whole():
    long = "Getting fit.\nSecond line of the description."
    block = diff(view(), view(description=long, instructions="Use metric units."), "D")
    assert block is not None
    assert f"Project description (as of D, full text):\n{long}" in block
    assert "Project instructions (AGENTS.md) (as of D, full text):\nUse metric units." in block


def test_an_index_whose_prose_changed_is_sent_whole():
    new_index = "Pages about health.\n" + INDEX + "\n- [Sleep](sleep.md) — hours"
    block = diff(view(), view(index=new_index), "D")
    assert block is not None
    assert f"Memory index (as of D, full text):\n{new_index}" in block
    assert "+ [Sleep]" not in block


def test_nothing_changed_is_no_update():
    assert diff(view(), view(), "D") is None


def snap(**over) -> ProjSnap:
    values = dict(
        as_of="D",
        text="T",
        announced=view(),
        project="p1",
        name="Health",
        prompt="fp",
        model="m",
        boot="b",
    )
    values.update(over)
    return ProjSnap(**values)


def reason(s: ProjSnap | None, live: BlockView | None = None, **over) -> str | None:
    args = dict(prompt="fp", model="m", boot="b", updates=0, max_updates=3)
    args.update(over)
    return retake_reason(s, live=live if live is not None else view(), **args)


def test_retake_conditions():
    assert reason(snap()) is None
    assert reason(None) == "first"
    assert reason(snap(), live=view(project="p2")) == "project"
    assert reason(snap(), live=view(name="Fitness")) == "name"
    assert reason(snap(), prompt="other") == "prompt"
    assert reason(snap(), model="m2") == "model"
    assert reason(snap(), boot="b2") == "restart"
    assert reason(snap(), updates=3) is None
    assert reason(snap(), updates=4) == "updates"


def test_the_prompt_fingerprint_covers_the_system_prompt_and_the_tools():
    tools = [{"type": "function", "function": {"name": "ping"}}]
    assert prompt_fingerprint("S.", tools) == prompt_fingerprint("S.", list(tools))
    assert prompt_fingerprint("S.", tools) != prompt_fingerprint("S2.", tools)
    assert prompt_fingerprint("S.", tools) != prompt_fingerprint("S.", None)


def update(text: str = "<context_update>x</context_update>") -> ChatMessage:
    return ChatMessage(role="user", content=text, loki=LokiMeta(injected=UPDATE_KIND))


def history() -> list[ChatMessage]:
    return [
        ChatMessage(role="user", content="hello"),
        ChatMessage(role="assistant", content="hi"),
        update("U1"),
        ChatMessage(role="user", content="what now?"),
        ChatMessage(role="assistant", content="this"),
    ]


def test_update_blocks_are_removed_from_the_whole_history():
    msgs = history()
    msgs.insert(0, update("U0"))
    assert strip_updates(msgs) == 2
    assert [m.content for m in msgs] == ["hello", "hi", "what now?", "this"]


def test_update_blocks_are_left_out_of_the_summariser_input():
    text = render_transcript(history(), {}, {})
    assert "U1" not in text and "what now?" in text


def test_the_update_is_sent_at_the_head_of_the_next_user_message():
    wire = wire_messages("S.", history())
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "user", "assistant"]
    assert wire[3]["content"] == "U1\n\nwhat now?"


def test_the_block_goes_at_the_head_of_the_first_user_message_only():
    wire = wire_messages("S.", history(), head="BLOCK")
    assert wire[1]["content"] == "BLOCK\n\nhello"
    assert wire[3]["content"] == "U1\n\nwhat now?"
    assert wire_messages("S.", history(), head=None) == wire_messages("S.", history())


def test_the_snapshot_is_persisted_with_the_conversation_and_omitted_when_unset():
    conv = Conversation(id="c1")
    blob = conv.to_blob()
    assert "proj_snap" not in blob and "project" not in blob
    conv.project = "p1"
    conv.proj_snap = snap()
    back = Conversation.from_blob(conv.to_blob())
    assert back.project == "p1"
    assert back.proj_snap == conv.proj_snap


def test_without_updates_keeps_everything_else():
    assert [m.content for m in without_updates(history())] == ["hello", "hi", "what now?", "this"]


async def test_a_continue_turn_stores_no_update_the_next_user_message_brings_it():
    from loki_chat.project.head import ProjectHead

    live = {"v": view()}

    async def fetch(project: str) -> BlockView:
        return live["v"]

    head = ProjectHead(fetch=fetch, enabled=True, boot="b", clock=lambda: "D")
    conv = Conversation(id="c1")
    conv.messages = [ChatMessage(role="user", content="hello")]
    await head.begin_turn(conv)
    assert head.head(conv, "S.", None, "m") is not None
    conv.messages.append(ChatMessage(role="assistant", content="cut rep"))
    live["v"] = view(description="Changed.")
    assert await head.begin_turn(conv) is False  # Continue: the assistant message stays last
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    conv.messages.append(ChatMessage(role="user", content="next"))
    assert await head.begin_turn(conv) is True
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "user"]
    assert conv.messages[2].loki.injected == UPDATE_KIND
    assert "Changed." in conv.messages[2].content
