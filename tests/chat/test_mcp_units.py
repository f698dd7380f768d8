"""MCP's pure rules: the model's names (sanitised, capped, de-duplicated in a stable order),
the input schema passed through or its fallback, a call's result as the model's text, the
stdio file's entries, and the order the tools are offered in (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import types
from pydantic import ValidationError

from loki_chat.mcp.adapter import SCHEMA_FALLBACK_NOTE, ToolInfo, parameters, result_text
from loki_chat.mcp.config import StdioFile
from loki_chat.mcp.manager import McpManager, merge
from loki_chat.mcp.names import MAX_NAME, model_name, unique_names
from loki_chat.tools import ToolBox, ToolSpec
from loki_shared.messages.mcp import McpServerPatch, McpServerSpec


def test_names_are_sanitised_capped_and_deduplicated_deterministically():
    assert model_name("my server", "get-weather.now") == "my_server__get_weather_now"
    assert model_name("s", "héllo wörld!!") == "s__h_llo_w_rld_"
    long = model_name("s", "t" * 100)
    assert len(long) == MAX_NAME and long.startswith("s__t")
    pairs = [("a", "x-y"), ("a", "x.y"), ("a", "x_y"), ("b", "ping")]
    names = unique_names(pairs, taken=["b__ping"])
    assert names == ["a__x_y", "a__x_y_2", "a__x_y_3", "b__ping_2"]
    assert unique_names(pairs, taken=["b__ping"]) == names  # same input, same names
    capped = unique_names([("s", "t" * 100), ("s", "t" * 101)], ())
    assert capped[0] != capped[1] and all(len(n) <= MAX_NAME for n in capped)
    assert capped[1].endswith("_2")
    assert all(c.isalnum() or c == "_" for n in names + capped for c in n)


def test_an_object_schema_passes_through_and_any_other_gets_the_fallback():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert parameters(schema) == (schema, True)
    assert parameters({"properties": {"q": {}}})[1] is True
    for bad in (None, [], "x", {"type": "string"}, {"type": "array", "items": {}}):
        params, passed = parameters(bad)
        assert params == {"type": "object", "properties": {}} and passed is False
    assert SCHEMA_FALLBACK_NOTE.strip().startswith("(Its input schema")


def _result(*blocks, is_error=False, structured=None):
    return types.CallToolResult(
        content=list(blocks), is_error=is_error, structured_content=structured
    )


def test_results_text_images_errors_and_structured_content():
    text = types.TextContent(type="text", text="one")
    image = types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    assert (
        result_text(_result(text, types.TextContent(type="text", text="two")), "s__t", False)
        == "one\n\ntwo"
    )
    seen = result_text(_result(text, image), "s__t", True)
    assert not isinstance(seen, str) and len(seen.images) == 1
    assert seen.images[0].url.startswith("data:image/png;base64,") and "next message" in seen.text
    blind = result_text(_result(text, image), "s__t", False)
    assert isinstance(blind, str) and "does not see images" in blind
    err = result_text(
        _result(types.TextContent(type="text", text="bad city"), is_error=True), "s__t", False
    )
    assert err == "Error: `s__t` reported an error: bad city"
    assert result_text(_result(structured={"a": 1}), "s__t", False) == '{"a": 1}'
    assert result_text(_result(), "s__t", False) == "(the tool returned nothing)"


def test_the_stdio_file_is_read_entry_by_entry(tmp_path: Path):
    home = tmp_path
    f = StdioFile(home)
    assert f.servers() == {}
    (home / "mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "good": {"command": "python", "args": ["-m", "x"], "env": {"K": "v"}},
                    "bad name!": {"command": "python"},
                    "nocmd": {"args": []},
                    "off": {"command": "x", "enabled": False, "projects_off": ["p"]},
                }
            }
        )
    )
    got = f.servers()
    assert sorted(got) == ["good", "off"]
    assert got["good"].args == ("-m", "x") and got["good"].source == "file"
    assert not got["off"].on_for("q") and not got["off"].enabled
    (home / "mcp.json").write_text("{not json")
    assert f.servers() == {}


def test_the_api_can_name_no_command():
    """The API's bodies refuse unknown fields: a command, args or env is a 400 at the door."""
    for extra in ({"command": "sh"}, {"args": ["-c", "x"]}, {"env": {"A": "b"}}):
        with pytest.raises(ValidationError):
            McpServerSpec.model_validate({"name": "x", "url": "http://127.0.0.1:1/mcp", **extra})
        with pytest.raises(ValidationError):
            McpServerPatch.model_validate(extra)
    for url in ("file:///etc/passwd", "stdio:python", "python -m x"):
        with pytest.raises(ValidationError):
            McpServerSpec.model_validate({"name": "x", "url": url})


