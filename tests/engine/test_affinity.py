"""Table tests of the pool's routing rules (loki_supervisor.affinity): one test per clause
of the module docstring, named after it."""

from __future__ import annotations

import pytest

from loki_supervisor.affinity import (
    MAIN_KINDS,
    Ask,
    Choice,
    EngineLoad,
    SlotState,
    choose,
)

SYS = "s0"  # the shared system prompt's fingerprint
A = ("s0", "a1", "a2", "a3")  # conversation a's prompt so far
B = ("s0", "b1", "b2")


def slot(
    engine: str,
    id_slot: int,
    conversation: str | None = None,
    fingerprints: tuple[str, ...] = (),
    *,
    busy: bool = False,
    waiting: int = 0,
    last_used: float = 0.0,
    side: bool = False,
) -> SlotState:
    return SlotState(engine, id_slot, busy, waiting, conversation, fingerprints, last_used, side)


def load(engine: str, order: int, held: int = 0, waiting: int = 0, slots: int = 2) -> EngineLoad:
    return EngineLoad(engine, order, held, waiting, slots)


E2 = [load("e1", 0), load("e2", 1)]


def main(conversation: str = "a", fps: tuple[str, ...] = A + ("a4",)) -> Ask:
    return Ask("main", conversation, fps)


def where(choice: Choice) -> tuple[str | None, int | None, str]:
    return (choice.engine, choice.id_slot, choice.reason)


# --- affine policy, main-like asks ------------------------------------------------------


def test_main_kinds():
    assert {"main", "prewarm"} == MAIN_KINDS
    assert Ask("main", "a", ()).main_like
    assert Ask("prewarm", "a", ()).main_like
    assert Ask("compact", "a", (), continuation=True).main_like
    assert not Ask("compact", "a", ()).main_like
    for kind in ("verify", "subagent", "task", "bench", "foreign"):
        assert not Ask(kind, "a", ()).main_like


def test_affine_free_slot_is_granted():
    slots = [
        slot("e1", 0, "b", B, last_used=5),
        slot("e1", 1),
        slot("e2", 0, "a", A, last_used=3),
        slot("e2", 1),
    ]
    c = choose(main(), slots, E2)
    assert where(c) == ("e2", 0, "affine")
    assert c.prefix == 4
    assert c.moved_from is None and c.wait_for is None


@pytest.mark.parametrize("kind", ["prewarm", "compact"])
def test_affine_prewarm_and_continuation_compact_follow_the_prefix(kind):
    slots = [slot("e1", 0), slot("e2", 0, "a", A, last_used=1)]
    ask = Ask(kind, "a", A + ("a4",), continuation=kind == "compact")
    assert where(choose(ask, slots, E2)) == ("e2", 0, "affine")


def test_affine_longest_prefix_wins():
    slots = [
        slot("e1", 0, "a", A[:2], last_used=9),
        slot("e2", 1, "a", A, last_used=1),
    ]
    c = choose(main(), slots, E2)
    assert where(c) == ("e2", 1, "affine") and c.prefix == 4


def test_affine_prefix_is_the_common_part_of_an_edited_conversation():
    # the user edited message 2: the slot still holds messages 0-1 of this conversation
    slots = [slot("e1", 0), slot("e2", 0, "a", A, last_used=1)]
    c = choose(main(fps=("s0", "a1", "x2")), slots, E2)
    assert where(c) == ("e2", 0, "affine") and c.prefix == 2


def test_affine_tie_prefers_the_conversations_own_slot():
    # another conversation's slot that holds just the system prompt ties at prefix 1
    slots = [
        slot("e1", 0, "z", (SYS,), last_used=9),
        slot("e2", 0, "a", ("s0", "x1"), last_used=1),
    ]
    c = choose(main(), slots, E2)
    assert where(c) == ("e2", 0, "affine") and c.prefix == 1


