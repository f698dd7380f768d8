"""Issue 44 at the gateway: ``GET /api/engine`` (and its SSE twin) passes the pool through
(``engines``, ``routing``, ``instance``, ``leader``) without any key or URL credentials; the
UI's engine details list the engines and their slots when there are several, and are as
before with one; a foreign ``/v1`` request's lease names the fingerprints of its messages
and its perf record the lease's placement."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from loki_shared.fingerprint import fingerprints
from loki_shared.messages.engine import EngineSummary, Placement, SlotSummary
from tests.fakes.fake_engine import FakeEngine, text_reply
from tests.fakes.gateway_peers import FakePeers

from .a11y import assert_accessible
from .conftest import ARTIFACTS

ENGINE_KEY = "engine-only-key-77"
DRAWER_OPEN = "document.getElementById('sidebar').getBoundingClientRect().left >= 0"


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as fake:
        yield fake


@pytest.fixture(scope="module")
def peers(gw_nats, engine) -> Iterator[FakePeers]:
    fake = FakePeers(gw_nats, engine.url, id_slot=1)
    fake.api_key = ENGINE_KEY
    fake.start()
    yield fake
    fake.stop()


def pool() -> list[EngineSummary]:
    return [
        EngineSummary(
            id="gpu-a",
            group="big",
            base_url="http://loki:s3cret-pass@127.0.0.1:9101",
            state="ready",
            model="/models/qwen-7b.gguf",
            n_ctx=4096,
            total_slots=2,
            in_flight=1,
            slots=[
                SlotSummary(id_slot=0, busy=True, conversation="c0ffee12-3456", prefix=7),
                SlotSummary(id_slot=1, saved=True, conversation="deadbeef-99", prefix=3),
            ],
            grants=12,
            moves_in=2,
            restores=1,
        ),
        EngineSummary(
            id="127.0.0.1:9102",
            base_url="http://127.0.0.1:9102/",
            state="starting",
            total_slots=1,
            slots=[SlotSummary(id_slot=0)],
        ),
    ]


@pytest.fixture
def pooled(peers) -> Iterator[FakePeers]:
    """The fake supervisor answering ``info`` with two engines, affine routing, replicated."""
    sup = peers.supervisor
    sup.engines, sup.routing, sup.instance, sup.leader = pool(), "affine", "sup-1", "sup-2"
    yield peers
    sup.engines, sup.routing, sup.instance, sup.leader = [], "", "", None


def test_api_engine_passes_the_pool_through_without_secrets(gateway, pooled):
    with gateway.client() as c:
        body = c.get("/api/engine").json()
        with c.stream("GET", "/api/engine/events") as r:
            data = next(line for line in r.iter_lines() if line.startswith("data:"))
    assert json.loads(data[len("data:") :]) == body  # the SSE frame is the same body
    assert (body["routing"], body["instance"], body["leader"]) == ("affine", "sup-1", "sup-2")
    a, b = body["engines"]
    assert (a["id"], a["group"], a["state"], a["grants"], a["moves_in"]) == (
        "gpu-a",
        "big",
        "ready",
        12,
        2,
    )
    assert [s["conversation"] for s in a["slots"]] == ["c0ffee12-3456", "deadbeef-99"]
    assert a["base_url"] == "http://127.0.0.1:9101"  # user information removed
    assert b["base_url"] == "http://127.0.0.1:9102/"
    text = json.dumps(body)
    assert "s3cret-pass" not in text and ENGINE_KEY not in text and "api_key" not in text


def test_api_engine_without_a_pool_is_as_before(gateway, peers):
    with gateway.client() as c:
        body = c.get("/api/engine").json()
    assert body["engines"] == [] and body["routing"] == "" and body["leader"] is None
    assert ENGINE_KEY not in json.dumps(body)


def test_a_foreign_request_names_its_fingerprints_and_its_record_the_placement(
    gateway, peers, engine
):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    peers.supervisor.placement = Placement(
        engine="gpu-a", id_slot=1, reason="overloaded", moved_from="gpu-b", transfer="recomputed"
    )
    before = len(peers.perf_records)
    try:
        engine.push(text_reply("ok"))
        with gateway.client() as c:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": messages, "stream": True},
                timeout=30,
            )
        assert r.status_code == 200, r.text
        assert peers.supervisor.requests[-1].prompt_fingerprints == fingerprints(messages)
        deadline = time.monotonic() + 10
        while len(peers.perf_records) == before:
            assert time.monotonic() < deadline, "no perf record"
            time.sleep(0.05)
        rec = peers.perf_records[-1]
        assert (rec.kind, rec.engine, rec.moved_from, rec.transfer) == (
            "foreign",
            "gpu-a",
            "gpu-b",
            "recomputed",
        )
    finally:
        peers.supervisor.placement = None
    # the body sent upstream is the client's, with no trace of the pool
    assert b"gpu-a" not in engine.requests[-1].body


@pytest.mark.parametrize("width", [1280, 390])
def test_the_engine_details_list_the_engines_and_their_slots(browser, gateway, pooled, width):
    page = browser.new_page(viewport={"width": width, "height": 844}, device_scale_factor=1)
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        if width < 760:
            page.click("#menu-btn")
            page.wait_for_function(DRAWER_OPEN)
        page.wait_for_selector(".engine-pool-engine", state="attached")
        page.click("#engine-state")
        details = page.inner_text("#engine-details")
        assert "Engines: 2 · routing affine · leader sup-2" in details
        first = page.inner_text(".engine-pool-engine[data-engine='gpu-a']")
        assert "gpu-a (big) · ready · qwen-7b.gguf · slots 1/2 busy" in first
        assert "12 grants, 2 moves in, 1 restores" in first
        slots = page.locator(".engine-pool-engine[data-engine='gpu-a'] .engine-pool-slot")
        assert slots.all_inner_texts() == [
            "slot 0: busy · c0ffee12 (7 messages)",
            "slot 1: free · deadbeef (3 messages) · saved",
        ]
        second = page.inner_text(".engine-pool-engine[data-engine='127.0.0.1:9102']")
        assert second.startswith("127.0.0.1:9102 · starting · slots 0/1 busy")
        assert "s3cret" not in page.content()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"engine-pool-{width}.png"))
        assert_accessible(page, "the engine details with a pool")
    finally:
        page.close()
    assert problems == []


def test_with_one_engine_the_details_have_no_pool(browser, gateway, peers):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(gateway.url + "/")
        page.wait_for_function("document.getElementById('engine-state').dataset.state === 'ready'")
        page.click("#engine-state")
        assert "Model: fake" in page.inner_text("#engine-details")
        assert page.locator(".engine-pool, .engine-pool-engine").count() == 0
    finally:
        page.close()
