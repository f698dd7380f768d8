"""``/api/projects…`` end to end: the whole stack (gateway, chat, memory, recall, supervisor,
perf; ``loki_cli.stack``) on the scripted fake engine, behind an API key. A person creates a
project, switches to it, writes a page and logs tracker values through the API; the next
conversation belongs to the project and the model's first request carries the page's index
line and the latest tracker value; export → import round-trips the project; deleting it
takes its conversations. Error bodies are OpenAI-shaped; without a memory service the routes
answer 503 (a gateway on its own NATS with fake peers only)."""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.fake_engine import FakeEngine, text_reply

from .a11y import assert_accessible, assert_targets
from .conftest import whole_stack

KEY = "projects-test-key"
SECRET = "projects-test-secret-0123456789"


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as fake:
        yield fake


@pytest.fixture(scope="module")
def api(tmp_path_factory, engine: FakeEngine) -> Iterator[httpx.Client]:
    home = tmp_path_factory.mktemp("projects") / "home"
    with whole_stack(home, engine.url, KEY, SECRET) as client:
        yield client


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    return err


def wait_idle(api: httpx.Client, cid: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        state = api.get("/api/chat/state", params={"conversation": cid}).json()
        if not state.get("generating") and len(state["messages"]) >= 3:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


def test_the_key_guards_the_project_routes(api: httpx.Client) -> None:
    for path in ("/api/projects", "/api/projects/default/pages", "/api/projects/default/trackers"):
        r = httpx.get(str(api.base_url.join(path)), timeout=10)
        assert error_of(r, 401)["type"] == "invalid_request_error"


def test_create_switch_and_conversations_by_project(api: httpx.Client) -> None:
    listed = api.get("/api/projects").json()
    assert listed["active"] == "default"
    assert "default" in [p["id"] for p in listed["projects"]]
    r = api.post("/api/projects", json={"name": "Garden", "description": "Vegetables."})
    assert r.status_code == 201, r.text
    assert r.json()["project"]["id"] == "garden"
    assert error_of(api.post("/api/projects", json={"name": "X", "id": "garden"}), 409)
    assert error_of(api.post("/api/projects", json={"name": ""}), 400)["param"] == "name"
    r = api.patch("/api/projects/garden", json={"description": "Vegetables and herbs."})
    assert r.json()["project"]["description"] == "Vegetables and herbs."
    assert api.get("/api/projects/garden").json()["project"]["name"] == "Garden"
    assert error_of(api.get("/api/projects/nope"), 404)["type"] == "not_found_error"
    assert error_of(api.put("/api/projects/active", json={"project": "nope"}), 404)
    assert api.put("/api/projects/active", json={"project": "garden"}).status_code == 200
    assert api.get("/api/projects/active").json()["project"]["id"] == "garden"
    made = api.post("/api/conversations", json={"title": "Beds"}).json()["conversation"]
    assert made["project"] == "garden"  # the active project
    other = api.post("/api/conversations", json={"project": "default"}).json()["conversation"]
    assert other["project"] == "default"
    in_garden = api.get("/api/conversations", params={"project": "garden"}).json()
    assert [c["id"] for c in in_garden["conversations"]] == [made["id"]]
    by_route = api.get("/api/projects/garden/conversations").json()["conversations"]
    assert [c["id"] for c in by_route] == [made["id"]]
    everything = [c["id"] for c in api.get("/api/conversations").json()["conversations"]]
    assert {made["id"], other["id"]} <= set(everything)
    assert api.put("/api/projects/active", json={"project": "default"}).status_code == 200


def test_a_page_and_tracker_values_reach_the_next_conversation_block(
    api: httpx.Client, engine: FakeEngine
) -> None:
    assert api.post("/api/projects", json={"name": "Health"}).status_code == 201
    page = {"content": "# Diet\nNo sugar after 18:00.", "description": "what I eat"}
    r = api.put("/api/projects/health/pages/diet", json=page)
    assert r.status_code == 201 and r.json()["created"] and r.json()["page"]["file"] == "diet.md"
    assert api.put("/api/projects/health/pages/diet.md", json=page).status_code == 200
    listed = api.get("/api/projects/health/pages").json()
    assert listed["index"] == "- [Diet](diet.md) — what I eat\n"
    assert api.get("/api/projects/health/pages/diet.md").json()["content"] == page["content"]
    hits = api.get("/api/projects/health/search", params={"q": "sugar"}).json()["hits"]
    assert [h["file"] for h in hits] == ["diet.md"]
    for date, value in (("2026-11-28", 82.0), ("2026-11-29", 81.6), ("2026-11-30", 81.2)):
        body = {"value": value, "unit": "kg", "date": date}
        r = api.post("/api/projects/health/trackers/weight/values", json=body)
        assert r.status_code == 201, r.text
    bad = api.post(
        "/api/projects/health/trackers/weight/values", json={"value": 1, "date": "30/11"}
    )
    assert "date" in error_of(bad, 400)["message"].lower()
    trackers = api.get("/api/projects/health/trackers").json()["trackers"]
    assert [(t["slug"], t["count"], t["latest"]["value"]) for t in trackers] == [
        ("weight", 3, 81.2)
    ]
    events = api.get(
        "/api/projects/health/trackers/weight", params={"level": "events", "period": "2026-11"}
    ).json()
    assert [e["value"] for e in events["events"]] == [82.0, 81.6, 81.2]
    overview = api.get("/api/projects/health/trackers/weight").json()
    assert [(p["period"], p["count"]) for p in overview["periods"]] == [("2026", 3)]
    assert error_of(api.get("/api/projects/health/trackers/weight?level=daily"), 400)

    api.put("/api/projects/active", json={"project": "health"})
    try:
        engine.push(text_reply("You weigh 81.2 kg."))
        before = len(engine.requests)
        r = api.post("/api/chat/send", json={"content": "What is my last weight?"})
        cid = r.json()["conversation"]
        wait_idle(api, cid)
        first_user = engine.requests[before].json["messages"][1]["content"]
        assert "- [Diet](diet.md) — what I eat" in first_user
        assert "weight: 81.2 kg (2026-11-30)" in first_user
        assert first_user.endswith("What is my last weight?")
        block = api.get("/api/projects/health/block").json()
        assert block["index"] == ["- [Diet](diet.md) — what I eat"]
    finally:
        api.put("/api/projects/active", json={"project": "default"})


def test_names_in_any_script_through_the_gateway(api: httpx.Client) -> None:
    """Issue 38 §4: a project named in Cyrillic, a page named in Japanese and a tracker named
    in Devanagari are made and read back through ``/api`` with their names as written."""
    r = api.post("/api/projects", json={"name": "Здоровье"})
    assert r.status_code == 201, r.text
    project = r.json()["project"]
    assert project["name"] == "Здоровье"
    pid = project["id"]
    assert api.get(f"/api/projects/{pid}").json()["project"]["name"] == "Здоровье"
    page = {"content": "# 日記\n今日は晴れ。", "description": "毎日のこと"}
    r = api.put(f"/api/projects/{pid}/pages/日記", json=page)
    assert r.status_code == 201, r.text
    assert r.json()["page"]["file"] == "日記.md"
    assert api.get(f"/api/projects/{pid}/pages/日記.md").json()["content"] == page["content"]
    assert (
        api.get(f"/api/projects/{pid}/pages").json()["index"] == "- [日記](日記.md) — 毎日のこと\n"
    )
    r = api.post(f"/api/projects/{pid}/trackers/नींद/values", json={"value": 7.5, "unit": "घंटे"})
    assert r.status_code == 201, r.text
    trackers = api.get(f"/api/projects/{pid}/trackers").json()["trackers"]
    assert [(t["name"], t["slug"]) for t in trackers] == [("नींद", "नींद")]
    assert error_of(api.put(f"/api/projects/{pid}/pages/MEMORY", json=page), 400)
    assert error_of(api.post("/api/projects", json={"name": "🙂"}), 400)


def test_export_import_round_trips_a_project(api: httpx.Client) -> None:
    api.post("/api/projects", json={"name": "Trip", "instructions": "Be brief."})
    api.put("/api/projects/trip/pages/plan", json={"content": "# Plan\nOslo.", "description": "d"})
    api.post("/api/projects/trip/trackers/budget/values", json={"value": 120, "unit": "EUR"})
    r = api.get("/api/projects/trip/export")
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert "attachment" in r.headers["content-disposition"]
    names = set(zipfile.ZipFile(io.BytesIO(r.content)).namelist())
    assert {"pages/plan.md", "trackers/budget.csv"} <= names
    made = api.post("/api/projects/import", params={"name": "Trip copy"}, content=r.content)
    assert made.status_code == 201, made.text
    copy = made.json()["project"]
    assert (copy["name"], copy["instructions"]) == ("Trip copy", "Be brief.")
    pages = api.get(f"/api/projects/{copy['id']}/pages").json()
    assert pages["index"] == api.get("/api/projects/trip/pages").json()["index"]
    read = api.get(f"/api/projects/{copy['id']}/pages/plan.md").json()
    assert read["content"] == "# Plan\nOslo."
    trackers = api.get(f"/api/projects/{copy['id']}/trackers").json()["trackers"]
    assert [(t["slug"], t["unit"], t["latest"]["value"]) for t in trackers] == [
        ("budget", "EUR", 120.0)
    ]
    assert error_of(api.post("/api/projects/import", content=b"not a zip"), 400)
    assert error_of(api.post("/api/projects/import", content=b""), 400)["code"] == "empty_body"


def test_delete_takes_the_pages_trackers_and_conversations(api: httpx.Client) -> None:
    api.post("/api/projects", json={"name": "Scratch"})
    api.put("/api/projects/scratch/pages/a", json={"content": "a"})
    conv = api.post("/api/conversations", json={"project": "scratch"}).json()["conversation"]
    api.put("/api/projects/active", json={"project": "scratch"})
    assert error_of(api.delete("/api/projects/scratch", params={"confirm": "nope"}), 409)
    assert error_of(api.delete("/api/projects/default", params={"confirm": "default"}), 409)
    r = api.delete("/api/projects/scratch", params={"confirm": "scratch"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "deleted": "scratch",
        "pages": 1,
        "trackers": 0,
        "conversations": [conv["id"]],
    }
    assert error_of(api.get("/api/projects/scratch/pages"), 404)
    everything = [c["id"] for c in api.get("/api/conversations").json()["conversations"]]
    assert conv["id"] not in everything
    assert api.get("/api/projects/active").json()["project"]["id"] == "default"


def test_without_a_memory_service_the_routes_answer_503(gateway_factory, peers) -> None:
    gw = gateway_factory()
    with gw.client() as c:
        for path in ("/api/projects", "/api/projects/default/pages"):
            assert error_of(c.get(path), 503)["type"] == "service_unavailable"


def test_page_and_tracker_names_are_checked_at_the_door(api: httpx.Client) -> None:
    assert error_of(api.get("/api/projects/bad%20id/pages"), 400)
    long = "x" * 121
    assert error_of(api.get(f"/api/projects/default/pages/{long}"), 400)


PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
#: the phone's drawer has finished sliding in
DRAWER_OPEN = "document.getElementById('sidebar').getBoundingClientRect().left >= 0"


# Pixels between the right end of the chart's last date label (centred on its tick, in the
# axis font) and the right edge of the chart: negative when the label is clipped.
LAST_LABEL_ROOM = """() => {
  const u = LokiProjects.plot();
  const ticks = JSON.parse(document.getElementById('tracker-chart').dataset.ticks);
  const last = ticks[ticks.length - 1];
  const xs = u.data[0];
  const x = xs[xs.length - 1];
  u.ctx.font = u.axes[0].font[0];
  const w = u.ctx.measureText(last).width;
  return u.width - (u.valToPos(x, 'x') + u.bbox.left / devicePixelRatio + w / 2);
}"""


def _inside(page, selector: str, viewport: dict) -> dict:
    assert page.is_visible(selector), f"{selector} not visible"
    box = page.locator(selector).bounding_box()
    assert box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"] + 0.5, (selector, box)
    return box


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_the_ui_switches_project_edits_a_page_and_charts_a_tracker(
    api: httpx.Client, engine: FakeEngine, browser, viewport: dict
) -> None:
    # `api` first: the stack starts (asyncio.run inside) before Playwright's loop exists
    from .conftest import ARTIFACTS

    name = f"UI {viewport['width']}"
    slug = f"ui-{viewport['width']}"
    errors: list[str] = []
    page = browser.new_page(viewport=viewport, device_scale_factor=1)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a browser pop-up (alert, confirm, prompt) fails the test: Loki asks in its own dialog
    page.on("dialog", lambda d: (errors.append(f"browser {d.type}: {d.message}"), d.dismiss()))
    page.add_init_script(f"localStorage.setItem('lokiKey', {KEY!r})")
    phone = viewport["width"] < 760
    try:
        page.goto(str(api.base_url) + "/")
        if phone:
            page.click("#menu-btn")
            page.wait_for_function(DRAWER_OPEN)
        page.wait_for_selector("#project-row", state="visible")
        _inside(page, "#project-picker", viewport)
        page.select_option("#project-picker", "__new__")
        page.wait_for_selector("#ask-dialog[open]")  # the name asked in Loki's own dialog
        page.fill("#ask-input", name)
        page.click("#ask-ok")
        page.wait_for_function(f"document.getElementById('project-picker').value === {slug!r}")
        assert api.get("/api/projects/active").json()["project"]["id"] == slug
        page.wait_for_function("document.querySelectorAll('#conversations li').length === 0")
        if phone:  # switching opened a new chat: the drawer closed; open it again
            page.wait_for_function("!document.body.classList.contains('drawer-open')")
            page.wait_for_function(DRAWER_OPEN.replace(">= 0", "< 0"))
            page.click("#menu-btn")
            page.wait_for_function(DRAWER_OPEN)
        page.click("#project-btn")
        page.wait_for_selector("#project-dialog[open]")
        page.click("#page-new")
        page.fill("#page-form [name=page]", "Garden plan")
        page.fill("#page-form [name=description]", "beds and seeds")
        page.fill("#page-form [name=content]", "# Garden plan\n\n- **tomatoes** in bed 2")
        page.click("#page-preview-btn")
        assert page.inner_html("#page-preview").count("<strong>tomatoes</strong>") == 1
        page.click("#page-save")
        page.wait_for_selector("#page-list li[data-file='garden-plan.md']")
        page.wait_for_function(
            "document.getElementById('page-index').textContent.includes('garden-plan.md')"
        )
        assert page.text_content("#page-index").strip() == (
            "- [Garden plan](garden-plan.md) — beds and seeds"
        )
        page.click("#project-dialog .tabs [data-tab=trackers]")
        for date, value in (("2026-11-28", "7000"), ("2026-11-29", "8000"), ("2026-11-30", "9500")):
            page.fill("#tracker-form [name=tracker]", "steps")
            page.fill("#tracker-form [name=value]", value)
            page.fill("#tracker-form [name=unit]", "steps" if date == "2026-11-28" else "")
            page.fill("#tracker-form [name=date]", date)
            page.click("#tracker-form button[type=submit]")
            page.wait_for_function(
                "document.querySelector('#tracker-list li[data-slug=steps] .desc')"
                f"?.textContent.includes('{date}')"
            )
        page.wait_for_selector("#tracker-chart canvas")
        # the list updates before the chart is drawn again: wait for the third point
        page.wait_for_function("document.getElementById('tracker-chart').dataset.points === '3'")
        # the time axis of day-level values: dates, not hours
        ticks = json.loads(page.get_attribute("#tracker-chart", "data-ticks") or "[]")
        assert ticks == ["2026-11-28", "2026-11-29", "2026-11-30"], ticks
        # no "Time: – steps: --" legend, and the last date label drawn whole inside the chart
        assert page.locator("#tracker-chart .u-legend").count() == 0
        room = page.evaluate(LAST_LABEL_ROOM)
        assert room >= 0, f"the last date label overflows the chart by {-room:.0f} px"
        assert_accessible(page, "the trackers tab")
        if phone:
            assert_targets(page, 44, "the trackers tab")
        chart = _inside(page, "#tracker-chart canvas", viewport)
        assert chart["width"] >= 200
        dialog = _inside(page, "#project-dialog", viewport)
        assert dialog["y"] >= 0 and dialog["y"] + dialog["height"] <= viewport["height"] + 0.5
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(
            path=str(ARTIFACTS / f"projects-{viewport['width']}x{viewport['height']}.png")
        )
        page.select_option("#tracker-level", "year")
        page.wait_for_function(
            "document.getElementById('tracker-chart').dataset.ticks === '[\"2026-11\"]'"
        )
        page.select_option("#tracker-level", "overview")
        # the year level has one point too: wait for the overview's own tick
        page.wait_for_function(
            "document.getElementById('tracker-chart').dataset.ticks === '[\"2026\"]'"
        )
        assert page.get_attribute("#tracker-chart", "data-points") == "1"
        for tab in ("pages", "settings"):
            page.click(f"#project-dialog .tabs [data-tab={tab}]")
            assert_accessible(page, f"the {tab} tab")
            if phone:
                assert_targets(page, 44, f"the {tab} tab")
        page.click("#project-close")

        # what the UI wrote is in the project, and in the next conversation's first request
        trackers = api.get(f"/api/projects/{slug}/trackers").json()["trackers"]
        assert [(t["slug"], t["unit"], t["count"]) for t in trackers] == [("steps", "steps", 3)]
        if phone:
            page.keyboard.press("Escape")
        engine.push(text_reply("Noted."))
        before = len(engine.requests)
        if phone and page.is_visible("#scrim"):
            page.click("#scrim")
        page.fill("#input", "What is in bed 2?")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant")
        deadline = time.monotonic() + 20
        while len(engine.requests) <= before:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first_user = engine.requests[before].json["messages"][1]["content"]
        assert "- [Garden plan](garden-plan.md) — beds and seeds" in first_user
        assert "steps: 9500 steps (2026-11-30)" in first_user
        page.wait_for_function("document.querySelectorAll('#conversations li').length === 1")
        convs = api.get("/api/conversations", params={"project": slug}).json()["conversations"]
        assert len(convs) == 1

        # a page deleted after a question in Loki's own dialog
        if phone:
            page.click("#menu-btn")
            page.wait_for_function(DRAWER_OPEN)
        page.click("#project-btn")
        page.wait_for_selector("#project-dialog[open]")
        page.click("#page-list li[data-file='garden-plan.md']")
        page.wait_for_selector("#page-delete:not([hidden])")
        page.click("#page-delete")
        page.wait_for_selector("#ask-dialog[open]")
        page.click("#ask-ok")
        page.wait_for_selector("#page-list li[data-file='garden-plan.md']", state="detached")

        # importing the project's own export beside it: "<name> (imported)", never a second
        # project of one name
        exported = api.get(f"/api/projects/{slug}/export").content
        page.click("#project-dialog .tabs [data-tab=settings]")
        page.set_input_files(
            "#project-import",
            files=[{"name": "p.zip", "mimeType": "application/zip", "buffer": exported}],
        )
        page.wait_for_function(
            "document.getElementById('project-picker').selectedOptions[0]?.textContent"
            f" === {name + ' (imported)'!r}"
        )
        shown = page.eval_on_selector_all("#project-picker option", "os => os.map(o => o.text)")
        assert shown.count(name) == 1 and shown.count(f"{name} (imported)") == 1
        imported = api.get("/api/projects/active").json()["project"]["id"]
        # and deleted again: its id typed in Loki's own dialog
        if phone and not page.evaluate("document.body.classList.contains('drawer-open')"):
            page.click("#menu-btn")
            page.wait_for_function(DRAWER_OPEN)
        page.click("#project-btn")
        page.wait_for_selector("#project-dialog[open]")
        page.click("#project-dialog .tabs [data-tab=settings]")
        page.click("#project-delete")
        page.wait_for_selector("#ask-dialog[open]")
        assert_accessible(page, "the ask dialog over the project dialog")
        page.fill("#ask-input", imported)
        page.click("#ask-ok")
        page.wait_for_function(
            f"!Array.from(document.querySelectorAll('#project-picker option'))"
            f".some(o => o.value === {imported!r})"
        )
        assert errors == []
    finally:
        page.close()
        api.put("/api/projects/active", json={"project": "default"})