def test_affine_tie_prefers_most_recently_used_then_engine_order():
    slots = [
        slot("e1", 0, "a", A, last_used=1),
        slot("e2", 0, "a", A, last_used=2),
    ]
    assert where(choose(main(), slots, E2)) == ("e2", 0, "affine")
    slots = [slot("e2", 0, "a", A, last_used=2), slot("e1", 1, "a", A, last_used=2)]
    assert where(choose(main(), slots, E2)) == ("e1", 1, "affine")


def test_affine_tie_prefers_a_free_slot_over_a_busy_one():
    slots = [
        slot("e1", 0, "a", A, busy=True, last_used=9),
        slot("e2", 0, "a", A, last_used=1),
    ]
    assert where(choose(main(), slots, E2)) == ("e2", 0, "affine")


def test_affine_another_conversations_whole_prompt_counts():
    # the slot holds only the shared system prompt (a prewarm of another conversation)
    slots = [slot("e1", 0), slot("e2", 0, "z", (SYS,), last_used=1)]
    c = choose(main("new", ("s0", "n1")), slots, [load("e1", 0, held=0), load("e2", 1, held=1)])
    assert where(c) == ("e2", 0, "affine") and c.prefix == 1


def test_affine_another_conversations_longer_prompt_does_not_count():
    # b's slot shares only the system prompt: a new conversation does not evict it
    slots = [slot("e1", 0, "b", B, last_used=5), slot("e2", 0)]
    c = choose(main("new", ("s0", "n1")), slots, E2)
    assert where(c) == ("e2", 0, "new")
    assert c.prefix == 0


def test_affine_side_jobs_prompt_counts_only_whole():
    slots = [
        slot("e1", 0, None, ("s0", "v1"), side=True, last_used=5),
        slot("e2", 0, None, (SYS,), side=True, last_used=1),
        slot("e2", 1),
    ]
    c = choose(main("new", ("s0", "n1")), slots, E2)
    assert where(c) == ("e2", 0, "affine") and c.prefix == 1


def test_affine_wait_for_busy_affine_slot_below_the_bound():
    slots = [slot("e1", 0), slot("e2", 0, "a", A, busy=True, last_used=1)]
    c = choose(main(), slots, E2, queue_max=1)
    assert c == Choice(None, None, "wait", wait_for=("e2", 0))
    assert not c.granted


def test_affine_wait_for_a_slot_others_wait_for_below_the_bound():
    # not busy, but an earlier asker waits for it: FIFO, the asker queues behind
    slots = [slot("e1", 0), slot("e2", 0, "a", A, waiting=1, last_used=1)]
    c = choose(main(), slots, E2, queue_max=2)
    assert c.wait_for == ("e2", 0) and c.reason == "wait"


def test_overloaded_beyond_the_bound_goes_to_the_least_loaded():
    slots = [
        slot("e1", 0, "a", A, busy=True, waiting=1, last_used=1),
        slot("e1", 1),
        slot("e2", 0),
        slot("e2", 1, busy=True),
    ]
    engines = [load("e1", 0, held=1, waiting=1), load("e2", 1, held=1)]
    c = choose(main(), slots, engines, queue_max=1)
    assert where(c) == ("e2", 0, "overloaded")
    assert c.moved_from == "e1" and c.prefix == 0


def test_overloaded_queue_max_zero_never_waits_while_a_slot_is_free():
    slots = [slot("e1", 0, "a", A, busy=True, last_used=1), slot("e2", 0)]
    c = choose(main(), slots, E2, queue_max=0)
    assert where(c) == ("e2", 0, "overloaded") and c.moved_from == "e1"


def test_overloaded_may_move_within_the_affine_engine():
    slots = [
        slot("e1", 0, "a", A, busy=True, waiting=1, last_used=1),
        slot("e1", 1),
        slot("e2", 0, busy=True),
        slot("e2", 1, busy=True),
    ]
    engines = [load("e1", 0, held=1, waiting=1), load("e2", 1, held=2)]
    c = choose(main(), slots, engines)
    assert where(c) == ("e1", 1, "overloaded") and c.moved_from == "e1"


