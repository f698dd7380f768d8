"""What an open web UI tab costs the engine (issue 17, item 2).

The whole stack with the bundled model (``temperature 0``, a fixed ``max_tokens``) answers the
same message in a new conversation each time, in rounds that interleave three conditions:
no tab open, one headless Debian chromium tab showing the conversation while it streams, and
two such tabs. The figure is the engine's own decode speed, ``timings.predicted_per_second``
of the end-of-turn event (read from the conversation's log after the turn, so no other client
watches the stream), and the ratio one tab / none is the median of per-round ratios (target
≥ 0.95: an open tab costs the engine under 5 %). The page's own render counters
(``LokiLive.stats``: renders, milliseconds spent, characters parsed) go alongside.

Usage: ``python bench/ui_render_bench.py [--quick]`` (writes ``bench/results/ui_render.json``),
or through the harness (``python -m bench --only ui_render``), which calls :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

import httpx

from bench import _common

TIMEOUT_S = {"quick": 900, "full": 2400}
PROMPT = (
    "Write a long, detailed essay in Markdown about the history of sailing ships, with "
    "headings, short paragraphs, bullet lists and one small table."
)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CONDITIONS = ("no tab", "one tab", "two tabs")


def _turn_end(client: httpx.Client, cid: str, timeout: float = 300.0) -> dict[str, Any]:
    """Waits for the conversation's turn to end; returns its end-of-turn event (from the log)."""
    deadline = time.monotonic() + timeout
    time.sleep(0.5)
    while time.monotonic() < deadline:
        st = client.get("/api/chat/state", params={"conversation": cid}).json()
        if not st.get("generating") and not st.get("queued"):
            break
        time.sleep(0.5)
    else:
        raise _common.BenchError(f"turn of {cid} still running after {timeout} s")
    with client.stream(
        "GET", "/api/chat", params={"conversation": cid}, headers={"Accept": "text/event-stream"}
    ) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            choice = (event.get("choices") or [{}])[0]
            if choice.get("finish_reason"):
                return event
    raise _common.BenchError(f"no end of turn in the log of {cid}")


def _one_reply(client: httpx.Client, browser: Any, base: str, tabs: int) -> dict[str, Any]:
    cid = client.post("/api/conversations", json={}).json()["conversation"]["id"]
    pages = []
    try:
        for _ in range(tabs):
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{base}/#c={cid}")
            page.wait_for_function(f"window.lokiDebug && window.lokiDebug.conversation === {cid!r}")
            pages.append(page)
        before = [p.evaluate("({...LokiLive.stats})") for p in pages]
        client.post("/api/chat/send", json={"conversation": cid, "content": PROMPT})
        end = _turn_end(client, cid)
        for page in pages:  # every tab has drawn the end of the reply
            page.wait_for_selector(".badge", timeout=30000)
        after = [p.evaluate("({...LokiLive.stats})") for p in pages]
    finally:
        for page in pages:
            page.close()
        client.delete(f"/api/conversations/{cid}")
    timings = end.get("timings") or {}
    page_stats = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    return {
        "tokens_per_s": timings.get("predicted_per_second"),
        "predicted_n": timings.get("predicted_n"),
        "finish_reason": end["choices"][0].get("finish_reason"),
        "page": page_stats,
    }


def run(quick: bool) -> dict[str, Any]:
    """Measure the engine's decode speed with 0, 1 and 2 tabs open; see the module docstring."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise _common.BenchError("Debian chromium missing: scripts/install.sh --test")
    rounds = 3 if quick else 8
    max_tokens = 200 if quick else 600
    env = {
        "LOKI_CTX": "4096",
        "LOKI_MAX_TOKENS": str(max_tokens),
        "LOKI_TEMPERATURE": "0",
        "LOKI_ENGINE_THREADS": "2",
    }
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    with (
        tempfile.TemporaryDirectory(prefix="loki-bench-ui-") as home,
        _common.stack(Path(home), env) as stack,
        sync_playwright() as pw,
    ):
        base = f"http://127.0.0.1:{stack.config.web_port}"
        engine_url = (stack.engine_info() or {}).get("base_url")
        engine = _common.engine_build(engine_url) if engine_url else None
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                _one_reply(client, browser, base, 1)  # warm-up: page, engine and caches
                for _ in range(rounds):
                    for tabs, condition in enumerate(CONDITIONS):
                        runs[condition].append(_one_reply(client, browser, base, tabs))
        finally:
            browser.close()

    speed = {c: [r["tokens_per_s"] for r in runs[c]] for c in CONDITIONS}
    one = _common.paired_ratios(speed["one tab"], speed["no tab"])
    two = _common.paired_ratios(speed["two tabs"], speed["no tab"])
    rows = []
    for condition in CONDITIONS:
        s = _common.spread(speed[condition])
        pages = [p for r in runs[condition] for p in r["page"]]
        renders = sum(p["renders"] for p in pages) / len(pages) if pages else 0
        render_ms = sum(p["ms"] for p in pages) / len(pages) if pages else 0
        tokens = _common.spread([r["predicted_n"] or 0 for r in runs[condition]])["median"]
        rows.append(
            [
                condition,
                round(s["median"], 1),
                f"{s['min']:.1f}–{s['max']:.1f}",
                tokens,
                round(renders, 1) if pages else "—",
                round(render_ms, 1) if pages else "—",
            ]
        )
    ratio_one = one["ratio"]["median"]
    return _common.result(
        "Engine speed with the web UI open",
        tables=[
            _common.table(
                "Decode speed of the same reply (tok/s, engine timings)",
                ["condition", "median tok/s", "range", "tokens", "renders/tab", "render ms/tab"],
                rows,
                notes=f"{rounds} rounds, conditions interleaved in each; one tab / none "
                f"{ratio_one:.3f} (median of per-round ratios), two tabs / none "
                f"{two['ratio']['median']:.3f}.",
            )
        ],
        targets=[
            _common.target(
                "decode speed, one tab open / none", round(ratio_one, 3), ">=", 0.95, issue="17"
            )
        ],
        data={"runs": runs, "one_tab": one, "two_tabs": two, "max_tokens": max_tokens},
        notes="Whole stack, bundled model, temperature 0; a new conversation per reply; "
        "tok/s is llama-server's predicted_per_second of the turn.",
        engine=engine,
    )


def main() -> None:
    """Run by hand: ``python bench/ui_render_bench.py [--quick]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    doc = run(args.quick)
    print(json.dumps(doc["tables"], indent=1))
    print(json.dumps(doc["targets"], indent=1))


if __name__ == "__main__":
    main()
