"""A conversation that lives for months (issue 37): the cost of a turn must not grow with the
conversation's age.

One conversation of 1,000 turns (150 in quick mode) runs through the whole stack (NATS, Redis,
every service as its own process) on the scripted engine (``tests/fakes``): every reply is 300
content deltas, each answer's ``usage.prompt_tokens`` the request's size at about 4 characters
a token; summary requests (the compaction's) get a short summary, so the model view is
compacted as in daily use (window 32,768 tokens). Measured in the same run:

- the wall time of a turn (send → its end event read over SSE) and the bytes Redis received
  (``INFO stats`` ``total_net_input_bytes``, every service's writes during the turn) at turns
  10–20 against the last ten turns: targets ≤ 1.2× and ≤ 1.5× (medians). The wall time is
  taken against a baseline of the same moments: after each of those turns, a turn of a short
  conversation runs, and the ratio compares (long ÷ short) late with (long ÷ short) early, so a
  machine busier at the end than at the start does not pass for a cost of age (the raw ratio
  is kept in the result's data);
- opening the conversation in a browser (headless chromium, the page's scripts cached): the
  time until its last message is drawn (target ≤ 1 s); beside it the server side, the first
  SSE page (``tail_turns=20``) read in full against replaying the whole log;
- takeover: the owner chat instance is SIGKILLed (a second instance is running); the time
  from its lock's expiry to the new owner's first event of the next turn (load + turn start),
  at turn 20 and at the end (target ≤ 2 s whatever the length);
- Redis memory of the conversation's keys (``MEMORY USAGE``), reported.

Loopback only; bounded by :data:`TIMEOUT_S`.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import _common

TIMEOUT_S = {"quick": 1200, "full": 5400}
SECRET = "bench-secret-key-0123456789"
DELTAS = 300
LOCK_TTL_S = 3.0
SUMMARY = (
    "The person has been asking numbered questions ({n} so far) and the assistant answered "
    "each with a long list of counted words. No decision, file or open question is pending; "
    "the next message continues the same exercise."
)


def _responder_factory(fake: Any) -> Any:
    from tests.fakes.fake_engine import Stream, chunk, text_reply

    counter = {"n": 0}

    def respond(body: dict[str, Any]) -> Any:
        messages = body.get("messages", [])
        # the prompt's size as an engine would count it (about 4 characters a token), so the
        # context meter sees the conversation grow and compaction bounds the model view
        prompt = len(json.dumps(messages, ensure_ascii=False)) // 4
        text = json.dumps(messages[-1:], ensure_ascii=False)
        if "[Loki — compaction]" in text:
            summary = SUMMARY.format(n=counter["n"])
            usage = {"prompt_tokens": prompt, "completion_tokens": 60, "total_tokens": prompt + 60}
            return text_reply(summary, pieces=8, usage=usage)
        counter["n"] += 1
        frames: list[Any] = [chunk({"role": "assistant", "content": ""})]
        frames += [chunk({"content": f"w{i} "}) for i in range(DELTAS)]
        frames.append(chunk({}, "stop"))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": DELTAS * 2,
            "total_tokens": prompt + DELTAS * 2,
        }
        return Stream(frames=frames, usage=usage)

    return respond


def _read_until_end(base: str, cid: str, after: int, timeout: float = 120.0) -> tuple[int, float]:
    """Read ``cid``'s SSE stream after seq ``after`` until a turn's end; (its seq, time)."""
    deadline = time.monotonic() + timeout
    headers = {"Last-Event-ID": str(after)}
    with (
        httpx.Client(base_url=base, timeout=httpx.Timeout(timeout, read=timeout)) as c,
        c.stream("GET", "/api/chat", params={"conversation": cid}, headers=headers) as resp,
    ):
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                break
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if (data.get("loki") or {}).get("event") == "turn_end":
                return int(data["seq"]), time.monotonic()
    raise _common.BenchError(f"no turn end for {cid} after seq {after}")


def _first_event_after(base: str, cid: str, after: int, timeout: float = 60.0) -> float:
    """The time the first event after ``after`` arrives over SSE."""
    with (
        httpx.Client(base_url=base, timeout=httpx.Timeout(timeout, read=timeout)) as c,
        c.stream(
            "GET", "/api/chat", params={"conversation": cid}, headers={"Last-Event-ID": str(after)}
        ) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("data:"):
                return time.monotonic()
    raise _common.BenchError("no event")


def _open_time(base: str, cid: str, last_seq: int, tail: int | None) -> float:
    """Seconds from asking the stream to having read every replayed event up to ``last_seq``
    (``tail``: only the last turns, as the web UI opens a conversation)."""
    params: dict[str, Any] = {"conversation": cid}
    if tail:
        params["tail_turns"] = tail
    t0 = time.monotonic()
    with (
        httpx.Client(base_url=base, timeout=httpx.Timeout(120, read=120)) as c,
        c.stream("GET", "/api/chat", params=params) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("id:") and int(line[3:]) >= last_seq:
                return time.monotonic() - t0
    raise _common.BenchError("replay ended early")


def _paint_time(base: str, cid: str, last_question: str) -> float:
    """Seconds from opening ``#c=<cid>`` in headless Debian chromium (page already loaded
    once, so its scripts are cached like a person's) to the last user message drawn."""
    from playwright.sync_api import sync_playwright

    from bench.ui_render_bench import CHROMIUM, CHROMIUM_FLAGS

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            warm = context.new_page()
            warm.goto(base + "/")  # the page keeps streams open: never "network idle"
            warm.wait_for_selector("#input")
            page = context.new_page()  # a new tab: the conversation's address typed in it
            t0 = time.monotonic()
            page.goto(base + f"/#c={cid}")
            page.wait_for_function(
                "(q) => { const u = document.querySelectorAll('.msg.user');"
                " return u.length && u[u.length - 1].textContent === q; }",
                arg=last_question,
                timeout=60_000,
            )
            return time.monotonic() - t0
        finally:
            browser.close()