def test_overloaded_prefers_a_smaller_prefix_of_its_own():
    slots = [
        slot("e1", 0, "a", A, busy=True, waiting=1, last_used=5),
        slot("e1", 1),
        slot("e2", 0, "a", A[:2], last_used=1),
    ]
    c = choose(main(), slots, E2)
    assert where(c) == ("e2", 0, "overloaded") and c.prefix == 2


def test_overloaded_avoids_evicting_another_conversation():
    # e2 is idle but its free slot holds b's prompt; e1 has a side-used slot free
    slots = [
        slot("e1", 0, "a", A, busy=True, waiting=1, last_used=5),
        slot("e1", 1, None, ("s0", "v1"), side=True, last_used=3),
        slot("e2", 0, "b", B, last_used=1),
    ]
    engines = [load("e1", 0, held=1, waiting=1), load("e2", 1, slots=1)]
    assert where(choose(main(), slots, engines)) == ("e1", 1, "overloaded")


def test_overloaded_nothing_free_waits_for_the_affine_slot():
    slots = [
        slot("e1", 0, "a", A, busy=True, waiting=3, last_used=1),
        slot("e2", 0, busy=True),
    ]
    c = choose(main(), slots, E2, queue_max=1)
    assert c.reason == "wait" and c.wait_for == ("e1", 0)


def test_new_goes_to_the_least_loaded_engine():
    slots = [slot("e1", 0, busy=True), slot("e1", 1), slot("e2", 0), slot("e2", 1)]
    engines = [load("e1", 0, held=1), load("e2", 1)]
    c = choose(main("n", ("s0", "n1")), slots, engines)
    assert where(c) == ("e2", 0, "new") and c.moved_from is None


def test_new_least_loaded_is_per_slot_ties_by_order():
    # e1: 2 held of 4 slots (0.5), e2: 1 held of 2 slots (0.5): tie, e1 comes first
    slots = [slot("e1", k) for k in range(4)] + [slot("e2", 0), slot("e2", 1)]
    engines = [load("e1", 0, held=2, slots=4), load("e2", 1, held=1, slots=2)]
    assert where(choose(main("n", ("n0",)), slots, engines))[:2] == ("e1", 0)
    # waiting counts as load: e1 (2 held + 1 waiting of 4) > e2 (1 of 2)
    engines = [load("e1", 0, held=2, waiting=1, slots=4), load("e2", 1, held=1, slots=2)]
    assert where(choose(main("n", ("n0",)), slots, engines))[:2] == ("e2", 0)


def test_new_prefers_empty_then_side_then_least_recently_used():
    engines = [load("e1", 0, slots=3)]
    base = [
        slot("e1", 0, "b", B, last_used=1),
        slot("e1", 1, None, ("v",), side=True, last_used=9),
        slot("e1", 2),
    ]
    assert where(choose(main("n", ("n0",)), base, engines))[:2] == ("e1", 2)
    assert where(choose(main("n", ("n0",)), base[:2], engines))[:2] == ("e1", 1)
    lru = [slot("e1", 0, "b", B, last_used=5), slot("e1", 1, "c", ("c0",), last_used=2)]
    assert where(choose(main("n", ("n0",)), lru, engines))[:2] == ("e1", 1)


def test_new_unnamed_prompt_is_not_empty():
    # a main prompt of no conversation is side content: the empty slot is taken first
    slots = [slot("e1", 0, None, ("x0",)), slot("e1", 1)]
    c = choose(main("n", ("n0",)), slots, [load("e1", 0)])
    assert where(c) == ("e1", 1, "new")


