"""Code mode's pure rules (issue 43): the state kept in the head, the criteria, the texts the
model is given, a command's result and detail, the tools' order and labels, the workspace's
AGENTS.md in the project block and its update, the criteria in a summary message."""

from __future__ import annotations

import pytest

from loki_chat.code import rules
from loki_chat.code.workspace import WorkspaceClient
from loki_chat.compaction.policy import with_criteria
from loki_chat.conversation import Conversation
from loki_chat.project.block import WORKSPACE_AGENTS_HEADER, BlockView, render
from loki_chat.project.update import diff
from loki_chat.tools.code import CodeTarget, code_tools, head_tail, numbered, run_result
from loki_chat.tools.labels import MAIN_ARGUMENT, label
from loki_shared.messages.chat import ChatMessage, LokiMeta
from loki_shared.messages.code import CodeState, Criterion, CriterionSpec
from loki_shared.messages.workspace import ReadReply, RunReply


def specs(*items: tuple[str, str | None]) -> list[CriterionSpec]:
    return [CriterionSpec(text=t, command=c) for t, c in items]


def test_a_conversation_that_never_used_code_mode_stores_the_same_head():
    conv = Conversation(id="c")
    head = conv.to_head()
    assert "code" not in head
    conv.code = CodeState(mode="code", project="default")
    assert conv.to_head()["code"]["mode"] == "code"
    back = Conversation.from_blob(conv.to_head())
    assert back.code == conv.code
    conv.code = CodeState()  # back to chat, no criteria: the head is as before
    assert conv.to_head() == head | {"updated": conv.updated}
    assert Conversation.from_blob(head).code == CodeState()


def test_criteria_set_are_numbered_in_order_and_pending():
    made = rules.new_criteria(specs(("tests pass", "pytest -q"), ("README explains", None)))
    assert [(c.id, c.state, c.command) for c in made] == [
        ("c1", "pending", "pytest -q"),
        ("c2", "pending", None),
    ]


def test_the_system_prompt_gains_the_code_section_in_code_mode_only():
    assert rules.system_prompt("S.", CodeState(), "p") == "S."
    code = rules.system_prompt("S.", CodeState(mode="code", project="web"), "p")
    assert code.startswith("S.\n\nCode mode: you work in the workspace of the project web")
    for name in ("read", "write", "edit", "run", "git", "criteria", "preview"):
        assert name in code


@pytest.mark.parametrize(
    "mode,criteria,kind,continued,finish,expected",
    [
        ("code", True, "main", False, "stop", True),
        ("chat", True, "main", False, "stop", False),
        ("code", False, "main", False, "stop", False),
        ("code", True, "subagent", False, "stop", False),
        ("code", True, "main", True, "stop", False),
        ("code", True, "main", False, "length", False),
    ],
)
def test_the_loop_checks_a_main_final_answer_in_code_mode_with_criteria(
    mode, criteria, kind, continued, finish, expected
):
    state = CodeState(
        mode=mode, criteria=rules.new_criteria(specs(("x", "true"))) if criteria else []
    )
    assert (
        rules.should_check(state, kind=kind, continued=continued, finish_reason=finish) is expected
    )


def test_a_command_detail_says_its_end_and_its_last_lines():
    out = "\n".join(f"line {i}" for i in range(40))
    detail = rules.run_detail(RunReply(exit_code=1, output=out))
    assert detail.startswith("exit status 1\n") and detail.endswith("line 39")
    assert "line 24" not in detail and len(detail.splitlines()) == 1 + rules.DETAIL_LINES
    killed = rules.run_detail(RunReply(killed="timeout", duration_s=5.0))
    assert killed == "killed (timeout) after 5.0 s"
    assert len(rules.cut_detail("x" * 5000)) == rules.DETAIL_MAX


