"""Measuring the engine from the presets dialog, in headless Debian chromium at 390×844 (a
phone) and 1280×800 (issue 46): the Benchmark button's progress while the job runs, the chart
of the new run beside the earlier one, a refusal's reason (external preset) shown as the
server's message, and the optimiser (opt-in: asked first) with its table and a proposal that
is applied to the preset only when the person clicks "Apply to the preset".

The fake supervisor's ``loki.engine.bench`` / ``loki.engine.optimise`` handlers are added here
to the gateway tests' fake peers: each status call moves a running job one step on.
"""

from __future__ import annotations

import pytest

from loki_shared import subjects
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.engine import (
    BenchJob,
    BenchPoint,
    BenchReply,
    BenchRequest,
    BenchRun,
    OptimiseCandidate,
    OptimiseReply,
    OptimiseRequest,
    OptimiseResult,
)
from tests.fakes.fake_supervisor import responder

from .conftest import ARTIFACTS


def _run(run_id: str, scale: float) -> BenchRun:
    points = []
    for depth in (0, 512):
        for test, base in (("pp", 400.0), ("tg", 40.0)):
            med = base * scale / (1 + depth / 1024)
            points.append(
                BenchPoint(
                    test=test, depth=depth, n=64, tps=[med * 0.9, med, med * 1.1],
                    median=med, low=med * 0.9, high=med * 1.1,
                )
            )  # fmt: skip
    return BenchRun(run_id=run_id, preset_id="env", model="m", build="b1-x", points=points, reps=3)


class FakeMeasure:
    """The supervisor's side of measuring, scripted: 4 steps per job."""

    def __init__(self) -> None:
        self.runs = [_run("old", 1.0)]
        self.job = BenchJob(kind="bench")
        self.search = OptimiseJob()
        self.refusal: str | None = None
        self.steps_seen: list[int] = []

    def bench(self, req: BenchRequest) -> BenchReply:
        if req.action == "start":
            if self.refusal:
                return BenchReply(error=ErrorInfo(type="conflict", message=self.refusal))
            self.job = BenchJob(job_id="j1", kind="bench", state="running", total=4)
        elif req.action == "status" and self.job.state == "running":
            self.job.done += 1
            self.job.step = f"pp 64 @ depth 0 ({self.job.done})"
            self.steps_seen.append(self.job.done)
            if self.job.done >= self.job.total:
                self.job.state = "done"
                self.job.run = _run("new", 1.3)
                self.runs.append(self.job.run)
        return BenchReply(job=self.job, runs=self.runs)

    def optimise(self, req: OptimiseRequest) -> OptimiseReply:
        return self.search.handle(req)


class OptimiseJob:
    def __init__(self) -> None:
        self.job = BenchJob(kind="optimise")
        self.result: OptimiseResult | None = None

    def handle(self, req: OptimiseRequest) -> OptimiseReply:
        if req.action == "start":
            self.job = BenchJob(job_id="s1", kind="optimise", state="running", total=3)
        elif req.action == "status" and self.job.state == "running":
            self.job.done += 1
            if self.job.done >= self.job.total:
                self.job.state = "done"
                table = [
                    OptimiseCandidate(settings={}, verdict="measured", pp=400, tg=40, score=1),
                    OptimiseCandidate(
                        settings={"ubatch": 256}, verdict="measured", pp=480, tg=41, score=1.11
                    ),
                    OptimiseCandidate(
                        settings={"ubatch": 4096}, verdict="refused", reason="above 90%"
                    ),
                ]
                self.result = OptimiseResult(
                    search_id="s1", preset_id="env", table=table, best=1, diff={"ubatch": 256}
                )
        return OptimiseReply(job=self.job, result=self.result)


@pytest.fixture(scope="module")
def measure(peers):
    fake = FakeMeasure()

    async def subscribe() -> None:
        await peers.nc.subscribe(subjects.ENGINE_BENCH, cb=responder(BenchRequest, fake.bench))
        await peers.nc.subscribe(
            subjects.ENGINE_OPTIMISE, cb=responder(OptimiseRequest, fake.optimise)
        )
        await peers.nc.flush()

    peers.call(subscribe())
    return fake


def _open_presets(page) -> None:
    if page.is_visible("#menu-btn"):
        page.click("#menu-btn")
    page.click("#presets-btn")
    page.wait_for_selector("#engine-measure")