def test_new_avoids_evicting_another_conversation_on_a_less_loaded_engine():
    # e2 is idle but its only free slot holds b's prompt; e1 has an empty slot
    slots = [slot("e1", 0, busy=True), slot("e1", 1), slot("e2", 0, "b", B, last_used=1)]
    engines = [load("e1", 0, held=1), load("e2", 1, slots=1)]
    assert where(choose(main("n", ("n0",)), slots, engines)) == ("e1", 1, "new")


def test_new_reports_the_prefix_the_slot_holds():
    slots = [slot("e1", 0, "b", B, last_used=1)]
    c = choose(main("n", ("s0", "n1")), slots, [load("e1", 0, slots=1)])
    assert where(c) == ("e1", 0, "new") and c.prefix == 1


def test_failover_when_the_last_engine_is_gone():
    slots = [slot("e2", 0), slot("e2", 1)]
    c = choose(main(), slots, [load("e2", 1)], last_engine="e1")
    assert where(c) == ("e2", 0, "failover") and c.moved_from == "e1"


def test_failover_onto_another_conversations_system_prompt():
    slots = [slot("e2", 0, "z", (SYS,), last_used=1), slot("e2", 1)]
    c = choose(main(), slots, [load("e2", 1)], last_engine="e1")
    assert where(c) == ("e2", 0, "failover") and c.prefix == 1 and c.moved_from == "e1"


def test_no_failover_while_the_last_engine_is_up():
    slots = [slot("e1", 0), slot("e2", 0)]
    c = choose(main(), slots, E2, last_engine="e1")
    assert c.reason == "new" and c.moved_from is None


def test_slots_of_a_gone_engine_are_ignored():
    slots = [slot("e1", 0, "a", A, last_used=1), slot("e2", 0)]
    c = choose(main(), slots, [load("e2", 1)], last_engine="e1")
    assert where(c) == ("e2", 0, "failover")


def test_new_nothing_free_waits_for_any_slot():
    slots = [slot("e1", 0, busy=True), slot("e2", 0, waiting=1)]
    c = choose(main("n", ("n0",)), slots, E2)
    assert c == Choice(None, None, "wait", wait_for=None)


def test_least_loaded_is_held_plus_waiting_per_slot():
    assert load("e1", 0, held=1, waiting=2, slots=4).load == 0.75
    assert load("e1", 0, held=0, slots=0).load == float("inf")


def test_an_engine_without_slots_is_never_chosen():
    slots = [slot("e0", 0), slot("e1", 0, busy=True), slot("e1", 1)]
    engines = [load("e0", 0, slots=0), load("e1", 1, held=1)]
    assert where(choose(main("n", ("n0",)), slots, engines))[:2] == ("e1", 1)


# --- affine policy, side asks -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["verify", "subagent", "task", "bench", "foreign", "compact"])
def test_apart_side_job_goes_to_another_engine(kind):
    slots = [
        slot("e1", 0, "a", A, busy=True, last_used=5),
        slot("e1", 1),
        slot("e2", 0, "b", B, last_used=3),
        slot("e2", 1),
    ]
    c = choose(Ask(kind, "a", A), slots, E2)
    assert where(c) == ("e2", 1, "apart")


def test_apart_prefers_empty_then_side_then_lru():
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, None, ("v",), side=True, last_used=1),
        slot("e2", 1),
    ]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e2", 1, "apart")
    assert where(choose(Ask("verify", "a", A), slots[:2], E2)) == ("e2", 0, "apart")
    sides = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, None, ("v",), side=True, last_used=4),
        slot("e2", 1, None, ("w",), side=True, last_used=2),
    ]
    assert where(choose(Ask("verify", "a", A), sides, E2)) == ("e2", 1, "apart")


def test_apart_least_loaded_other_engine():
    engines = [load("e1", 0), load("e2", 1, held=1), load("e3", 2)]
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, busy=True),
        slot("e2", 1),
        slot("e3", 0),
    ]
    assert where(choose(Ask("task", "a", A), slots, engines)) == ("e3", 0, "apart")


