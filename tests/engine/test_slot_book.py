"""Table tests of the pool's slot book (loki_supervisor.slot_book): what each pooled slot last
ran, each conversation's last engine, the snapshot the replicas mirror."""

from __future__ import annotations

import json

import pytest

from loki_supervisor.affinity import Ask, EngineLoad, SlotState, choose
from loki_supervisor.slot_book import SlotBook, SlotEntry, is_main_like

A = ["s0", "a1", "a2"]


def test_main_grant_sets_conversation_and_fingerprints():
    book = SlotBook()
    assert book.entry("e1", 0) is None
    prev = book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=10.0)
    assert prev is None
    assert book.entry("e1", 0) == SlotEntry("a", tuple(A), 10.0, side=False, saved=False)
    assert book.last_engine("a") == "e1"


@pytest.mark.parametrize(
    ("kind", "continuation", "main_like"),
    [
        ("main", False, True),
        ("prewarm", False, True),
        ("compact", True, True),
        ("compact", False, False),
        ("verify", False, False),
        ("subagent", False, False),
        ("task", False, False),
        ("bench", False, False),
        ("foreign", False, False),
    ],
)
def test_main_like_kinds(kind, continuation, main_like):
    assert is_main_like(kind, continuation) is main_like
    book = SlotBook()
    book.granted(
        "e1", 0, kind=kind, conversation="a", fingerprints=A, now=1.0, continuation=continuation
    )
    entry = book.entry("e1", 0)
    assert entry is not None
    assert entry.side is not main_like
    assert entry.conversation == ("a" if main_like else None)
    assert book.last_engine("a") == ("e1" if main_like else None)


def test_side_grant_replaces_the_conversation():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    prev = book.granted("e1", 0, kind="verify", conversation="a", fingerprints=["v0"], now=2.0)
    assert prev == SlotEntry("a", tuple(A), 1.0, side=False)
    assert book.entry("e1", 0) == SlotEntry(None, ("v0",), 2.0, side=True)
    # the conversation's last engine is still the one that ran its main prompt
    assert book.last_engine("a") == "e1"


def test_granted_returns_the_occupant_it_replaced():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.mark_saved("e1", 0, A[-1])
    prev = book.granted("e1", 0, kind="main", conversation="b", fingerprints=["s0", "b1"], now=2)
    assert prev is not None and prev.conversation == "a" and prev.saved
    assert book.entry("e1", 0) == SlotEntry("b", ("s0", "b1"), 2, side=False, saved=False)


def test_every_grant_clears_saved():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.mark_saved("e1", 0, A[-1])
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A + ["a3"], now=2.0)
    entry = book.entry("e1", 0)
    assert entry is not None and not entry.saved


def test_mark_saved_only_if_the_slot_still_holds_that_prompt():
    book = SlotBook()
    book.mark_saved("e1", 0, "x")  # nothing there: ignored
    assert book.entry("e1", 0) is None
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.mark_saved("e1", 0, "a1")  # an older prompt's fingerprint
    assert not book.entry("e1", 0).saved  # type: ignore[union-attr]
    book.mark_saved("e1", 0, "a2")
    assert book.entry("e1", 0).saved  # type: ignore[union-attr]
    book.granted("e1", 1, kind="main", conversation="b", fingerprints=[], now=1.0)
    book.mark_saved("e1", 1, "")
    assert not book.entry("e1", 1).saved  # type: ignore[union-attr]


def test_last_engine_follows_the_latest_main_grant():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.granted("e2", 1, kind="main", conversation="a", fingerprints=A, now=2.0)
    assert book.last_engine("a") == "e2"
    assert book.last_engine("unknown") is None


def test_main_grant_without_a_conversation_is_remembered_by_no_one():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation=None, fingerprints=A, now=1.0)
    assert book.entry("e1", 0) == SlotEntry(None, tuple(A), 1.0, side=False)
    assert book.snapshot()["last_engine"] == []


def test_last_engine_memory_is_bounded_lru():
    book = SlotBook(max_conversations=3)
    for i, c in enumerate(["a", "b", "c"]):
        book.granted("e1", 0, kind="main", conversation=c, fingerprints=[c], now=float(i))
    book.granted("e2", 0, kind="main", conversation="a", fingerprints=["a"], now=4.0)  # a: fresh
    book.granted("e1", 0, kind="main", conversation="d", fingerprints=["d"], now=5.0)
    assert book.last_engine("b") is None  # the least recently granted went first
    assert [book.last_engine(c) for c in "acd"] == ["e2", "e1", "e1"]


def test_default_memory_bound_is_ten_thousand():
    book = SlotBook()
    for i in range(10_001):
        book.granted("e1", 0, kind="main", conversation=f"c{i}", fingerprints=[], now=float(i))
    assert book.last_engine("c0") is None
    assert book.last_engine("c1") == "e1"
    assert len(book.snapshot()["last_engine"]) == 10_000


