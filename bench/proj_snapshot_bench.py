"""PROJ_SNAPSHOT: what memory writes cost the prompt cache, key off vs on (issue 18).

A scripted 30-turn session in one project (a description, an instructions file, six pages,
three trackers to start with) during which 8 pages are written (by the model or the person:
the same change of the project's state) and 10 tracker values are logged. Each turn's request
is assembled by the chat service's own functions
(:class:`loki_chat.project.head.ProjectHead`, :func:`loki_chat.request.wire_messages`) and sent
to the real llama-server with the bundled model (one slot, prompt cache on), once with the
key off (the block rebuilt each turn at the head of the first user message) and once with it
on (a dated copy, changes in ``<context_update>`` blocks). The figure is the ratio of the
tokens the engine prefilled (Σ ``timings.prompt_n``) off / on, measured in the same run; and,
with the key on, the prefill of a turn with a memory change over that of a quiet turn.

The NATS and Redis round trips of the chat service are not part of it (they do not change
what the engine prefills); the replies are the engine's own (``max_tokens`` 24, greedy).
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import httpx

from bench import _common
from loki_chat.conversation import Conversation
from loki_chat.project.block import BlockView, TrackerLine
from loki_chat.project.head import ProjectHead
from loki_chat.request import wire_messages
from loki_shared.messages.chat import ChatMessage

TIMEOUT_S = {"quick": 900, "full": 1800}

TURNS = 30
PAGE_TURNS = (3, 6, 9, 12, 15, 18, 21, 24)  # 8 page writes
TRACKER_TURNS = (2, 4, 5, 8, 11, 14, 17, 20, 23, 27)  # 10 tracker values
MAX_TOKENS = 24
SYSTEM = "You are Loki, a helpful assistant. Answer briefly."

TOPICS = ["training", "sleep", "meals", "running", "stretching", "recovery", "hydration"]


def initial_view() -> BlockView:
    """The project at the start: enough text that a recomputation behind it shows."""
    pages = [
        f"- [{t.title()} notes]({t}.md) — what I know about {t}, tried and kept" for t in TOPICS[:6]
    ]
    return BlockView(
        project="health",
        name="Health",
        description=(
            "Getting fit for a half marathon in the spring: three runs a week, strength work "
            "twice, eight hours of sleep. Track weight, resting heart rate and weekly distance."
        ),
        index="\n".join(pages),
        trackers=(
            TrackerLine(slug="distance", name="distance", value="21", unit="km", date="2026-11-01"),
            TrackerLine(slug="resting-hr", name="resting hr", value="58", unit="bpm"),
            TrackerLine(slug="weight", name="weight", value="82.0", unit="kg", date="2026-11-01"),
        ),
        instructions="Answer in metric units. Keep plans realistic; ask before changing one.",
    )


def change(view: BlockView, turn: int) -> BlockView:
    """The project after the memory events of ``turn`` (a page written, a value logged)."""
    index, trackers = view.index, list(view.trackers)
    if turn in PAGE_TURNS:
        n = PAGE_TURNS.index(turn)
        if n % 2 == 0:  # a new page
            index += f"\n- [Week {n + 1} plan](week-{n + 1}.md) — sessions planned for week {n + 1}"
        else:  # an existing page rewritten: its description changes
            topic = TOPICS[(n // 2) % 6]
            index = index.replace(
                f"about {topic}, tried and kept", f"about {topic}, revised on turn {turn}"
            )
    if turn in TRACKER_TURNS:
        n = TRACKER_TURNS.index(turn)
        slug = ("weight", "distance", "resting-hr")[n % 3]
        value = {"weight": 82.0 - 0.3 * n, "distance": 21 + 3 * n, "resting-hr": 58 - n // 3}
        trackers = [
            TrackerLine(
                slug=t.slug,
                name=t.name,
                value=f"{value[slug]:g}",
                unit=t.unit,
                date=f"2026-11-{n + 2:02d}",
            )
            if t.slug == slug
            else t
            for t in trackers
        ]
    return BlockView(
        project=view.project,
        name=view.name,
        description=view.description,
        index=index,
        trackers=tuple(trackers),
        instructions=view.instructions,
    )


def user_text(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return (
        f"Turn {turn}: about {topic}. What should I change this week, given what you know of "
        f"my plan and my latest figures? One sentence."
    )


async def session(engine_url: str, snapshot: bool) -> dict[str, Any]:
    """Run the session once; per turn: prefilled tokens, cached tokens, memory change."""
    state = {"view": initial_view()}

    async def fetch(project: str) -> BlockView:
        return state["view"]

    head = ProjectHead(
        fetch=fetch, enabled=snapshot, boot="bench", clock=lambda: "2026-12-01 10:00 UTC"
    )
    conv = Conversation(id=f"bench-{snapshot}", project="health")
    system = head.system_prompt(SYSTEM)
    rows = []
    async with httpx.AsyncClient(timeout=300) as http:
        for turn in range(1, TURNS + 1):
            changed = turn in PAGE_TURNS or turn in TRACKER_TURNS
            if changed:
                state["view"] = change(state["view"], turn)
            conv.messages.append(ChatMessage(role="user", content=user_text(turn)))
            await head.begin_turn(conv)
            text = head.head(conv, system, None, "bundled")
            wire = wire_messages(system, conv.messages, head=text)
            body = {
                "messages": wire,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "cache_prompt": True,
            }
            r = await http.post(f"{engine_url}/v1/chat/completions", json=body)
            r.raise_for_status()
            data = r.json()
            reply = data["choices"][0]["message"].get("content") or "ok"
            conv.messages.append(ChatMessage(role="assistant", content=reply))
            head.end_turn(conv)
            timings = data.get("timings") or {}
            rows.append(
                {
                    "turn": turn,
                    "changed": changed,
                    "prompt_n": int(timings.get("prompt_n") or 0),
                    "cache_n": int(timings.get("cache_n") or 0),
                    "prompt_tokens": int((data.get("usage") or {}).get("prompt_tokens") or 0),
                }
            )
    return {"turns": rows}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    changed = [r["prompt_n"] for r in rows[1:] if r["changed"]]
    quiet = [r["prompt_n"] for r in rows[1:] if not r["changed"]]
    return {
        "prompt_n_sum": sum(r["prompt_n"] for r in rows),
        "prompt_n_changed_median": statistics.median(changed) if changed else None,
        "prompt_n_quiet_median": statistics.median(quiet) if quiet else None,
        "last_prompt_tokens": rows[-1]["prompt_tokens"],
    }


def run(quick: bool) -> dict[str, Any]:
    with _common.llama(ctx=8192) as engine:
        build = _common.engine_build(engine.url)
        off = asyncio.run(session(engine.url, snapshot=False))
        on = asyncio.run(session(engine.url, snapshot=True))
    s_off, s_on = summarize(off["turns"]), summarize(on["turns"])
    ratio = _common.ratio(s_off["prompt_n_sum"], s_on["prompt_n_sum"])
    write_cost = (
        _common.ratio(s_on["prompt_n_changed_median"], s_on["prompt_n_quiet_median"])
        if s_on["prompt_n_changed_median"] and s_on["prompt_n_quiet_median"]
        else None
    )
    rows = [
        [
            name,
            s["prompt_n_sum"],
            s["prompt_n_changed_median"],
            s["prompt_n_quiet_median"],
            s["last_prompt_tokens"],
        ]
        for name, s in (("PROJ_SNAPSHOT off", s_off), ("PROJ_SNAPSHOT on", s_on))
    ]
    return _common.result(
        "PROJ_SNAPSHOT: prefill of a 30-turn session with 8 page writes and 10 tracker values",
        tables=[
            _common.table(
                "Tokens the engine prefilled (timings.prompt_n), same engine, same run",
                [
                    "key",
                    "Σ prompt_n",
                    "median prompt_n, turn with a memory change",
                    "median prompt_n, quiet turn",
                    "last prompt (tokens)",
                ],
                rows,
                notes="Turn 1 (cold cache) is left out of the medians.",
            )
        ],
        targets=[
            _common.target(
                "prefill off / on (Σ prompt_n, same session)",
                round(ratio, 3),
                ">=",
                2,
                "",
                issue="18",
            ),
            _common.target(
                "key on: memory-change turn / quiet turn prefill (medians)",
                None if write_cost is None else round(write_cost, 3),
                "<=",
                3,
                "",
                issue="18",
            ),
        ],
        data={"off": off, "on": on, "summary": {"off": s_off, "on": s_on}},
        notes=(
            "Requests assembled by the chat service's ProjectHead and wire_messages, sent to "
            "llama-server (bundled model, one slot, greedy, max_tokens 24). With the key off a "
            "memory change moves the head of the first user message, so everything after it "
            "is prefilled again; with it on only the update block and the new message are."
        ),
        engine=build,
    )


def main() -> None:
    import json

    doc = run(quick=True)
    print(json.dumps(doc["tables"], indent=1))
    for t in doc["targets"]:
        print(t["name"], t["value"], t["target"], t["met"])


if __name__ == "__main__":
    main()
