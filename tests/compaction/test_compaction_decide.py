"""The compaction decisions alone (pure functions, no NATS, no engine): when, where to cut,
which summary path fits, how far the last resort shrinks."""

from __future__ import annotations

from loki_chat.compaction import summariser as S
from loki_chat.compaction.decide import (
    MAX_PER_STEP,
    REQUEST_HEADER,
    SUMMARY_HEADER,
    continuation_allowed,
    continuation_fits,
    continued,
    decide,
    generation_tokens,
    lookahead_tokens,
    overflow_factor,
    plan_cut,
    shrink_target,
    still_too_big,
    summary_message,
)
from loki_chat.compaction.rules import BIG_BLOCK_CHARS, excerpt
from loki_chat.compaction.state import Stamp
from loki_chat.context import OverflowInfo
from loki_chat.meter import estimate_tokens
from loki_shared.messages.chat import ChatMessage
from tests.builders import A, U


def why(trigger: str, used: int, n_ctx: int = 4096, **kw) -> str | None:
    args = {"threshold": 0.75, "since_step": 0, "refused_at": None, "generations": ()}
    args.update(kw)
    return decide(trigger, used, n_ctx, **args).why


def test_threshold_and_generation_guard():
    assert why("end", 3000) is None and why("end", 3100) == "threshold"
    # 1.2 x the longest generation no longer fits what is left, from half the window on
    assert why("start", 2000, generations=[1800]) is None  # below half: never
    assert why("start", 2200, generations=[100, 1800]) == "generation"
    assert why("start", 2200, generations=[1500]) is None  # 1800 fits in 1896


def test_turn_end_lookahead_compacts_what_the_next_message_would_push_past_the_threshold():
    # 3072 is the threshold of 4096: 2900 + 200 passes it at turn end only
    assert why("end", 2900, lookahead=200) == "lookahead"
    assert why("end", 2900, lookahead=100) is None
    for trigger in ("start", "mid"):
        assert why(trigger, 2900, lookahead=200) is None
    # never below half the window, however big the look-ahead
    assert why("end", 2000, lookahead=1200) is None
    assert why("end", 2100, lookahead=1200) == "lookahead"
    # no look-ahead: the rules as they were; past the threshold it stays "threshold"
    assert why("end", 2900) is None and why("end", 3100, lookahead=200) == "threshold"
    # the refusal hold-off applies to it as to the threshold
    assert why("end", 2900, lookahead=400, refused_at=2800) is None


def test_lookahead_expects_the_largest_recent_request_capped_at_a_tenth_of_the_window():
    def count(m: ChatMessage) -> int:
        return len(str(m.content))

    def conv(*sizes: int) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for size in sizes:
            out += [U("x" * size), A("ok")]
        return out

    assert lookahead_tokens(conv(50, 300, 120), 4096, count) == 300
    # only the last six real requests count
    assert lookahead_tokens(conv(300, 10, 10, 10, 10, 10, 10), 4096, count) == 10
    # reminders and summaries are not requests
    injected = [U("y" * 900, "summary"), A("ok"), U("z" * 900, "budget"), *conv(40)]
    assert lookahead_tokens(injected, 4096, count) == 40
    # capped at a tenth of the window; nothing without a window or a request
    assert lookahead_tokens(conv(3000), 4096, count) == 409
    assert lookahead_tokens(conv(300), 0, count) == 0
    assert lookahead_tokens([A("hi")], 4096, count) == 0


def test_manual_and_reactive_always_try_the_rest_never_without_a_window_or_past_the_cap():
    assert why("manual", 10) == "manual" and why("reactive", 10, n_ctx=0) == "reactive"
    assert why("end", 4000, n_ctx=0) is None
    assert why("mid", 4000, since_step=MAX_PER_STEP) is None
    assert why("mid", 4000, since_step=MAX_PER_STEP - 1) == "threshold"