def test_apart_least_loaded_engine_before_an_empty_slot():
    # e2 is idle with a side-used slot, e3 is half busy with an empty one
    engines = [load("e1", 0), load("e2", 1), load("e3", 2, held=1)]
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, None, ("v",), side=True, last_used=3),
        slot("e3", 0, busy=True),
        slot("e3", 1),
    ]
    assert where(choose(Ask("verify", "a", A), slots, engines)) == ("e2", 0, "apart")


def test_evict_another_on_the_least_loaded_other_engine():
    engines = [load("e1", 0), load("e2", 1, held=1), load("e3", 2)]
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, busy=True),
        slot("e2", 1, "b", B, last_used=1),
        slot("e3", 0, "c", ("c0",), last_used=4),
        slot("e3", 1, "d", ("d0",), last_used=3),
    ]
    assert where(choose(Ask("verify", "a", A), slots, engines)) == ("e3", 1, "apart")


def test_apart_home_of_a_side_ask_is_where_the_main_prompt_ran_last():
    # a stale copy (before an edit) shares more with the side job's prompt than the current
    # main slot does: the side job still keeps away from the current one
    slots = [
        slot("e1", 0, "a", ("s0", "a1", "x2"), last_used=1),
        slot("e1", 1),
        slot("e2", 0, "a", A, last_used=5),
        slot("e2", 1),
    ]
    c = choose(Ask("verify", "a", ("s0", "a1", "x2", "v")), slots, E2)
    assert where(c) == ("e1", 1, "apart")


def test_apart_without_a_home_slot():
    slots = [slot("e1", 0, "b", B, last_used=1), slot("e2", 0)]
    assert where(choose(Ask("foreign", None, ()), slots, E2)) == ("e2", 0, "apart")


def test_side_on_the_home_engine_when_no_other_engine_has_a_harmless_slot():
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e1", 1),
        slot("e2", 0, "b", B, last_used=1),
        slot("e2", 1, busy=True),
    ]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e1", 1, "side")


def test_evict_another_other_engine_first_lru():
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e1", 1, "c", ("c0",), last_used=1),
        slot("e2", 0, "b", B, last_used=4),
        slot("e2", 1, "d", ("d0",), last_used=2),
    ]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e2", 1, "apart")
    slots[2] = slot("e2", 0, busy=True)
    slots[3] = slot("e2", 1, busy=True)
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e1", 1, "side")


def test_evict_another_includes_a_stale_copy_of_this_conversation():
    slots = [
        slot("e1", 0, "a", A, last_used=5),
        slot("e2", 0, "a", A[:2], last_used=1),
        slot("e2", 1, "b", B, last_used=3),
    ]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e2", 0, "apart")


def test_evict_own_main_prompt_as_last_resort():
    slots = [slot("e1", 0, "a", A, last_used=5), slot("e2", 0, busy=True)]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e1", 0, "side")


def test_evict_own_only_after_another_conversation_on_the_same_engine():
    slots = [
        slot("e1", 0, "a", A, last_used=1),
        slot("e1", 1, "b", B, last_used=5),
        slot("e2", 0, busy=True),
    ]
    assert where(choose(Ask("verify", "a", A), slots, E2)) == ("e1", 1, "side")


def test_side_nothing_free_waits_for_any_slot():
    slots = [slot("e1", 0, "a", A, busy=True), slot("e2", 0, waiting=1)]
    assert choose(Ask("verify", "a", A), slots, E2) == Choice(None, None, "wait")


# --- comparison policies ----------------------------------------------------------------


def test_round_robin_takes_the_engine_in_turn():
    slots = [slot("e1", 0, "a", A, last_used=1), slot("e2", 0), slot("e2", 1)]
    assert where(choose(main(), slots, E2, policy="round_robin", rr_next=0)) == (
        "e1",
        0,
        "round_robin",
    )
    c = choose(main(), slots, E2, policy="round_robin", rr_next=3)
    assert where(c) == ("e2", 0, "round_robin")
    assert c.moved_from == "e1" and c.prefix == 0


