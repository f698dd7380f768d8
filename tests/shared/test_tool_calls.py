"""The one tool-call assembler (``loki_shared.tool_calls.ToolCallAssembler``): by ``index``,
a missing index continues the current call, a new id at an index holding another id is a new
call, an ``arguments`` object is serialised once, a re-sent name replaces."""

from __future__ import annotations

import json

from loki_shared.tool_calls import ToolCallAssembler


def _frag(index=None, id_=None, name=None, arguments=None):
    out: dict = {}
    if index is not None:
        out["index"] = index
    if id_ is not None:
        out["id"] = id_
        out["type"] = "function"
    fn: dict = {}
    if name is not None:
        fn["name"] = name
    if arguments is not None:
        fn["arguments"] = arguments
    out["function"] = fn
    return out


def _triples(asm: ToolCallAssembler) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in asm.calls]


def test_two_calls_sharing_index_0_with_different_ids_are_two_calls():
    """ollama #15457: every call at index 0; the issue's exact fragments."""
    asm = ToolCallAssembler()
    shown_a = asm.add(_frag(0, "call_a", "recall_search", '{"query":"alpha"}'))
    shown_b = asm.add(_frag(0, "call_b", "recall_search", '{"query":"beta"}'))
    assert _triples(asm) == [
        ("call_a", "recall_search", '{"query":"alpha"}'),
        ("call_b", "recall_search", '{"query":"beta"}'),
    ]
    assert [json.loads(c.arguments) for c in asm.calls] == [{"query": "alpha"}, {"query": "beta"}]
    assert (shown_a["index"], shown_b["index"]) == (0, 1)  # apart for display


def test_fragments_by_index_interleaved_and_index_order():
    asm = ToolCallAssembler()
    asm.add(_frag(1, "b", "echo", '{"te'))
    asm.add(_frag(0, "a", "ping", ""))
    asm.add(_frag(1, None, None, 'xt":"x"}'))
    asm.add(_frag(0, None, None, "{}"))
    assert _triples(asm) == [("a", "ping", "{}"), ("b", "echo", '{"text":"x"}')]


def test_same_id_again_continues_the_call():
    asm = ToolCallAssembler()
    asm.add(_frag(0, "c1", "recall", '{"id":'))
    asm.add(_frag(0, "c1", None, '"r1"}'))
    assert _triples(asm) == [("c1", "recall", '{"id":"r1"}')]


def test_missing_index_continues_the_current_call():
    asm = ToolCallAssembler()
    asm.add(_frag(0, "c1", "recall", '{"id"'))
    asm.add(_frag(1, "c2", "search", '{"q"'))
    asm.add(_frag(None, None, None, ':"x"}'))  # the current call is c2
    asm.add(_frag(0, None, None, ':"r"}'))
    assert _triples(asm) == [("c1", "recall", '{"id":"r"}'), ("c2", "search", '{"q":"x"}')]
    # no index and no call yet: a first call
    solo = ToolCallAssembler()
    solo.add(_frag(None, "s1", "ping", "{}"))
    solo.add(_frag(None, None, None, ""))
    assert _triples(solo) == [("s1", "ping", "{}")]
    # no index with a new id: a new call after the current one
    solo.add(_frag(None, "s2", "pong", "{}"))
    assert _triples(solo) == [("s1", "ping", "{}"), ("s2", "pong", "{}")]


def test_arguments_object_is_serialised_once_and_replaces():
    asm = ToolCallAssembler()
    asm.add(_frag(0, "c1", "recall_search", {"query": "naïve café", "limit": 3}))
    assert asm.calls[0].arguments == '{"query": "naïve café", "limit": 3}'
    assert json.loads(asm.calls[0].arguments) == {"query": "naïve café", "limit": 3}
    # a server that sends the whole object again: still one object, not two glued together
    asm.add(_frag(0, None, None, {"query": "naïve café", "limit": 3}))
    assert json.loads(asm.calls[0].arguments) == {"query": "naïve café", "limit": 3}


def test_resent_name_replaces_and_junk_is_ignored():
    asm = ToolCallAssembler()
    asm.add(_frag(0, "c1", "recall", '{"id":'))
    asm.add(_frag(0, None, "recall", '"r2"}'))
    assert asm.add("not a fragment") is None
    assert asm.add_all("not a list") == []
    asm.add({"index": True, "function": {"arguments": ""}})  # bool is no index: continues
    assert _triples(asm) == [("c1", "recall", '{"id":"r2"}')]
    assert asm.as_openai() == [
        {"id": "c1", "type": "function", "function": {"name": "recall", "arguments": '{"id":"r2"}'}}
    ]
