"""The tool servers dialog (``static/mcp-settings.js``, issue 42) in headless Chromium at
1280×800 and 390×844, against the whole stack (``loki_cli.stack`` on the scripted fake
engine, behind an API key) and a real MCP server on Streamable HTTP on loopback
(``tests/fakes/mcp_server.py``, guarded by a bearer token).

The person adds the server in the UI with its token, sees its state ``up`` and the tools the
model sees, tests it, replaces its headers by none (state ``down``, the reason shown, the
last known tools kept) and types the token again, meets the API's refusal of a bad URL
inline, switches it off, turns it off for a project, and deletes it after Loki's own question; a server of
``LOKI_HOME/mcp.json`` is shown read-only but for On and the projects. The token is never in
the page nor in any API answer; axe-core finds no serious or critical violation; every
control is thumb-sized on the phone. Screenshots under ``tests/artifacts/``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.fake_engine import FakeEngine
from tests.fakes.mcp_server import SERVER

from .a11y import assert_accessible, assert_targets
from .conftest import whole_stack

KEY = "mcp-ui-test-key"
SECRET = "mcp-ui-test-secret-0123456789"
TOKEN = "tok-ui-secret-7f3a9c"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
DRAWER_OPEN = "document.getElementById('sidebar').getBoundingClientRect().left >= 0"
WAIT_MS = 90_000  # a server connected and listed on a loaded machine


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[httpx.Client]:
    home = tmp_path_factory.mktemp("mcp-ui") / "home"
    home.mkdir(parents=True)
    # a stdio server of the person's file: listed read-only (but for On and the projects)
    entry = {"command": sys.executable, "args": [str(SERVER), "stdio"]}
    (home / "mcp.json").write_text(json.dumps({"servers": {"local": entry}}))
    with FakeEngine() as engine, whole_stack(home, engine.url, KEY, SECRET, 120) as client:
        yield client


def _row(name: str) -> str:
    return f"#mcp-list li[data-name='{name}']"


def _open_dialog(page, phone: bool) -> None:
    if phone and not page.evaluate("document.body.classList.contains('drawer-open')"):
        page.click("#menu-btn")
        page.wait_for_function(DRAWER_OPEN)
    page.click("#mcp-btn")
    page.wait_for_selector("#mcp-dialog[open]")


def _until_state(page, name: str, state: str) -> None:
    """Refresh the list until the server's row says ``state``."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while page.get_attribute(_row(name), "data-state") != state:
        assert time.monotonic() < deadline, page.inner_text(_row(name))
        page.click("#mcp-refresh")
        page.wait_for_timeout(500)


