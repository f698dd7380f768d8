"""Issue 2, end to end: the stack as a user runs it, on the real llama-server and model."""

from __future__ import annotations

import time

from loki_cli.stack import Stack

from .conftest import StackClient, make_stack


def _client(stack: Stack) -> StackClient:
    return StackClient(f"http://127.0.0.1:{stack.config.web_port}")


def _content(events: list[dict]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if e["choices"][0]["delta"].get("role") != "user"
    )


def test_chat_persist_restart_resume(running_stack: Stack) -> None:
    client = _client(running_stack)

    # Turn 1: streamed deltas, then an end-of-turn event with usage and timings.
    conv = client.send("Reply with one word: pong")
    events = client.events(conv)
    assert any(e["choices"][0]["delta"].get("content") for e in events), events
    end = events[-1]
    assert end["choices"][0]["finish_reason"] in ("stop", "length")
    assert end.get("usage", {}).get("prompt_tokens", 0) > 0
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    client.wait_idle(conv)

    # Turn 2 in the same conversation: the engine reuses the prompt cache.
    client.send("And again, one word please.", conversation=conv)
    events2 = client.events(conv, last_event_id=seqs[-1])
    end2 = events2[-1]
    assert end2["choices"][0]["finish_reason"]
    assert end2["timings"]["cache_n"] > 0, end2["timings"]
    client.wait_idle(conv)

    # The perf service kept one record per completion with the cache figures.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        summary = client.http.get("/api/perf/summary").json()
        if summary["completions"] >= 2 and summary["cache_n"] > 0:
            break
        time.sleep(0.5)
    assert summary["completions"] >= 2 and summary["cache_n"] > 0, summary
    assert summary["prompt_n"] > 0

    state = client.http.get("/api/chat/state", params={"conversation": conv}).json()
    roles = [m["role"] for m in state["messages"] if m["role"] != "system"]
    assert roles == ["user", "assistant", "user", "assistant"], roles
    assert state["ctx_used"] > 0
    full = client.events(conv, last_event_id=0, until_turn_ends=2)

    # Restart the chat service: the conversation is intact.
    running_stack.restart_service("chat")
    deadline = time.monotonic() + 60
    while True:
        r = client.http.get("/api/chat/state", params={"conversation": conv})
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)
    assert r.json()["messages"] == state["messages"]

    # Reconnect with Last-Event-ID: exactly the events after it, nothing twice.
    middle = full[len(full) // 2]["seq"]
    # read up to the end of the conversation: as many turn ends as follow the middle (it
    # falls in either turn, depending on how long the model's two replies were)
    ends_after = sum(
        1
        for e in full
        if e["seq"] > middle and e.get("choices") and e["choices"][0].get("finish_reason")
    )
    resumed = client.events(conv, last_event_id=middle, until_turn_ends=ends_after)
    after = [e for e in full if e["seq"] > middle]
    # a replay of more than LOKI_SSE_COALESCE_MIN events is coalesced page by page, and the
    # pages start at the seq asked: a long reply's merged deltas may carry other seqs than in
    # the replay from 0; what was said, its turn ends and where it stops are the same
    seqs = [e["seq"] for e in resumed]
    assert seqs == sorted(set(seqs)) and seqs[0] > middle and seqs[-1] == after[-1]["seq"]
    assert _said(resumed) == _said(after)
    assert _ends(resumed) == _ends(after)


def _said(events: list[dict]) -> str:
    """The text of ``events``' deltas (content and reasoning), in order."""
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    return "".join((d.get("reasoning_content") or "") + (d.get("content") or "") for d in deltas)


def _ends(events: list[dict]) -> list[int]:
    """The seqs of ``events``' turn ends."""
    return [e["seq"] for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]


def test_whole_stack_restart_keeps_conversation(running_stack: Stack, stack_home) -> None:
    client = _client(running_stack)
    conv = client.send("Reply with one word: pong")
    client.events(conv)
    before = client.wait_idle(conv)
    running_stack.stop()

    second = make_stack(stack_home, running_stack.config.web_port)
    second.start()
    try:
        again = StackClient(f"http://127.0.0.1:{second.config.web_port}")
        deadline = time.monotonic() + 60
        while True:
            r = again.http.get("/api/chat/state", params={"conversation": conv})
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.json()["messages"] == before["messages"]
    finally:
        second.stop()