def run(quick: bool) -> dict[str, Any]:
    """See the module docstring."""
    import redis

    from loki_shared import servers
    from tests.fakes.fake_engine import FakeEngine

    turns = 150 if quick else 1000
    fake = FakeEngine(n_ctx=32768).start()
    fake.responder = _responder_factory(fake)
    env = {
        "LOKI_ENGINE_URL": fake.url,
        "LOKI_SECRET_KEY": SECRET,
        "LOKI_LOCK_TTL_S": f"{LOCK_TTL_S:g}",
        "LOKI_INSTANCE_ID": "chat-a",
    }
    wall: list[float] = []
    written: list[int] = []
    baseline: dict[int, float] = {}  # turn -> the short conversation's turn right after it
    takeovers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loki-bench-long-") as home:
        # a Redis of the bench's own (no ACL users), so INFO and MEMORY USAGE can be read
        own_redis = servers.start_redis(Path(home) / "redis")
        with _common.stack(Path(home), env, redis_url=own_redis.url) as stack:
            base = f"http://127.0.0.1:{stack.config.web_port}"
            admin = redis.Redis.from_url(own_redis.url)
            standby_env = {**stack.service_env("chat"), "LOKI_INSTANCE_ID": "chat-b"}
            standby = servers.ManagedProcess(
                "chat-b", [sys.executable, "-m", "loki_chat"], env=standby_env, own_session=True
            ).start()
            procs = {"chat-a": ("stack", None), "chat-b": ("proc", standby)}
            http = httpx.Client(base_url=base, timeout=60)
            cid: str | None = None
            last = 0

            def net_in() -> int:
                return int(admin.info("stats")["total_net_input_bytes"])

            def takeover(at_turn: int) -> None:
                nonlocal last
                owner = (admin.get(f"loki:chat:lock:{cid}") or b"?|").decode().split("|")[0]
                kind, proc = procs[owner]
                if kind == "stack":
                    stack.stop_service("chat", kill=True)
                else:
                    proc.kill()
                while admin.exists(f"loki:chat:lock:{cid}"):
                    time.sleep(0.02)
                free = time.monotonic()
                http.post("/api/chat/send", json={"conversation": cid, "content": "after the kill"})
                first = _first_event_after(base, cid, last)
                last, _ = _read_until_end(base, cid, last)
                takeovers.append({"turn": at_turn, "owner_killed": owner, "seconds": first - free})
                # the killed instance comes back as the standby of the next takeover
                if kind == "stack":
                    stack.start_service("chat")
                else:
                    procs[owner] = (
                        "proc",
                        servers.ManagedProcess(
                            owner,
                            [sys.executable, "-m", "loki_chat"],
                            env={**standby_env, "LOKI_INSTANCE_ID": owner},
                            own_session=True,
                        ).start(),
                    )

            try:
                before = net_in()
                probe: dict[str, Any] = {"cid": None, "last": 0}

                def probe_turn(n: int) -> float:
                    """A turn of a short conversation beside the long one: the machine's
                    speed at that moment (the baseline of the same run)."""
                    t0 = time.monotonic()
                    r = http.post(
                        "/api/chat/send",
                        json={"conversation": probe["cid"], "content": f"probe {n}"},
                    )
                    r.raise_for_status()
                    probe["cid"] = r.json()["conversation"]
                    probe["last"], t_end = _read_until_end(base, probe["cid"], probe["last"])
                    return t_end - t0

                for n in range(turns):
                    t0 = time.monotonic()
                    r = http.post(
                        "/api/chat/send", json={"conversation": cid, "content": f"question {n}"}
                    )
                    r.raise_for_status()
                    cid = r.json()["conversation"]
                    last, t_end = _read_until_end(base, cid, last)
                    wall.append(t_end - t0)
                    now = net_in()
                    written.append(now - before)
                    if 9 <= n < 20 or turns - 11 <= n < turns - 1:
                        baseline[n] = probe_turn(n)
                    before = net_in()
                    if n + 1 == 20:
                        takeover(20)
                        before = net_in()
                takeover(turns)
                full_open = _open_time(base, cid, last, None)
                page_open = _open_time(base, cid, last, 20)
                paint = _paint_time(base, cid, "after the kill")
                keys = [f"loki:chat:{k}:{cid}" for k in ("conv", "msgs", "log")]
                memory = {k: admin.memory_usage(k) or 0 for k in keys}
            finally:
                http.close()
                for kind, proc in procs.values():
                    if kind == "proc" and proc is not None:
                        proc.stop(grace=10)
                admin.close()
        own_redis.stop()
    fake.stop()
    early = slice(9, 20)
    late = slice(turns - 11, turns - 1)
    raw_wall_ratio = statistics.median(wall[late]) / statistics.median(wall[early])

    def against_baseline(part: slice) -> float:
        """The long conversation's turns ÷ the short one's at the same moments (median)."""
        return statistics.median(wall[n] / baseline[n] for n in range(turns)[part])

    wall_ratio = against_baseline(late) / against_baseline(early)
    bytes_ratio = statistics.median(written[late]) / statistics.median(written[early])
    worst_takeover = max(t["seconds"] for t in takeovers)
    rows = [
        [
            f"{part.start + 1}–{part.stop}",
            round(statistics.median(wall[part]) * 1000),
            round(statistics.median(baseline[n] for n in range(turns)[part]) * 1000),
            round(against_baseline(part), 3),
            statistics.median(written[part]),
        ]
        for part in (early, late)
    ]
    return _common.result(
        f"A conversation of {turns} turns",
        tables=[
            _common.table(
                "Turn cost early and late (medians)",
                ["turns", "wall ms", "short conversation's turn ms", "÷ short", "bytes to Redis"],
                rows,
                notes=f"{DELTAS}-delta replies on the scripted engine, whole stack; compactions and takeovers included in the series.",
            ),
            _common.table(
                "Open and take over",
                ["what", "seconds"],
                [
                    ["browser: conversation opened, last message drawn", round(paint, 3)],
                    ["first page (last 20 turns) read", round(page_open, 3)],
                    ["whole log replayed", round(full_open, 3)],
                    *[
                        [
                            f"takeover at turn {t['turn']} (lock free → first event)",
                            round(t["seconds"], 3),
                        ]
                        for t in takeovers
                    ],
                ],
            ),
            _common.table(
                "Redis memory of the conversation",
                ["key", "bytes"],
                [[k.split(":")[2], v] for k, v in memory.items()]
                + [["total", sum(memory.values())]],
            ),
        ],
        targets=[
            _common.target(
                "turn wall time ÷ a short conversation's, last ten / turns 10–20",
                round(wall_ratio, 3),
                "<=",
                1.2,
                issue="37",
            ),
            _common.target(
                "bytes to Redis per turn, last ten / turns 10–20",
                round(bytes_ratio, 3),
                "<=",
                1.5,
                issue="37",
            ),
            _common.target(
                "conversation opened in the browser, first page painted",
                round(paint, 3),
                "<=",
                1.0,
                "s",
                issue="37",
            ),
            _common.target(
                "takeover after SIGKILL (worst)",
                round(worst_takeover, 3),
                "<=",
                2.0,
                "s",
                issue="37",
            ),
        ],
        data={
            "wall_s": wall,
            "bytes": written,
            "baseline_s": baseline,
            "raw_wall_ratio": round(raw_wall_ratio, 3),
            "takeovers": takeovers,
            "memory": memory,
        },
        notes="The browser time runs from opening the conversation's address in a tab whose "
        "scripts are cached to its last message drawn (the web UI asks the last 30 turns); the "
        "page time is the server side alone (the last 20 turns read from the stream).",
    )


def main() -> None:
    """Run by hand: ``python -m bench.long_conversation_bench [--quick]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    doc = run(parser.parse_args().quick)
    print(json.dumps(doc["tables"], indent=1))
    print(json.dumps(doc["targets"], indent=1))


if __name__ == "__main__":
    main()
