"""Pure compaction rules: tail, big parts, summary cleaning, budget, frozen summary request."""

from __future__ import annotations

from functools import partial

import pytest

from loki_chat.compaction import summariser as S
from loki_chat.compaction.rules import (
    SummaryError,
    big_parts,
    budget_tokens,
    cites_ids,
    clean_summary,
    is_degenerate,
    last_request,
    strip_torso,
    tail_start,
    text_of,
)
from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.engine import TemplateProbe
from tests.builders import A, U
from tests.builders import T as tool_result

#: the rules' transcripts name the ``ping`` tool by default (the frozen copy's ``[tool ping]``)
T = partial(tool_result, name="ping")


def test_tail_starts_on_assistant_never_on_tool_or_reminder():
    msgs = [
        U("q1 " * 100),
        A("a1 " * 100),
        U("q2 " * 100),
        A(None, [("c1", "ping", "{}")]),
        T("c1", "r" * 400),
        U("[Loki] act", "act"),
        A("done"),
    ]
    b = tail_start(msgs)
    assert b is not None and msgs[b].role == "assistant"
    # the tool result is not separated from its call: the tail starts on the call
    assert b == 3
    # whatever the share, the start is an assistant message (never a tool or user message)
    for share in (0.05, 0.2, 0.5, 0.8):
        b = tail_start(msgs, share)
        assert b is not None and msgs[b].role == "assistant"
        assert msgs[b - 1].role in ("user", "tool", "assistant")


def test_tail_none_when_nothing_before():
    assert tail_start([U("hi")]) is None
    assert tail_start([A("x"), U("y")]) is None


def test_last_request_skips_reminders_and_summaries():
    torso = [U("real question"), A("a"), U("[Loki] act", "act"), U("old summary", "summary")]
    assert last_request(torso).content == "real question"


def test_big_parts_at_800_chars_including_tool_arguments():
    torso = [
        U("x" * 799),
        U("y" * 800),
        A(None, [("c", "write", '{"t":"' + "z" * 800 + '"}')]),
        T("c", "w" * 1000, name="write"),
        U("s" * 2000, "summary"),
    ]
    parts = big_parts(torso)
    assert [(p.index, p.role, p.tool_name) for p in parts] == [
        (1, "user", None),
        (2, "assistant", "write"),
        (3, "tool", "write"),
    ]


def test_strip_torso_keeps_ids_and_unarchived_blocks_whole():
    torso = [U("a" * 900), T("c", "b" * 900)]
    ids = {(0, "a" * 900): "r7", (1, "b" * 900): None}
    out = strip_torso(torso, ids)
    assert out[0].content == "a" * 400 + " […] (archived verbatim as recall:r7)"
    assert out[1].content == "b" * 900  # not archived: nothing lost


@pytest.mark.parametrize(
    "content,expected",
    [
        ("<think>plan</think>The summary.", "The summary."),
        ("<think>a</think>\n<think>b</think>\nThe summary.", "The summary."),
        ("plan only</think>The summary.", "The summary."),
        (
            "The parser strips <think>…</think> tags at the head.",
            "The parser strips <think>…</think> tags at the head.",
        ),
        # a </think> with no <think> before it: the template opened the block in the prompt
        ("reasoning</think>Summary quoting <think> later", "Summary quoting <think> later"),
    ],
)
def test_clean_summary_strips_reasoning_only_at_head(content, expected):
    assert clean_summary(content).text == expected


def test_clean_summary_quoted_tag_after_head_block_stays():
    text = "<think>x</think>Fixed the parser: it split on </think> wrongly."
    assert clean_summary(text).text == "Fixed the parser: it split on </think> wrongly."


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"content": "<think>never closed, the model ran out"}, "unclosed_think"),
        ({"content": "", "reasoning": "I thought a lot"}, "reasoning_only"),
        ({"content": "ok", "tool_calls": [{"id": "x"}]}, "tool_call"),
        ({"content": 'Sure. <tool_call>{"name":"recall","arguments":{}}</tool_call>'}, "tool_call"),
        ({"content": "   "}, "empty"),
        ({"content": "the same line\n" * 30}, "degenerate"),
        ({"content": "ab" * 300}, "degenerate"),
    ],
)
def test_clean_summary_failures(kwargs, reason):
    with pytest.raises(SummaryError) as exc:
        clean_summary(**kwargs)
    assert exc.value.reason == reason


def test_clean_summary_length_keeps_text_marked():
    out = clean_summary("Decisions: use Redis. State: half done", finish_reason="length")
    assert out.text == "Decisions: use Redis. State: half done […]" and out.cut == "length"


def test_clean_summary_safety_net_at_budget_times_six():
    words = " ".join(f"fact{i} is {i * 7} units," for i in range(1000))
    out = clean_summary(words, budget=256)
    assert out.cut == "safety_net"
    assert out.text.endswith(" […]") and len(out.text) <= 256 * 6 + 4
    # under the net: a long summary comes back whole
    text = words[:1500]
    assert clean_summary(text, budget=256).text == text.strip()


def test_degenerate_detection_spares_normal_text():
    normal = (
        "The user builds a parser in Go. Decided: keep the tokenizer separate. "
        "Open question: how to report errors. Files: lexer.go, parser.go "
        "(recall:r3). Progress: lexer done, parser half done, tests next."
    )
    assert not is_degenerate(normal)


def test_budget_indexed_on_window():
    assert budget_tokens(2048) == 256
    assert budget_tokens(65536) == 1638
    assert budget_tokens(1_000_000) == 2048