def _fits(page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"page is {scroll} px wide in a {width} px window"
    box = page.locator("#engine-measure").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, box
    over = page.eval_on_selector("#presets-dialog", "d => d.scrollWidth - d.clientWidth")
    assert over <= 0, f"the dialog scrolls sideways by {over} px"


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 800)])
def test_benchmark_progress_chart_refusal_and_optimiser(
    browser, gateway, peers, measure, width, height
):
    measure.runs = [_run("old", 1.0)]
    measure.job = BenchJob(kind="bench")
    measure.search = OptimiseJob()
    measure.refusal = None
    measure.steps_seen.clear()
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a browser pop-up fails the test: Loki asks in its own dialog
    page.on("dialog", lambda d: (errors.append(f"browser {d.type}"), d.dismiss()))
    try:
        page.goto(gateway.url + "/")
        _open_presets(page)
        # the earlier run is charted when the dialog opens
        page.wait_for_selector("#bench-chart svg")
        assert page.locator("#bench-chart .bench-bar").count() == 4  # 2 depths × pp, tg

        page.click("#bench-start")
        page.wait_for_selector("#bench-progress:not([hidden])")
        assert page.is_visible("#measure-cancel") and page.is_disabled("#bench-start")
        page.wait_for_function(
            "document.getElementById('bench-status').textContent.includes('Benchmark: ')"
        )
        page.wait_for_function(
            "document.getElementById('bench-status').textContent === 'Benchmark done'"
        )
        assert measure.steps_seen == [1, 2, 3, 4]  # progress shown step by step
        assert page.is_hidden("#bench-progress") and page.is_enabled("#bench-start")
        # the new run beside the earlier one: 2 runs × 2 depths per chart, the newest marked
        assert page.locator("#bench-chart svg").count() == 2
        assert page.locator("#bench-chart .bench-bar").count() == 8
        assert page.locator("#bench-chart .bench-bar.latest").count() == 4
        caption = page.inner_text("#bench-chart figcaption >> nth=0")
        assert caption.startswith("pp tok/s · latest: d0 520 (±52.0)"), caption
        _fits(page, width)
        page.screenshot(path=str(ARTIFACTS / f"ui-bench-{width}.png"))

        # refused (an external preset): the server's reason, as an error
        measure.refusal = "the preset in service is external (an API elsewhere)"
        page.click("#bench-start")
        page.wait_for_function(
            "document.getElementById('bench-status').textContent.includes('external')"
        )
        assert "error" in page.get_attribute("#bench-status", "class")

        # the optimiser: table, proposal, applied only on the person's click
        page.click("#optimise-start")
        page.wait_for_selector("#ask-dialog[open]")
        assert "Optimise" in page.inner_text("#ask-title")
        page.click("#ask-ok")
        page.wait_for_selector("#optimise-apply")
        rows = page.locator(".optimise-table tr")
        assert rows.count() == 4
        assert "refused: above 90%" in rows.nth(3).inner_text()
        assert "best" in (rows.nth(2).get_attribute("class") or "")
        assert page.inner_text("#optimise-diff") == 'Proposed: {"ubatch":256}'
        assert peers.presets["env"].ubatch is None  # nothing applied by itself
        _fits(page, width)
        page.screenshot(path=str(ARTIFACTS / f"ui-optimise-{width}.png"))
        page.click("#optimise-apply")
        page.wait_for_function(
            "document.getElementById('bench-status').textContent.startsWith('Applied')"
        )
        assert peers.presets["env"].ubatch == 256
        assert errors == []
    finally:
        peers.presets["env"].ubatch = None
        page.close()


def test_measure_routes_answer_openai_shaped_errors(gateway, peers, measure):
    """Bad fields are a 400 naming them; a refusal is the supervisor's 409 with its reason;
    nothing is started by either."""
    measure.job = BenchJob(kind="bench")
    measure.refusal = None
    with gateway.client() as http:
        bad = http.post("/api/engine/bench", json={"depth": [0]})
        assert bad.status_code == 400
        err = bad.json()["error"]
        assert "depth" in err["message"] and err["code"] == "unknown_field"
        assert http.post("/api/engine/bench", json={"reps": "many"}).status_code == 400
        assert measure.job.state == "idle"  # nothing started
        measure.refusal = "the preset in service is external (an API elsewhere)"
        refused = http.post("/api/engine/bench", json={"reps": 2})
        assert refused.status_code == 409
        assert refused.json()["error"]["message"] == measure.refusal
        assert refused.json()["error"]["code"] == "conflict"
        assert http.post("/api/engine/optimise", json={"candidates": "x"}).status_code == 400
    measure.refusal = None
