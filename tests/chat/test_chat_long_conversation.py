"""A conversation kept for months (issue 37), through the whole stack on the scripted engine:
finished turns are compacted in the stored log, the browser opens on the last turns and reads
older ones page by page, and a resume stays exact — inside a merged run too."""

from __future__ import annotations

import httpx
from httpx_sse import connect_sse

from tests.e2e.conftest import StackClient
from tests.fakes.fake_engine import FakeEngine, Stream, chunk

TURNS = 5
DELTAS = 40


def sse(base: str, cid: str, headers: dict | None = None, **params) -> tuple[list, list]:
    """(events, frames of other types) of one SSE read, until the stream has been quiet."""
    events, others = [], []
    with (
        httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=2.0)) as c,
        connect_sse(
            c, "GET", "/api/chat", params={"conversation": cid, **params}, headers=headers or {}
        ) as src,
    ):
        try:
            for frame in src.iter_sse():
                if frame.event == "message" and frame.data:
                    events.append(frame.json())
                elif frame.event not in ("message", ""):
                    others.append((frame.event, frame.json()))
        except httpx.ReadTimeout:
            pass
    return events, others


def render(events: list[dict]) -> str:
    """The text a reader sees: every content delta, in order."""
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events)


def user_texts(events: list[dict]) -> list[str]:
    return [
        e["choices"][0]["delta"]["content"]
        for e in events
        if (e.get("loki") or {}).get("event") == "user"
    ]


def test_long_conversation_pages_and_compacted_turns(fake_stack, fake_engine: FakeEngine) -> None:
    base = f"http://127.0.0.1:{fake_stack.config.web_port}"
    client = StackClient(base)
    for _ in range(TURNS):
        fake_engine.push(Stream(frames=[chunk({"content": f"w{i} "}) for i in range(DELTAS)]))
    cid = None
    for n in range(TURNS):
        cid = client.send(f"turn {n}", cid)
        client.wait_idle(cid, timeout=60)
    assert cid is not None
    full, _ = sse(base, cid)
    assert user_texts(full) == [f"turn {n}" for n in range(TURNS)]
    seqs = [e["seq"] for e in full]
    assert seqs == sorted(set(seqs))
    # turns 1-4 were compacted when the next one started: one merged text each, which
    # names the first seq it stands for; the last turn is stored as streamed
    merged = [e for e in full if e.get("merged_from") is not None]
    assert len(merged) >= TURNS - 1
    first_merged = merged[0]
    assert first_merged["choices"][0]["delta"]["content"] == "".join(
        f"w{i} " for i in range(DELTAS)
    )
    # the browser opens on the last 2 turns, and is told where older history begins
    tail, others = sse(base, cid, tail_turns=2)
    assert user_texts(tail) == ["turn 3", "turn 4"]
    [(kind, data)] = others
    assert kind == "history" and data["before"] == tail[0]["seq"]
    # older pages, newest first, until the start
    page = client.http.get(
        "/api/chat/history", params={"conversation": cid, "before": data["before"], "turns": 2}
    ).json()
    assert user_texts(page["events"]) == ["turn 1", "turn 2"] and page["older"]
    last_page = client.http.get(
        "/api/chat/history", params={"conversation": cid, "before": page["before"], "turns": 2}
    ).json()
    assert user_texts(last_page["events"]) == ["turn 0"] and not last_page["older"]
    stitched = last_page["events"] + page["events"] + tail
    # the same conversation: the same text, seqs increasing, the same last seq (a page
    # is coalesced, so a run of the last turn may be one event there)
    assert render(stitched) == render(full)
    got = [e["seq"] for e in stitched]
    assert got == sorted(set(got)) and set(got) <= set(seqs) and got[-1] == seqs[-1]
    # a resume is exact: after the last seq nothing, after a merged event what follows it
    rest, _ = sse(base, cid, headers={"Last-Event-ID": str(first_merged["seq"])})
    assert [e["seq"] for e in rest] == [s for s in seqs if s > first_merged["seq"]]
    # a resume inside a merged run gets the merged event, which says it began earlier:
    # the client reloads instead of appending text it has in part (docs/behaviour.md)
    inside = first_merged["merged_from"] + 3
    again, _ = sse(base, cid, headers={"Last-Event-ID": str(inside)})
    assert again[0]["seq"] == first_merged["seq"]
    assert again[0]["merged_from"] <= inside
    # a bad page request is a 4xx naming the parameter
    bad = client.http.get("/api/chat/history", params={"conversation": cid, "before": 0})
    assert bad.status_code in (400, 422)