def test_refusal_memory():
    # held off until the context grows 10% more ...
    assert why("end", 3500, refused_at=3300) is None
    assert why("end", 3640, refused_at=3300) == "threshold"
    # ... except at 90% of the window
    assert why("end", 3700, refused_at=3600) == "threshold"
    # a drop below the refusal forgets it
    d = decide("end", 3100, 4096, threshold=0.75, since_step=0, refused_at=3300, generations=())
    assert d.forget_refusal and d.why == "threshold"
    d = decide("end", 3500, 4096, threshold=0.75, since_step=0, refused_at=3300)
    assert not d.forget_refusal


def test_cut_keeps_the_tail_and_reinjects_the_request_only_when_the_tail_has_none():
    msgs = [U("a" * 4000), A("b" * 400), U("c" * 400), A("d" * 2000)]
    cut = plan_cut(msgs)
    assert cut is not None and cut.tail == msgs[3:] and cut.torso == msgs[:3]
    assert cut.request is msgs[2] and cut.reinject
    installed = summary_message(cut, "S")
    assert installed.content == SUMMARY_HEADER + "S" + REQUEST_HEADER + "c" * 400
    assert installed.loki is not None and installed.loki.injected == "summary"
    # the tail holds a user request: no re-injection
    cut = plan_cut([*msgs, U("e"), A("f")])
    assert cut is not None and not cut.reinject
    assert summary_message(cut, "S").content == SUMMARY_HEADER + "S"
    assert plan_cut([U("only")]) is None


def test_a_big_request_is_reinjected_as_its_excerpt_and_id():
    """A long paste re-injected whole would be a second verbatim copy (the ten-paste case of
    issue 23): archived, it comes back as its excerpt and id; not archived, whole."""
    paste = "def f(x):\n    return x * 2\n" * 100
    msgs = [U("hi"), A("hello"), U(paste), A("d" * 3000)]
    cut = plan_cut(msgs)
    assert cut is not None and cut.request is msgs[2] and cut.reinject
    installed = summary_message(cut, "S", {(2, paste): "r7"})
    tail = installed.content.split(REQUEST_HEADER, 1)[1]
    assert tail == paste[:400] + " […] (archived verbatim as recall:r7)"
    assert summary_message(cut, "S", {(2, paste): None}).content.endswith(paste)
    # the gain is measured with the excerpt: the cut saves the paste
    assert cut.gain > estimate_tokens(msgs[2]) - 200


def test_cut_refused_when_an_empty_summary_saves_under_a_fifth():
    cut = plan_cut([U("hi"), A("hello"), U("x" * 12000), A("ok")])
    assert cut is not None and not cut.saves_enough(3300)
    cut = plan_cut([U("x" * 12000), A("hello"), U("hi"), A("ok")])
    assert cut is not None and cut.saves_enough(3300)


def test_continued_leaves_out_the_trailing_user_messages():
    msgs = [A("a"), U("tool?"), A("b"), U("q1"), U("q2")]
    assert continued(msgs) == msgs[:3]
    assert continued([U("q")]) == []


def test_continuation_fits_on_the_engines_count_or_the_estimate():
    msgs = [U("q" * 400), A("a" * 400), U("next")]
    demand = estimate_tokens(S.CONTINUATION_DEMAND) + 40
    counted = Stamp({}, 1, "m", 4096, None, 1, tokens=3000)
    accepted = estimate_tokens(msgs[1])
    need = 3000 + (accepted + demand) * 1.05 + 256
    assert continuation_fits(counted, msgs, 0, int(need) + 1, 256)
    assert not continuation_fits(counted, msgs, 0, int(need) - 1, 256)
    # no count from the engine: ctx_used less what was accepted since and the trailing user
    uncounted = Stamp({}, 1, "m", 4096, None, 1)
    held = 3500 - estimate_tokens(msgs[2]) - accepted
    need = held + (accepted + demand) * 1.05 + 256
    assert continuation_fits(uncounted, msgs, 3500, int(need) + 1, 256)
    assert not continuation_fits(uncounted, msgs, 3500, int(need) - 1, 256)


