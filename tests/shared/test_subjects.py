"""The subject table (``loki_shared.subjects.EXCHANGES``) and the bus wrappers that use it."""

from __future__ import annotations

import pytest

from loki_chat.bus import ChatBus
from loki_gateway.bus import Bus
from loki_shared import subjects
from loki_shared.messages.base import Msg, Reply
from loki_shared.messages.chat import SendReply, SendRequest, StateReply
from loki_shared.messages.perf import PerfRecord

#: Names in subjects.py that are not one fixed subject a message travels on (besides every
#: ``*_PREFIX``, the head of a family of subjects: see :func:`is_fixed`).
NOT_IN_TABLE = {
    "CHAT_EVENTS_ALL",
    "KV_PERF_TOTALS",
}


def is_fixed(name: str) -> bool:
    """Whether the constant ``name`` of subjects.py names one fixed subject: not a prefix
    (``PREFIX``, ``*_PREFIX``), a wildcard or a bucket."""
    return name != "PREFIX" and not name.endswith("_PREFIX") and name not in NOT_IN_TABLE


def test_every_fixed_subject_has_its_request_and_reply_types():
    """Each ``loki.*`` subject constant is a row of the table, named by itself; requests are
    messages, replies are ``Reply`` models (they carry ``error``), events have none."""
    constants = {
        name: value
        for name, value in vars(subjects).items()
        if name.isupper() and isinstance(value, str) and value.startswith("loki.")
    }
    fixed = {name for name in constants if is_fixed(name)}
    assert {"CHAT_EVENTS_PREFIX", "HEALTH_PREFIX", "PROJECTS_PREFIX"}.isdisjoint(fixed)
    assert {"CHAT_SEND", "PROJECTS_LIST", "PROJECTS_CHANGED"} <= fixed
    for name, subject in constants.items():
        if name not in fixed:
            continue
        row = subjects.EXCHANGES.get(subject)
        assert row is not None, name
        assert row.subject == subject
        assert issubclass(row.request, Msg), name
        assert row.reply is None or issubclass(row.reply, Reply), name
    assert set(subjects.EXCHANGES) <= set(constants.values())


def test_the_table_refuses_a_message_or_reply_the_subject_does_not_carry():
    subjects.check(subjects.CHAT_SEND, SendRequest(content="hi"), SendReply)
    subjects.check(subjects.PERF_RECORD, PerfRecord.model_construct())
    subjects.check(subjects.chat_events("c1"), SendRequest(content="not in the table"))
    with pytest.raises(TypeError, match="SendRequest"):
        subjects.check(subjects.CHAT_STATE, SendRequest(content="hi"))
    with pytest.raises(TypeError, match="SendReply"):
        subjects.check(subjects.CHAT_SEND, SendRequest(content="hi"), StateReply)


async def test_the_bus_wrappers_check_before_sending():
    """Neither bus sends a message its subject does not carry (nothing is sent: the wrapped
    connections would fail if they were used)."""
    with pytest.raises(TypeError):
        await Bus(client=None).request(  # type: ignore[arg-type]
            subjects.CHAT_STATE, SendRequest(content="hi"), StateReply
        )
    chat_bus = ChatBus(broker=None)
    with pytest.raises(TypeError):
        await chat_bus.request(subjects.CHAT_SEND, SendRequest(content="hi"), StateReply, 1.0)
    with pytest.raises(TypeError):
        await chat_bus.publish(SendRequest(content="hi"), subjects.PERF_RECORD)