#: The transcript path's request, frozen (key off: compaction requests stay byte-identical).
FROZEN_TRANSCRIPT_REQUEST = (
    b'{"chat_template_kwargs":{"enable_thinking":false},"max_tokens":256,"messages":[{"con'
    b'tent":"You write the memory of a conversation that is being compacted. Summarise the'
    b" conversation you are given so the assistant can go on without it.\\nKeep: the user's"
    b" goals and requests, every decision taken, every constraint and preference stated, o"
    b"pen questions, names, numbers and facts that matter later.\\nSome long blocks were ar"
    b'chived verbatim: they appear as an excerpt followed by \\"archived verbatim as recall'
    b':r<N>\\". Cite every such id exactly as recall:r<N> next to what it contains, so the '
    b"assistant can bring the block back with recall(id).\\nIn code work, also keep each fi"
    b"le created or modified (path and purpose), the errors met and how they were solved, "
    b"and the build and test commands.\\nWrite plain text, concise, in the conversation's l"
    b"anguage. Do not call any tool. Put the state of progress last: what is done, what is"
    b' in progress, what comes next.","role":"system"},{"content":"Conversation to summari'
    b"se:\\n\\n[user]: Build me a parser\\n\\n[assistant calls ping]: {}\\n\\n[tool ping]: <X400"
    b'> [\xe2\x80\xa6] (archived verbatim as recall:r1)\\n\\n[Loki note]: [Loki] act","role":"user"}]'
    b',"model":"m","stream":false,"temperature":0.2}'
)


def test_transcript_request_matches_frozen_copy():
    torso = [
        U("Build me a parser"),
        A(None, [("c", "ping", "{}")]),
        T("c", "x" * 900),
        U("[Loki] act", "act"),
    ]
    ids = {(2, "x" * 900): "r1"}
    transcript = S.render_transcript(torso, ids, set(ids))
    body = S.transcript_request(
        transcript=transcript,
        model="m",
        budget=256,
        local=True,
        id_slot=None,
        template_kwargs={"enable_thinking": False},
    )
    raw = S.encode(body)
    assert raw == FROZEN_TRANSCRIPT_REQUEST.replace(b"<X400>", b"x" * 400)
    # an external API gets no llama.cpp-only field
    ext = S.transcript_request(
        transcript=transcript, model="gpt", budget=256, local=False, id_slot=0, template_kwargs=None
    )
    assert "chat_template_kwargs" not in ext and "id_slot" not in ext and "tools" not in ext


def test_continuation_request_is_sent_request_plus_one_demand():
    sent = {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.9,
        "top_k": 40,
        "tools": [{"type": "function", "function": {"name": "ping"}}],
        "model": "m",
        "id_slot": 0,
    }
    after = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "next"}]
    body = S.continuation_request(
        sent,
        after,
        "DEMAND",
        budget=300,
        local=True,
        id_slot=0,
        template_kwargs={"enable_thinking": False},
    )
    assert body["messages"][:2] == sent["messages"]
    assert body["messages"][2] == after[0]
    # the demand joins the trailing user message: never two consecutive user messages
    assert body["messages"][3] == {"role": "user", "content": "next\n\nDEMAND"}
    assert body["stream"] is False and "stream_options" not in body
    assert body["temperature"] == 0.2 and "top_k" not in body
    assert body["tool_choice"] == "none" and body["tools"] == sent["tools"]
    assert body["max_tokens"] == 300 and body["id_slot"] == 0
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_continuation_demand_joins_a_trailing_user_message_with_content_parts():
    """Issue 16: a strict-alternation template (Gemma's) refuses two user messages in a row;
    a trailing image turn (content parts) takes the demand as one more text part."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    parts = [{"type": "text", "text": "look"}, image]
    sent = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": parts}]}
    body = S.continuation_request(
        sent, [], "DEMAND", budget=300, local=True, id_slot=None, template_kwargs=None
    )
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == [*parts, {"type": "text", "text": "DEMAND"}]
    assert sent["messages"][1]["content"] == parts  # the sent request is left as it was


@pytest.mark.parametrize(("supports_tools", "cite"), [(False, False), (True, True), (None, True)])
def test_recall_ids_are_cited_unless_the_template_drops_tools(supports_tools, cite):
    probe = TemplateProbe(template_hash="h", supports_tools=supports_tools)
    assert cites_ids(probe) is cite
    assert cites_ids(None) is True  # not probed (an external API): as before the probe


def test_a_summary_before_big_parts_is_skipped_not_the_end():
    torso = [U("s" * 2000, "summary"), U("y" * 800), T("c", "w" * 900, name="write")]
    assert [(p.index, p.role) for p in big_parts(torso)] == [(1, "user"), (2, "tool")]


def test_one_line_repeated_in_a_short_text_is_degenerate():
    assert is_degenerate("Done.\nDone.\nDone.\nNext: tests.")  # under 200 bytes: by lines
    assert not is_degenerate("Goal: a parser.\nDone: lexer.\nDone: tests.\nNext: errors.")
    assert not is_degenerate("Done.\nDone.\nNext: tests.\nThen: docs.")  # half: not more
    assert is_degenerate("a" * 200) and not is_degenerate("a" * 199)  # by zlib from 200 bytes


def test_the_text_of_parts_joins_texts_and_names_images():
    parts = [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "what is it?"},
    ]
    assert text_of(ChatMessage(role="user", content=parts)) == "Look:\n[image]\nwhat is it?"
    assert text_of(ChatMessage(role="assistant", content=None)) == ""