def test_continuation_allowed_only_on_a_live_stamp():
    msgs = [U("q"), A("a")]
    stamp = Stamp({}, 2, "m", 4096, 0, epoch=3, tokens=100)
    args = dict(
        enabled=True,
        trigger="end",
        stamp=stamp,
        epoch=3,
        suspended=set(),
        messages=msgs,
        ctx_used=100,
        n_ctx=4096,
        budget=256,
    )
    assert continuation_allowed(**args)
    assert not continuation_allowed(**{**args, "enabled": False})
    assert not continuation_allowed(**{**args, "trigger": "manual"})
    assert not continuation_allowed(**{**args, "trigger": "reactive"})
    assert not continuation_allowed(**{**args, "epoch": 4})  # another request left since
    assert not continuation_allowed(**{**args, "suspended": {"m"}})
    assert not continuation_allowed(**{**args, "n_ctx": 8192})  # the window changed
    assert not continuation_allowed(**{**args, "messages": msgs[:1]})  # the view shrank


def test_shrink_aims_at_sixty_percent_corrected_by_the_real_size():
    overflow = OverflowInfo(status=400, body="", n_prompt_tokens=6000)
    assert overflow_factor(overflow, 4000) == 1.5
    assert overflow_factor(overflow, 8000) == 1.0  # never below 1
    assert overflow_factor(None, 4000) == 1.0
    assert shrink_target(4000, 1.5) == 1600
    assert still_too_big(1700, 1.5, 4000) and not still_too_big(1600, 1.5, 4000)


def test_leaves_no_room_counts_the_reply_cap_not_a_flat_share() -> None:
    from loki_chat.compaction.decide import leaves_no_room

    # issue 23: a 1,800-token prompt in a 2,048-token window with replies capped at 64 fits
    assert not leaves_no_room(1800, 2048, 64)
    assert leaves_no_room(2000, 2048, 64)
    # no cap, or a cap larger than a tenth of the window: 90% of the window, as before
    assert leaves_no_room(1844, 2048, None)
    assert not leaves_no_room(1800, 2048, None)
    assert leaves_no_room(1844, 2048, 512)
    assert not leaves_no_room(10_000, 0, 64)


def test_no_refusal_to_forget_without_one() -> None:
    for used in (100, 3500):  # nothing to do, and a threshold compaction
        d = decide("end", used, 4096, threshold=0.75, since_step=0, refused_at=None)
        assert d.forget_refusal is False


def test_an_overflow_against_an_empty_estimate_is_no_factor() -> None:
    overflow = OverflowInfo(status=400, body="too long", n_prompt_tokens=500)
    assert overflow_factor(overflow, 0) == 1.0
    assert overflow_factor(overflow, 250) == 2.0


def test_a_generation_is_its_completion_tokens_else_its_characters() -> None:
    assert generation_tokens({"completion_tokens": 7}, 400) == 7
    assert generation_tokens({}, 400) == 100 and generation_tokens(None, 400) == 100


def test_the_cut_sizes_the_request_it_reinjects() -> None:
    """The gain counts the re-injected request as it will be sent: its excerpt from
    BIG_BLOCK_CHARS characters on (exactly that many included), else whole."""
    for size in (BIG_BLOCK_CHARS - 1, BIG_BLOCK_CHARS):
        request = "q" * size
        msgs = [U("a" * 4000), A("b" * 400), U(request), A("d" * 3000)]
        cut = plan_cut(msgs)
        assert cut is not None and cut.reinject and cut.request is msgs[2]
        sent = request if size < BIG_BLOCK_CHARS else excerpt(request, "r0000000")
        wrapper = ChatMessage(role="user", content=SUMMARY_HEADER + REQUEST_HEADER + sent)
        torso = sum(estimate_tokens(m) for m in cut.torso)
        assert cut.gain == torso - estimate_tokens(wrapper), size