def _check(page, where: str, phone: bool) -> None:
    assert_accessible(page, where)
    assert_targets(page, 44 if phone else 24, where)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"{where}: {width} px wide"
    box = page.locator("#mcp-dialog").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"] + 0.5


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_a_person_adds_tests_switches_and_deletes_an_mcp_server_in_the_ui(
    api: httpx.Client, browser, http_mcp, viewport: dict
) -> None:
    # `api` first: the stack starts (asyncio.run inside) before Playwright's loop exists
    from .conftest import ARTIFACTS

    width = viewport["width"]
    phone = width < 760
    name = f"remote-{width}"
    url, _ = http_mcp(env={"MCP_TOKEN": TOKEN})
    made = api.post("/api/projects", json={"name": f"Garden {width}"})
    assert made.status_code == 201, made.text
    project = made.json()["project"]["id"]
    errors: list[str] = []
    answers: list = []
    page = browser.new_page(viewport=viewport, device_scale_factor=1)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a browser pop-up (alert, confirm, prompt) fails the test: Loki asks in its own dialog
    page.on("dialog", lambda d: (errors.append(f"browser {d.type}: {d.message}"), d.dismiss()))
    page.on("response", lambda r: answers.append(r) if "/api/mcp/" in r.url else None)
    page.add_init_script(f"localStorage.setItem('lokiKey', {KEY!r})")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        page.goto(str(api.base_url) + "/")
        _open_dialog(page, phone)
        # the file's server: no Edit, no Delete, a hint naming the file
        page.wait_for_selector(_row("local"), timeout=WAIT_MS)
        local = page.locator(_row("local"))
        assert "stdio · from mcp.json" in local.inner_text()
        assert "LOKI_HOME/mcp.json" in local.locator(".mcp-file").inner_text()
        assert local.locator("button", has_text="Edit").count() == 0
        assert local.locator("button", has_text="Delete").count() == 0
        _check(page, "the tool servers dialog", phone)

        # add the HTTP server with its token (a password field)
        page.click("#mcp-new")
        page.wait_for_selector("#mcp-form:not([hidden])")
        assert page.get_attribute("#mcp-form [name=token]", "type") == "password"
        page.fill("#mcp-form [name=name]", name)
        page.fill("#mcp-form [name=url]", url)
        page.fill("#mcp-form [name=token]", TOKEN)
        page.click("#mcp-header-add")
        page.fill("#mcp-header-rows .mcp-header-name", "X-Client")
        page.fill("#mcp-header-rows .mcp-header-value", "loki-ui")
        assert page.get_attribute("#mcp-header-rows .mcp-header-value", "type") == "password"
        _check(page, "the add form", phone)
        page.screenshot(path=str(ARTIFACTS / f"mcp-form-{width}x{viewport['height']}.png"))
        page.click("#mcp-save")
        page.wait_for_selector(f"{_row(name)}[data-state='up']", timeout=WAIT_MS)
        assert page.is_hidden("#mcp-form")
        row = page.locator(_row(name))
        tools = row.locator(".mcp-tool-list li").all_inner_texts()
        seen = name.replace("-", "_")  # the names the model sees are sanitised
        assert f"{seen}__echo" in tools and f"{seen}__get_weather_now" in tools, tools
        assert "headers set: Authorization, X-Client" in row.inner_text()
        assert "http · added here" in row.inner_text() and url in row.inner_text()
        page.screenshot(path=str(ARTIFACTS / f"mcp-added-{width}x{viewport['height']}.png"))

        # test the connection: the result in the row
        row.locator("button", has_text="Test").click()
        page.wait_for_selector(f"{_row(name)} .mcp-test[data-ok='true']", timeout=WAIT_MS)
        assert "Connected in" in row.locator(".mcp-test").inner_text()
        assert "echo" in row.locator(".mcp-test").inner_text()

        # the headers replaced by none: the server refuses Loki, the row says why, and the
        # last known tools stay listed; then the token typed again: up
        row.locator("button", has_text="Edit").click()
        page.wait_for_selector("#mcp-form:not([hidden])")
        page.check("#mcp-form [name=replace]")
        page.click("#mcp-save")
        page.wait_for_selector("#mcp-form", state="hidden")
        assert "no header set" in row.inner_text()
        _until_state(page, name, "down")
        assert row.locator(".mcp-server-error").inner_text().strip()
        assert f"{seen}__echo" in row.locator(".mcp-tool-list li").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / f"mcp-down-{width}x{viewport['height']}.png"))
        row.locator("button", has_text="Edit").click()
        page.check("#mcp-form [name=replace]")
        page.fill("#mcp-form [name=token]", TOKEN)
        page.click("#mcp-save")
        page.wait_for_selector("#mcp-form", state="hidden")
        assert "headers set: Authorization" in row.inner_text()
        _until_state(page, name, "up")

        # an edit the API refuses: its message inline, the form kept open
        row.locator("button", has_text="Edit").click()
        page.wait_for_selector("#mcp-form:not([hidden])")
        assert "Authorization" in page.inner_text("#mcp-headers-set")
        assert page.is_disabled("#mcp-form [name=token]")  # the sealed headers stay
        assert page.get_attribute("#mcp-form [name=name]", "readonly") is not None
        page.fill("#mcp-form [name=url]", "ftp://example.org/mcp")
        page.click("#mcp-save")
        page.wait_for_selector("#mcp-form-error:not([hidden])")
        assert "url" in page.inner_text("#mcp-form-error").lower()
        assert page.is_visible("#mcp-form")
        _check(page, "the edit form with an error", phone)
        page.click("#mcp-cancel")

        # switch it off by keyboard: the list is drawn again, the focus stays on the switch
        row.locator(f"input[data-key='on:{name}']").focus()
        page.keyboard.press("Space")
        page.wait_for_selector(f"{_row(name)}[data-state='off']", timeout=WAIT_MS)
        assert page.evaluate("document.activeElement.dataset.key") == f"on:{name}"
        listed = {s["name"]: s for s in api.get("/api/mcp/servers").json()["servers"]}
        assert listed[name]["enabled"] is False and listed[name]["state"] == "off"
        assert listed[name]["header_names"] == ["Authorization"]

        # off for one project (the projects come from /api/projects)
        row.locator(".mcp-projects summary").click()
        box = row.locator(f"input[data-key='project:{name}:{project}']")
        assert box.is_checked()
        box.click()
        deadline = time.monotonic() + 30
        while True:
            listed = {s["name"]: s for s in api.get("/api/mcp/servers").json()["servers"]}
            if listed[name]["projects_off"] == [project]:
                break
            assert time.monotonic() < deadline, listed[name]
            time.sleep(0.2)
        page.wait_for_function(
            f"!document.querySelector(\"input[data-key='project:{name}:{project}']\").checked"
        )
        _check(page, "a server switched off, its projects open", phone)
        page.screenshot(path=str(ARTIFACTS / f"mcp-settings-{width}x{viewport['height']}.png"))

        # delete, after Loki's own question
        row.locator("button", has_text="Delete").click()
        page.wait_for_selector("#ask-dialog[open]")
        assert_accessible(page, "the ask dialog over the tool servers dialog")
        page.click("#ask-ok")
        page.wait_for_selector(_row(name), state="detached")
        names = [s["name"] for s in api.get("/api/mcp/servers").json()["servers"]]
        assert name not in names and "local" in names

        # the token: never in the page, never in an answer of the API
        assert TOKEN not in page.content()
        assert TOKEN not in page.evaluate("JSON.stringify(LokiMcp.servers())")
        bodies = [r.text() for r in answers]
        assert bodies and not any(TOKEN in b for b in bodies)
        assert errors == []
    finally:
        page.close()