def test_round_robin_skips_an_engine_without_a_free_slot():
    slots = [slot("e1", 0, busy=True), slot("e2", 0, waiting=1), slot("e3", 0)]
    engines = [load("e1", 0), load("e2", 1), load("e3", 2)]
    c = choose(main("n", ("n0",)), slots, engines, policy="round_robin", rr_next=0)
    assert where(c) == ("e3", 0, "round_robin")


def test_round_robin_empty_then_lru_ignoring_prefixes():
    slots = [
        slot("e1", 0, "a", A, last_used=3),
        slot("e1", 1, "b", B, last_used=1),
    ]
    engines = [load("e1", 0)]
    c = choose(main(), slots, engines, policy="round_robin")
    assert where(c) == ("e1", 1, "round_robin") and c.moved_from == "e1"
    c = choose(main(), slots + [slot("e1", 2)], [load("e1", 0, slots=3)], policy="round_robin")
    assert where(c) == ("e1", 2, "round_robin")


def test_round_robin_empty_before_a_never_timed_slot():
    # a slot restored with last_used 0 still holds a prompt: the empty one goes first
    slots = [slot("e1", 0, "a", A, last_used=0), slot("e1", 1)]
    c = choose(main("n", ("n0",)), slots, [load("e1", 0)], policy="round_robin")
    assert where(c) == ("e1", 1, "round_robin")


def test_round_robin_reports_the_prefix_it_happens_to_keep():
    slots = [slot("e1", 0, "a", A, last_used=1)]
    c = choose(main(), slots, [load("e1", 0, slots=1)], policy="round_robin")
    assert where(c) == ("e1", 0, "round_robin") and c.prefix == 4 and c.moved_from is None


def test_least_busy_takes_the_least_loaded_engine():
    slots = [slot("e1", 0, "a", A, last_used=1), slot("e1", 1, busy=True), slot("e2", 0)]
    engines = [load("e1", 0, held=1), load("e2", 1, slots=1)]
    c = choose(main(), slots, engines, policy="least_busy")
    assert where(c) == ("e2", 0, "least_busy") and c.moved_from == "e1"


def test_least_busy_skips_a_full_engine_and_side_jobs_follow_it_too():
    slots = [slot("e1", 0, busy=True), slot("e2", 0, "a", A, last_used=1), slot("e2", 1)]
    engines = [load("e1", 0, held=1, slots=1), load("e2", 1, held=0)]
    c = choose(Ask("verify", "a", A), slots, engines, policy="least_busy")
    assert where(c) == ("e2", 1, "least_busy") and c.moved_from is None


@pytest.mark.parametrize("policy", ["round_robin", "least_busy"])
def test_comparison_nothing_free_waits_for_any_slot(policy):
    slots = [slot("e1", 0, busy=True), slot("e2", 0, waiting=2)]
    assert choose(main(), slots, E2, policy=policy) == Choice(None, None, "wait")


def test_unknown_policy_raises():
    with pytest.raises(ValueError):
        choose(main(), [], E2, policy="random")  # type: ignore[arg-type]


# --- invariants -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["affine", "round_robin", "least_busy"])
@pytest.mark.parametrize("kind", ["main", "verify"])
def test_never_a_busy_slot_nor_one_another_asker_waits_for(policy, kind):
    slots = [
        slot("e1", 0, "a", A, busy=True, last_used=9),
        slot("e1", 1, "a", A, waiting=1, last_used=8),
        slot("e2", 0, "b", B, last_used=1),
    ]
    c = choose(Ask(kind, "a", A), slots, E2, policy=policy, queue_max=0)
    assert (c.engine, c.id_slot) == ("e2", 0)
