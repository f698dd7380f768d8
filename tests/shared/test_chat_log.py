"""The display log's merge rule (loki_shared.chat_log), pure."""

from __future__ import annotations

from loki_shared.chat_log import coalesce
from loki_shared.messages.chat import ChatEvent


def ev(seq: int, delta: dict, **kw) -> ChatEvent:
    return ChatEvent(conversation="c", seq=seq, ts=float(seq), delta=delta, **kw)


def test_coalesce_merges_only_plain_text_runs():
    events = [
        ev(1, {"role": "assistant", "content": ""}),
        ev(2, {"content": "a"}),
        ev(3, {"content": "b"}),
        ev(4, {"reasoning_content": "r1"}),
        ev(5, {"reasoning_content": "r2"}),
        ev(6, {"content": "c"}),
        ev(7, {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
        ev(8, {"content": "d"}),
        ev(9, {}, finish_reason="stop"),
    ]
    out = coalesce(events)
    assert [(e.seq, e.merged_from, e.delta) for e in out] == [
        (3, 1, {"role": "assistant", "content": "ab"}),
        (5, 4, {"reasoning_content": "r1r2"}),
        (6, None, {"content": "c"}),
        (7, None, {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
        (8, None, {"content": "d"}),
        (9, None, {}),
    ]
    # when the text began: the first absorbed event with text (event 1's content is empty)
    assert out[0].ts == 2.0 and out[1].ts == 4.0
    assert events[1].delta == {"content": "a"}  # inputs untouched


def test_a_merged_event_merged_again_keeps_its_first_seq():
    """Coalescing an already compacted log (a replay of a compacted turn) keeps the range."""
    once = coalesce([ev(10, {"content": "a"}), ev(11, {"content": "b"})])
    twice = coalesce([*once, ev(12, {"content": "c"})])
    assert [(e.seq, e.merged_from, e.delta) for e in twice] == [(12, 10, {"content": "abc"})]


def test_marked_events_are_never_merged():
    events = [
        ev(1, {"content": "a"}),
        ev(2, {"content": "b"}, loki={"event": "user"}),
        ev(3, {"content": "c"}, usage={"prompt_tokens": 1}),
        ev(4, {"content": "d"}),
    ]
    assert [e.seq for e in coalesce(events)] == [1, 2, 3, 4]


def test_sse_data_names_the_merged_range_only_when_merged():
    merged = coalesce([ev(1, {"content": "a"}), ev(2, {"content": "b"})])[0]
    assert merged.sse_data()["merged_from"] == 1
    assert "merged_from" not in ev(3, {"content": "c"}).sse_data()
