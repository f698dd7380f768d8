"""Table tests of slot routing, the slot erase after a side job and the CACHE_RAM advice."""

from __future__ import annotations

import pytest

from loki_supervisor.routing import (
    EngineView,
    build_number,
    cache_ram_advice,
    erase_decision,
    route,
    shares_main_slot,
)

TWO = EngineView(external=False, total_slots=2, slot_n_ctx=(8192, 8192), ctx=8192)
ONE = EngineView(external=False, total_slots=1, slot_n_ctx=(8192,), ctx=8192)
EXTERNAL = EngineView(external=True, total_slots=0, slot_n_ctx=(), ctx=8192)
SHARED = EngineView(
    external=False, total_slots=2, slot_n_ctx=(16384, 16384), ctx=8192, shared_window=True
)
SMALL = EngineView(external=False, total_slots=2, slot_n_ctx=(4096, 4096), ctx=8192)
FOUR = EngineView(external=False, total_slots=4, slot_n_ctx=(8192,) * 4, ctx=8192)

KINDS = ["main", "compact", "verify", "subagent", "task", "bench", "foreign"]
TWO_SLOT_ROUTES = {
    "main": 0,
    "compact": 1,
    "verify": 1,
    "subagent": 1,
    "task": 1,
    "bench": 1,
    "foreign": 1,
}


@pytest.mark.parametrize("kind", KINDS)
def test_two_slots_route_by_kind(kind):
    assert route(kind, TWO) == TWO_SLOT_ROUTES[kind]


def test_continuation_summary_stays_on_slot_0():
    assert route("compact", TWO, continuation=True) == 0
    assert route("compact", TWO, continuation=False) == 1


@pytest.mark.parametrize(
    "view",
    [ONE, EXTERNAL, SHARED, SMALL, FOUR],
    ids=["one slot", "external", "shared window", "slots below CTX", "four slots"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_never_an_id_slot_outside_two_slots_of_ctx(view, kind):
    assert route(kind, view) is None
    assert route(kind, view, continuation=True) is None


def test_shares_main_slot():
    assert shares_main_slot("verify", None, ONE)
    assert not shares_main_slot("verify", 1, TWO)
    assert shares_main_slot("main", 0, TWO)
    assert not shares_main_slot("verify", None, EXTERNAL)


@pytest.mark.parametrize(
    "text,number",
    [
        ("b8660-abcdef0", 8660),
        ("b11434-1a2b", 11434),
        ("8700 (abc)", 8700),
        (None, None),
        ("", None),
        ("unknown", None),
    ],
)
def test_build_number(text, number):
    assert build_number(text) == number


OK = dict(
    kind="verify",
    job_done=True,
    cache_isolate=True,
    external=False,
    build=8660,
    total_slots=1,
    slot0_idle=True,
    in_flight=0,
)
ERASE = [
    ("all conditions met", {}, None),
    ("subagent", dict(kind="subagent"), None),
    ("task", dict(kind="task"), None),
    ("bench", dict(kind="bench"), None),
    ("not the last request of the job", dict(job_done=False), "not the end"),
    ("after a compaction", dict(kind="compact"), "compaction"),
    ("main is no side job", dict(kind="main"), "not a side job"),
    ("CACHE_ISOLATE off", dict(cache_isolate=False), "CACHE_ISOLATE off"),
    ("external preset", dict(external=True), "external"),
    ("unknown build", dict(build=None), "unknown"),
    ("old build", dict(build=8659), "8659"),
    ("two slots", dict(total_slots=2), "2 slots"),
    ("request in flight", dict(in_flight=1), "in flight"),
    ("slot 0 busy", dict(slot0_idle=False), "busy"),
    ("slot 0 unknown", dict(slot0_idle=None), "unknown"),
]


@pytest.mark.parametrize("name,change,reason", ERASE, ids=[e[0] for e in ERASE])
def test_erase_decision(name, change, reason):
    got = erase_decision(**{**OK, **change})
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


@pytest.mark.parametrize(
    "prompt,cached,advise",
    [
        (1000, 499, True),
        (1000, 500, False),
        (1000, 1000, False),
        (None, 10, False),
        (1000, None, False),
        (0, 0, False),
    ],
)
def test_cache_ram_advice(prompt, cached, advise):
    assert cache_ram_advice(prompt, cached) is advise
