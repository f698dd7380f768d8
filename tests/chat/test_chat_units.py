"""Unit rules of the turn loop's small steps (no server needed)."""

from __future__ import annotations

import json

from loki_chat.errors import EngineHTTPError
from loki_chat.meter import ContextMeter
from loki_chat.refusal import classify_refusal
from loki_chat.request import build_payload, encode, wire_messages
from loki_chat.settings import Settings
from loki_chat.stream import (
    StepAccumulator,
    decode_timings,
    decode_usage,
    extract_text_tool_calls,
)
from loki_chat.tools import EMPTY_PARAMETERS, ToolSpec, cut_for_model, parse_arguments
from loki_shared.messages.chat import ChatMessage, LokiMeta
from loki_shared.messages.engine import Lease


def test_tool_calls_assembled_by_index_name_replaces():
    acc = StepAccumulator()
    acc.apply(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "b",
                                "type": "function",
                                "function": {"name": "echo", "arguments": '{"te'},
                            }
                        ]
                    }
                }
            ]
        }
    )
    acc.apply(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "ping", "arguments": ""}}
                        ]
                    }
                }
            ]
        }
    )
    acc.apply(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 1, "function": {"name": "echo", "arguments": 'xt":"x"}'}}
                        ]
                    }
                }
            ]
        }
    )
    calls = acc.ordered_calls()
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "a", "ping", ""),
        (1, "b", "echo", '{"text":"x"}'),
    ]


def test_timings_usage_tolerant_decode():
    t = decode_timings(
        {"cache_n": "12", "prompt_n": 30, "predicted_n": True, "prompt_ms": 5, "draft_n": None}
    )
    assert t == {"prompt_n": 30, "prompt_ms": 5.0}
    assert "cache_n" not in t  # unknown, not 0
    assert decode_usage({"prompt_tokens": 10, "completion_tokens": "x"}) == {"prompt_tokens": 10}
    acc = StepAccumulator()
    acc.apply(
        {
            "choices": [],
            "usage": {"prompt_tokens": 7, "total_tokens": [1]},
            "timings": {"cache_n": 3.5, "prompt_n": 7},
        }
    )
    assert acc.usage == {"prompt_tokens": 7} and acc.timings == {"prompt_n": 7}
    assert acc.raw_timings == {"cache_n": 3.5, "prompt_n": 7}  # perf gets the raw object


def test_text_tool_calls_recognised():
    text = 'Let me look.\n<tool_call>\n{"name": "recall", "arguments": {"id": "r3"}}\n</tool_call>'
    rest, calls = extract_text_tool_calls(text)
    assert rest == "Let me look." and calls == [("recall", '{"id": "r3"}')]
    assert extract_text_tool_calls("<tool_call>not json</tool_call>")[1] == []


def test_wire_never_two_consecutive_user_messages_and_no_loki_marks():
    msgs = [
        ChatMessage(role="user", content="a"),
        ChatMessage(role="user", content="b"),
        ChatMessage(
            role="assistant",
            content="x",
            loki=LokiMeta(stopped=True),
            reasoning_content="r",
            reasoning_model="m",
        ),
    ]
    wire = wire_messages("sys", msgs, suffix="note")
    assert [m["role"] for m in wire] == ["system", "user", "assistant"]
    assert wire[1]["content"] == "a\n\nb"
    assert wire[2] == {"role": "assistant", "content": "x\n\nnote"}
    echo = wire_messages("sys", msgs, echo_model="m")
    assert echo[2]["reasoning_content"] == "r"
    assert "reasoning_content" not in wire_messages("sys", msgs, echo_model="other")[2]


def test_llama_only_fields_never_go_to_an_external_api():
    s = Settings(
        chat_template_kwargs={"enable_thinking": False}, top_k=40, min_p=0.05, temperature=0.7
    )
    local = build_payload(s, Lease(base_url="u", id_slot=0, model="m"), [], [])
    assert local["chat_template_kwargs"] == {"enable_thinking": False}
    assert local["id_slot"] == 0 and local["top_k"] == 40 and local["min_p"] == 0.05
    ext = build_payload(s, Lease(base_url="u", id_slot=0, model="m", external=True), [], [])
    for key in ("chat_template_kwargs", "id_slot", "top_k", "min_p"):
        assert key not in ext
    assert ext["temperature"] == 0.7
    assert encode(ext) == encode(json.loads(encode(ext)))  # canonical, stable


def test_tool_without_parameters_gets_empty_object_schema():
    async def run(_):
        return ""

    assert ToolSpec("t", "d", run).schema()["function"]["parameters"] == EMPTY_PARAMETERS


def test_arguments_parsing_and_result_cut():
    assert parse_arguments("")[0] == {} and parse_arguments("  ")[0] == {}
    assert parse_arguments('{"a": 1')[0] is None
    assert parse_arguments("[1]")[0] is None
    long = "x" * 30_050
    cut = cut_for_model(long, 30_000)
    assert cut.startswith("x" * 30_000) and "30050" in cut and "targeted" in cut
    assert cut_for_model("short", 30_000) == "short"


def test_overflow_recognised_only_from_labels_or_90_percent():
    def err(body, status=400):
        return EngineHTTPError("x", status=status, body=body)

    llama = json.dumps(
        {
            "error": {
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5000,
                "n_ctx": 4096,
                "message": "request (5000 tokens) exceeds the available context size (4096 tokens)",
            }
        }
    )
    kind, info = classify_refusal(err(llama), 100, 4096)
    assert kind == "overflow" and info.n_prompt_tokens == 5000 and info.n_ctx == 4096
    assert (
        classify_refusal(err('{"error":{"code":"context_length_exceeded"}}'), 0, 0)[0] == "overflow"
    )
    assert classify_refusal(err("Context size has been exceeded.", 500), 100, 4096)[0] == "pool"
    assert classify_refusal(err("template error", 500), 100, 4096)[0] == "other"
    assert classify_refusal(err("template error", 500), 3700, 4096)[0] == "overflow"
    assert classify_refusal(err("busy", 503), 4000, 4096)[0] == "other"


def test_ctx_used_counts_prompt_plus_generated_sent_back():
    meter = ContextMeter()
    msgs = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="yo")]
    meter.record(
        {"prompt_tokens": 100, "completion_tokens": 30},
        reasoning_pieces=20,
        reasoning_sent_back=False,
        count=2,
    )
    assert meter.used("sys", msgs) == 110
    meter.record({"prompt_tokens": 100, "completion_tokens": 30}, 20, True, 2)
    assert meter.used("sys", msgs) == 130
    msgs.append(ChatMessage(role="user", content="z" * 400))
    assert meter.used("sys", msgs) > 130 + 100  # new message added as an estimate
    meter.record(None, 0, False, 3)
    assert meter.measured is None and meter.used("sys", msgs) > 100


def test_events_after_seq_bounds():
    from loki_chat.conversation import Conversation

    conv = Conversation(id="c")
    for _ in range(10):
        conv.new_event({"content": "x"})
    del conv.log[:4]  # as after a reset: the log starts at seq 5
    assert [e.seq for e in conv.events_after(0)[0]] == list(range(5, 11))
    assert [e.seq for e in conv.events_after(7)[0]] == [8, 9, 10]
    assert conv.events_after(100)[0] == []
    events, more = conv.events_after(5, limit=2)
    assert [e.seq for e in events] == [6, 7] and more