async def _noop(args):
    return "ok"


def test_builtins_first_then_servers_by_name_then_tools_by_name(tmp_path: Path):
    """The order is part of the prompt prefix: built-ins in their order, then servers by
    name, each one's tools by name; a server off for the project adds nothing; with no MCP
    tool the built-in box itself is offered (the request stays byte-identical)."""
    manager = McpManager(registry=None, home=tmp_path, timeout_s=1.0)  # type: ignore[arg-type]
    base = ToolBox([ToolSpec("recall", "r", _noop), ToolSpec("zeta__b", "z", _noop)])
    assert manager.box(base, "p") is base
    manager.configs = merge(
        {},
        {
            "zeta": {"url": "http://127.0.0.1:1/mcp"},
            "alpha": {"url": "http://127.0.0.1:2/mcp", "projects_off": ["other"]},
            "gone": {"url": "http://127.0.0.1:3/mcp"},
        },
    )
    manager.known = {
        "zeta": [ToolInfo("a", "", None), ToolInfo("b", "", {"type": "object"})],
        "alpha": [ToolInfo("c", "", None), ToolInfo("d", "", None)],
    }
    names = list(manager.box(base, "p").specs)
    assert names == ["recall", "zeta__b", "alpha__c", "alpha__d", "zeta__a", "zeta__b_2"]
    assert list(manager.box(base, "other").specs) == ["recall", "zeta__b", "zeta__a", "zeta__b_2"]
    assert manager.box(base, "p").schemas() == manager.box(base, "p").schemas()


def test_a_subagent_gets_the_mcp_tools_its_project_allows(tmp_path: Path):
    """Sub-agents: the recall tools, then the MCP tools of the main conversation's project
    (none of a server off for it); the verifier sends no tools at all (its request has no
    ``tools`` key: tests/chat/test_chat_verify.py)."""
    from types import SimpleNamespace

    from loki_chat.settings import Settings
    from loki_chat.subagent import SubagentHost
    from loki_chat.tools.box import CallContext
    from loki_chat.tools.memory import CURRENT_PROJECT

    manager = McpManager(registry=None, home=tmp_path, timeout_s=1.0)  # type: ignore[arg-type]
    manager.configs = merge({}, {"srv": {"url": "http://127.0.0.1:1/mcp", "projects_off": ["q"]}})
    manager.known = {"srv": [ToolInfo("look", "Looks.", None)]}
    base = ToolBox([ToolSpec("recall", "r", _noop), ToolSpec("subagent", "s", _noop)])
    shared = SimpleNamespace(
        settings=Settings(home=tmp_path), toolbox=base, mcp=manager, tokens=None, engine=None
    )
    CURRENT_PROJECT.set("p")
    assert list(SubagentHost(shared, CallContext("c1", "conv")).toolbox.specs) == [
        "recall",
        "srv__look",
    ]
    CURRENT_PROJECT.set("q")
    assert list(SubagentHost(shared, CallContext("c1", "conv")).toolbox.specs) == ["recall"]