def test_the_corrective_reminder_lists_the_failed_criteria_with_their_details():
    failed = [
        Criterion(
            id="c2",
            text="tests pass",
            command="pytest",
            state="failed",
            detail="exit status 1\nE assert 1 == 2",
        )
    ]
    text = rules.corrective_reminder(failed, 1, 2)
    assert text.startswith("[Loki]") and "corrective round 1 of 2" in text
    assert "- c2 [failed] tests pass (command: pytest)" in text and "E assert 1 == 2" in text
    assert rules.unmet_note(failed, 2).endswith("c2")


def test_the_summary_carries_the_criteria_in_code_mode_only():
    crit = [Criterion(id="c1", text="builds", command="make", state="met", detail="exit status 0")]
    assert rules.summary_part(CodeState(criteria=crit)) == ""
    part = rules.summary_part(CodeState(mode="code", criteria=crit))
    assert "[Acceptance criteria of the task, as last checked]" in part
    assert "- c1 [met] builds (command: make)" in part
    summary = ChatMessage(role="user", content="[summary]", loki=LokiMeta(injected="summary"))
    tail = ChatMessage(role="user", content="go on")
    with_criteria([summary, tail], part)
    assert summary.content == "[summary]" + part and tail.content == "go on"


def test_read_shows_numbered_lines_the_range_and_the_total():
    reply = ReadReply(path="a.py", text="x = 1\ny = 2\n", first_line=3, last_line=4, total_lines=9)
    assert numbered(reply) == (
        "a.py: lines 3-4 of 9 (read on with offset=5)\n     3\tx = 1\n     4\ty = 2"
    )
    assert numbered(ReadReply(path="e", total_lines=0)) == "e: empty (0 lines, 0 bytes)."


def test_a_long_output_keeps_its_head_and_its_tail():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    cut = head_tail(text, 1000)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and len(cut) <= 1000
    assert "characters cut here" in cut
    result = run_result(RunReply(exit_code=2, output=text, output_bytes=10_008), 2000)
    assert result.startswith("exit code: 2 | duration: 0.0 s | output: 10008 bytes\n")
    assert result.endswith("TAIL")
    killed = run_result(RunReply(killed="timeout"), 2000)
    assert killed.startswith("killed: timeout") and "(no output)" in killed


def test_the_code_tools_come_in_their_fixed_order_each_labelled_by_a_required_argument():
    async def changed() -> None:
        return None

    target = CodeTarget(
        workspace=WorkspaceClient(lambda *a: None, 1.0),  # type: ignore[arg-type]
        project=lambda: "p",
        state=CodeState,
        changed=changed,
    )
    tools = code_tools(target)
    assert tuple(t.name for t in tools) == rules.CODE_TOOLS
    for tool in tools:
        key = MAIN_ARGUMENT[tool.name]
        assert key in tool.schema()["function"]["parameters"]["required"], tool.name
    assert label("run", {"command": "pytest -q"}) == "run pytest -q"
    assert label("edit", {"path": "src/a.py"}) == "edit src/a.py"


def test_the_workspace_agents_md_enters_the_block_and_its_change_is_a_full_text_update():
    before = BlockView(project="p", name="P", description="Web site.")
    assert "workspace_agents" not in before.to_dict()  # stored as before outside code mode
    after = BlockView(
        project="p", name="P", description="Web site.", workspace_agents="Run make test."
    )
    text = render(after)
    assert f"{WORKSPACE_AGENTS_HEADER}\nRun make test." in text
    assert BlockView.from_dict(after.to_dict()) == after
    update = diff(before, after, "2026-12-01 10:00 UTC")
    assert update is not None
    assert (
        "Workspace instructions (AGENTS.md at the repository's root) (as of 2026-12-01 10:00 UTC, full text):\nRun make test."
        in update
    )
    changed = BlockView(
        project="p", name="P", description="Web site.", workspace_agents="Run make check."
    )
    assert "full text):\nRun make check." in (diff(after, changed, "d") or "")
    assert "(removed)" in (diff(after, before, "d") or "")
    assert diff(after, after, "d") is None