def test_forget_engine_drops_its_slots_but_keeps_last_engine():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.granted("e1", 1, kind="verify", conversation="a", fingerprints=["v"], now=1.0)
    book.granted("e2", 0, kind="main", conversation="b", fingerprints=["b"], now=1.0)
    book.forget_engine("e1")
    assert book.entry("e1", 0) is None and book.entry("e1", 1) is None
    assert book.entry("e2", 0) is not None
    assert book.last_engine("a") == "e1"


def test_slot_state_is_the_routers_view():
    book = SlotBook()
    assert book.slot_state("e1", 0) == SlotState("e1", 0, False, 0, None, (), 0.0)
    book.granted("e1", 0, kind="verify", conversation="a", fingerprints=["v"], now=3.0)
    assert book.slot_state("e1", 0, busy=True, waiting=2) == SlotState(
        "e1", 0, True, 2, None, ("v",), 3.0, side=True
    )


def test_failover_seen_through_the_book():
    # the book and the router together: the engine dies, the conversation's next turn fails over
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    book.forget_engine("e1")
    slots = [book.slot_state("e2", 0)]
    choice = choose(
        Ask("main", "a", tuple(A) + ("a3",)),
        slots,
        [EngineLoad("e2", 1, 0, 0, 1)],
        last_engine=book.last_engine("a"),
    )
    assert (choice.engine, choice.reason, choice.moved_from) == ("e2", "failover", "e1")


def test_snapshot_round_trips_through_json():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=5.0)
    book.mark_saved("e1", 0, "a2")
    book.granted("e2", 1, kind="task", conversation="a", fingerprints=["t"], now=6.0)
    book.granted("e2", 0, kind="main", conversation="b", fingerprints=["b"], now=7.0)
    data = json.loads(json.dumps(book.snapshot()))
    copy = SlotBook.restore(data)
    assert copy.snapshot() == book.snapshot()
    assert copy.entry("e1", 0) == SlotEntry("a", tuple(A), 5.0, side=False, saved=True)
    assert copy.entry("e2", 1) == SlotEntry(None, ("t",), 6.0, side=True)
    assert copy.last_engine("b") == "e2"


def test_restore_keeps_the_conversations_lru_order():
    book = SlotBook(max_conversations=2)
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=[], now=1.0)
    book.granted("e1", 0, kind="main", conversation="b", fingerprints=[], now=2.0)
    copy = SlotBook.restore(book.snapshot(), max_conversations=2)
    copy.granted("e1", 0, kind="main", conversation="c", fingerprints=[], now=3.0)
    assert copy.last_engine("a") is None and copy.last_engine("b") == "e1"


def test_restore_moves_last_used_onto_this_clock():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=100.0)
    book.granted("e1", 1, kind="main", conversation="b", fingerprints=["b"], now=90.0)
    data = book.snapshot(now=110.0)
    copy = SlotBook.restore(data, now=5000.0)
    assert copy.entry("e1", 0).last_used == 4990.0  # type: ignore[union-attr]
    assert copy.entry("e1", 1).last_used == 4980.0  # type: ignore[union-attr]
    # without both clocks, the values are kept as they are
    assert SlotBook.restore(data).entry("e1", 0).last_used == 100.0  # type: ignore[union-attr]
    assert SlotBook.restore(book.snapshot(), now=5000.0).entry("e1", 0).last_used == 100.0  # type: ignore[union-attr]


def test_restore_keeps_never_used_at_zero():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=0.0)
    copy = SlotBook.restore(book.snapshot(now=50.0), now=10.0)
    assert copy.entry("e1", 0).last_used == 0.0  # type: ignore[union-attr]


def test_snapshot_holds_no_prompt_text():
    book = SlotBook()
    book.granted("e1", 0, kind="main", conversation="a", fingerprints=A, now=1.0)
    assert set(book.snapshot()) == {"version", "now", "slots", "last_engine"}
    assert set(book.snapshot()["slots"][0]) == {
        "engine",
        "id_slot",
        "conversation",
        "fingerprints",
        "last_used",
        "side",
        "saved",
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"version": 2, "slots": []},
        [],
        {"version": 1, "slots": [{"engine": "e1"}]},
        {
            "version": 1,
            "slots": [
                {
                    "engine": "e1",
                    "id_slot": "x",
                    "conversation": None,
                    "fingerprints": [],
                    "last_used": 0,
                    "side": False,
                }
            ],
        },
        {
            "version": 1,
            "slots": [
                {
                    "engine": "e1",
                    "id_slot": 0,
                    "conversation": 5,
                    "fingerprints": [],
                    "last_used": 0,
                    "side": False,
                }
            ],
        },
        {"version": 1, "slots": [], "last_engine": [["a"]]},
    ],
    ids=[
        "empty",
        "other version",
        "not a dict",
        "missing keys",
        "bad slot id",
        "bad conversation",
        "bad last_engine",
    ],
)
def test_restore_rejects_malformed_data(data):
    with pytest.raises(ValueError):
        SlotBook.restore(data)
