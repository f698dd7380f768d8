"""Arguments of the code tools as models write them (issue 43): numbers and booleans sent
as strings, a list sent as one string, a time limit of 0, a huge or an infinite one. Each is
understood as meant, or refused with a result that says what to resend — never silently
read as something else (``replace_all: "false"`` replacing everything, ``paths:
"src/a.py"`` committing every change, ``offset: "200"`` reading from line 1).

The workspace service is replaced by a recorder of the requests the tools send (what is
under test is how the tools read their arguments); its replies are the contract's models.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from loki_chat.code.workspace import WorkspaceClient
from loki_chat.tools.code import CodeTarget, code_tools, numbered
from loki_chat.tools.code.commands import RUN_MAX_S
from loki_shared.messages.code import CodeState
from loki_shared.messages.workspace import (
    FilesReply,
    GitRequest,
    ReadReply,
    RunReply,
    WriteReply,
)

_REPLIES: dict[type[Any], BaseModel] = {
    ReadReply: ReadReply(path="a.py", text="x\n", first_line=1, last_line=1, total_lines=1),
    WriteReply: WriteReply(path="a.py", replacements=1, size=2),
    FilesReply: FilesReply(),
    RunReply: RunReply(exit_code=0, output="ok\n"),
}


class Recorder:
    """A request function that records (subject, message, timeout) and answers."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, BaseModel, float]] = []

    async def __call__(
        self, subject: str, message: BaseModel, reply_type: type[Any], timeout: float
    ) -> Any:
        self.sent.append((subject, message, timeout))
        return _REPLIES[reply_type]


async def _noop() -> None:
    return None


@pytest.fixture
def tools() -> tuple[dict[str, Any], Recorder]:
    rec = Recorder()
    target = CodeTarget(
        workspace=WorkspaceClient(rec, 30.0), project=lambda: "p", state=CodeState, changed=_noop
    )
    return {t.name: t.run for t in code_tools(target)}, rec


def _json(args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(args)  # as the tool box decodes a model's arguments
    return out


async def test_numbers_sent_as_strings_are_numbers(tools: tuple[dict[str, Any], Recorder]) -> None:
    run, rec = tools
    await run["read"](_json('{"path": "a.py", "offset": "200", "limit": " 50 "}'))
    req = rec.sent[-1][1]
    assert (req.offset, req.limit) == (200, 50)  # type: ignore[attr-defined]
    await run["list"](_json('{"path": ".", "depth": "5"}'))
    assert rec.sent[-1][1].depth == 5  # type: ignore[attr-defined]
    await run["run"](_json('{"command": "make", "timeout_s": "300"}'))
    assert rec.sent[-1][1].timeout_s == 300  # type: ignore[attr-defined]


async def test_booleans_sent_as_strings_are_booleans(
    tools: tuple[dict[str, Any], Recorder],
) -> None:
    run, rec = tools
    for raw, meant in (('"false"', False), ('"False"', False), ('"0"', False), ('"true"', True)):
        await run["edit"](
            _json(f'{{"path": "a.py", "old_string": "a", "new_string": "b", "replace_all": {raw}}}')
        )
        assert rec.sent[-1][1].replace_all is meant, raw  # type: ignore[attr-defined]


async def test_one_path_sent_as_a_string_narrows_the_commit(
    tools: tuple[dict[str, Any], Recorder],
) -> None:
    run, rec = tools
    await run["git"](_json('{"op": "commit", "message": "fix", "paths": "src/a.py"}'))
    req = rec.sent[-1][1]
    assert isinstance(req, GitRequest) and req.paths == ["src/a.py"]
    sent = len(rec.sent)
    text = await run["git"](_json('{"op": "commit", "message": "fix", "paths": {"a": 1}}'))
    assert len(rec.sent) == sent  # never "every change" for paths it cannot read
    assert "paths" in text and "Error" in text


async def test_odd_numbers_never_fail_the_call(tools: tuple[dict[str, Any], Recorder]) -> None:
    run, rec = tools
    for raw in ("Infinity", "-Infinity", "NaN", "1e999", '"soon"', "true", "-3"):
        text = await run["read"](_json(f'{{"path": "a.py", "offset": {raw}, "limit": {raw}}}'))
        assert "a.py" in str(text), raw
        req = rec.sent[-1][1]
        assert req.offset >= 1 and req.limit >= 1, raw  # type: ignore[attr-defined]


async def test_a_run_time_limit_is_bounded_both_ways(
    tools: tuple[dict[str, Any], Recorder],
) -> None:
    run, rec = tools
    for raw in ("1e9", "Infinity", "1e999"):
        await run["run"](_json(f'{{"command": "sleep 1", "timeout_s": {raw}}}'))
        _, req, wait = rec.sent[-1]
        assert req.timeout_s == RUN_MAX_S, raw  # type: ignore[attr-defined]
        assert wait <= RUN_MAX_S + 60, raw  # the call never waits for ever on a lost reply
    for raw in ("0", "-5", '"later"'):
        text = await run["run"](_json(f'{{"command": "sleep 1", "timeout_s": {raw}}}'))
        req = rec.sent[-1][1]
        assert 0 < req.timeout_s <= RUN_MAX_S, raw  # type: ignore[attr-defined]
        assert "timeout_s" in str(text), raw  # said: the default was used


def test_a_line_cut_at_the_byte_cap_says_how_to_see_the_rest() -> None:
    reply = ReadReply(
        path="min.js", text="var a=1;" * 10, first_line=1, last_line=1, total_lines=1,
        size=10**6, truncated=True,
    )  # fmt: skip
    head = numbered(reply).splitlines()[0]
    assert "run" in head and "longer than" in head


def test_text_in_another_encoding_gets_a_way_to_read_it() -> None:
    from loki_chat.tools.code.files import binary_hint

    reply = ReadReply(path="latin.c", binary=True, mime="text/plain; charset=iso-8859-1", size=9)
    text = binary_hint(reply)
    assert "iconv -f iso-8859-1 -t UTF-8 latin.c" in text and "edit" in text


def test_a_page_not_rendered_says_so() -> None:
    from loki_chat.tools.code.preview import page_text
    from loki_shared.messages.workspace import PreviewReply

    reply = PreviewReply(title="Busy", text="words", note="the browser gave no page within 30 s")
    assert "Not rendered: the browser gave no page within 30 s" in page_text(reply, "a.html")
    assert "Not rendered" not in page_text(PreviewReply(title="T", text="w"), "a.html")


async def test_a_request_over_the_bus_limit_says_send_less_not_try_again() -> None:
    from nats.errors import MaxPayloadError

    async def too_big(*args: Any) -> Any:
        raise MaxPayloadError

    target = CodeTarget(
        workspace=WorkspaceClient(too_big, 30.0),
        project=lambda: "p",
        state=CodeState,
        changed=_noop,
    )
    write = {t.name: t.run for t in code_tools(target)}["write"]
    text = await write({"path": "big.txt", "content": "x" * 100})
    assert "send less" in text and "in parts" in text and "Try again in a moment" not in text


async def test_a_command_too_long_is_refused_before_it_is_sent(
    tools: tuple[dict[str, Any], Recorder],
) -> None:
    run, rec = tools
    text = await run["run"]({"command": "echo " + "x" * 1_000_000})
    assert rec.sent == [] and "not valid" in str(text) and "command" in str(text)
