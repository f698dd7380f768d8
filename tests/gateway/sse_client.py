"""A small SSE reader for tests (parses what a browser's EventSource would)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.data)

    def ends_turn(self) -> bool:
        """A chat event with ``finish_reason`` set (decoded once: :func:`ended` asks every
        frame again each time a frame arrives)."""
        if self.__dict__.get("_ends") is None:
            self.__dict__["_ends"] = bool(
                self.data and self.event is None and self.json()["choices"][0].get("finish_reason")
            )
        return self.__dict__["_ends"]


def parse_frames(lines) -> Any:
    """Yield :class:`Frame` objects from an iterator of text lines (comments-only frames too)."""
    frame = Frame()
    has = False
    for line in lines:
        if line == "":
            if has:
                yield frame
            frame, has = Frame(), False
            continue
        has = True
        if line.startswith(":"):
            frame.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            frame.id = value
        elif name == "event":
            frame.event = value
        elif name == "data":
            frame.data = value if not frame.data else frame.data + "\n" + value


def read_events(
    client: httpx.Client,
    conversation: str,
    *,
    last_id: int | None = None,
    until=None,
    timeout: float = 20.0,
    keep_comments: bool = False,
    headers: dict[str, str] | None = None,
) -> list[Frame]:
    """Open ``GET /api/chat`` and collect frames until ``until(frames)`` is true (or the
    stream ends). Raises TimeoutError after ``timeout`` seconds."""
    hdrs = dict(headers or {})
    if last_id is not None:
        hdrs["Last-Event-ID"] = str(last_id)
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    with client.stream(
        "GET",
        "/api/chat",
        params={"conversation": conversation},
        headers=hdrs,
        timeout=httpx.Timeout(timeout, connect=5),
    ) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for frame in parse_frames(resp.iter_lines()):
            if frame.comments and not (frame.data or frame.event or frame.id):
                if keep_comments:
                    frames.append(frame)
            elif frame.data or frame.event:
                frames.append(frame)
            if until is not None and frames and until(frames):
                return frames
            if time.monotonic() > deadline:
                raise TimeoutError(f"SSE: condition not met; got {len(frames)} frames")
    return frames


def ended(frames: list[Frame], turns: int = 1) -> bool:
    """True once ``turns`` end-of-turn events (finish_reason set) have been received."""
    return sum(1 for f in frames if f.ends_turn()) >= turns


def render(events: list[dict[str, Any]]) -> list[Any]:
    """A canonical view of a display log: consecutive text deltas of one key merged, seqs
    dropped. Two event lists render alike when they show the same thing."""
    out: list[Any] = []
    for ev in events:
        delta = dict(ev["choices"][0]["delta"]) if "choices" in ev else dict(ev["delta"])
        fin = ev["choices"][0].get("finish_reason") if "choices" in ev else ev.get("finish_reason")
        marks = {k: ev.get(k) for k in ("usage", "timings", "loki") if ev.get(k) is not None}
        text_keys = [k for k in ("content", "reasoning_content") if k in delta]
        plain = (
            not fin and not marks and len(text_keys) == 1 and set(delta) <= {text_keys[0], "role"}
        )
        if plain and out and out[-1][0] == "text" and out[-1][1] == text_keys[0]:
            out[-1] = ("text", text_keys[0], out[-1][2] + delta[text_keys[0]], out[-1][3])
            continue
        if plain:
            out.append(("text", text_keys[0], delta[text_keys[0]], delta.get("role")))
            continue
        out.append(("event", delta, fin, marks))
    return out
