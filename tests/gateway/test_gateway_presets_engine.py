"""The preset flow end to end (issue 17, item 5): in headless Debian chromium, at phone and
desktop sizes, the preset editor creates, edits, switches to and deletes a local preset (its
model file picked from ``LOKI_MODEL_DIRS``) and an external one, against the real engine
supervisor launching the real llama-server (bundled SmolLM2), the external API being the
scripted fake engine (``tests/fakes/fake_engine.py``).

What the page did is checked where it lands: the supervisor's presets (``/api/presets``) and
the engine it runs (``/api/engine``: ``n_ctx``, command line, external, state).
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from loki_shared import servers
from tests.engine import conftest as engine_fixtures
from tests.fakes.fake_engine import FakeEngine

from .conftest import ARTIFACTS, launch_gateway

pytestmark = pytest.mark.engine

# the real supervisor's fixtures (tests/engine/conftest.py), used here beside the browser's
engine_env = engine_fixtures.engine_env
supervisor_factory = engine_fixtures.supervisor_factory


def _engine(http: httpx.Client, predicate, what: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        r = http.get("/api/engine")
        if r.status_code == 200:
            body = r.json()
            if predicate(body):
                return body
        time.sleep(0.25)
    pytest.fail(f"engine never {what}: {body}")


def _open_editor(page, narrow: bool) -> None:
    if narrow:
        page.click("#menu-btn")
    page.click("#presets-btn")
    page.wait_for_selector("#presets-list li[data-id=env]")


def _row(page, pid: str):
    return page.locator(f"#presets-list li[data-id={pid}]")


def _click_row(page, pid: str, name: str) -> None:
    _row(page, pid).get_by_role("button", name=name).click()


@pytest.mark.parametrize("size", [(390, 844), (1280, 800)], ids=["phone", "desktop"])
def test_preset_editor_end_to_end_local_and_external(
    browser,
    engine_env,
    supervisor_factory,
    nats_url,
    redis_url,
    tmp_path,
    size,
):
    models = tmp_path / "models"
    models.mkdir()
    smol = models / "smol.gguf"
    os.symlink(servers.find_bundled_model(), smol)
    sup = supervisor_factory({**engine_env, "LOKI_MODEL_DIRS": str(models)})
    gw = launch_gateway(nats_url, tmp_path / "gw", redis_url=redis_url)
    remote = FakeEngine().start()
    narrow = size[0] < 700
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    dialogs: list[str] = []  # a browser pop-up (never: Loki asks in its own dialog)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        http = gw.client()
        _engine(http, lambda b: b["state"] == "ready", "ready")
        page.goto(gw.url + "/")
        page.wait_for_selector("#engine-state.ready", state="attached", timeout=30000)
        _open_editor(page, narrow)

        # create a local preset: model file picked from the list, CTX, UBATCH
        page.click("#preset-new-local")
        select = "#preset-form select[name=model]"
        page.wait_for_function(
            f"[...document.querySelector('{select}').options].some(o => o.value === {str(smol)!r})"
        )
        assert "llama" in page.inner_text(f"{select} option[value='{smol}']")
        page.fill("#preset-form [name=id]", "loc")
        page.fill("#preset-form [name=name]", "Local small")
        page.select_option(select, str(smol))
        page.fill("#preset-form [name=ctx]", "1024")
        page.fill("#preset-form [name=ubatch]", "128")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden", timeout=30000)
        stored = {p["id"]: p for p in http.get("/api/presets").json()["presets"]}
        assert (stored["loc"]["model"], stored["loc"]["ctx"], stored["loc"]["ubatch"]) == (
            str(smol),
            1024,
            128,
        )

        # edit it: the form shows what is stored; the change is saved
        _click_row(page, "loc", "Edit")
        page.wait_for_function(f"document.querySelector('{select}').value === {str(smol)!r}")
        assert page.input_value("#preset-form [name=ctx]") == "1024"
        page.fill("#preset-form [name=ctx]", "1536")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden", timeout=30000)
        assert (
            next(p for p in http.get("/api/presets").json()["presets"] if p["id"] == "loc")["ctx"]
            == 1536
        )

        # switch to it: the supervisor relaunches llama-server with the preset's values
        _click_row(page, "loc", "Switch")
        info = _engine(
            http,
            lambda b: b["state"] == "ready" and b.get("preset_id") == "loc" and b["n_ctx"] == 1536,
            "switched to loc",
        )
        argv = info["argv"]
        assert str(smol) in argv and argv[argv.index("--ubatch-size") + 1] == "128"
        page.wait_for_function(
            "document.querySelector('#presets-list li[data-id=loc]').textContent.includes('active')"
        )

        # an external API (the scripted fake engine): test connection, save, switch
        page.click("#preset-new-external")
        page.fill("#preset-form [name=id]", "ext")
        page.fill("#preset-form [name=name]", "Remote")
        page.fill("#preset-form [name=base_url]", remote.url + "/v1")
        page.fill("#preset-form [name=api_model]", "fake-model")
        page.fill("#preset-form [name=api_key]", "sk-remote-secret")
        page.click("#preset-test")
        page.wait_for_function(
            "document.getElementById('preset-test-result').textContent.startsWith('Connected')",
            timeout=30000,
        )
        assert "fake-model" in page.inner_text("#preset-test-result")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden", timeout=30000)
        _click_row(page, "ext", "Switch")
        ext = _engine(http, lambda b: b["external"] and b["state"] == "ready", "external")
        assert ext["base_url"] == remote.url
        deadline = time.monotonic() + 30
        while sup.engine_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sup.engine_pids() == []  # the local engine stopped
        assert "sk-remote-secret" not in page.content()
        assert "sk-remote-secret" not in http.get("/api/presets").text

        # delete the local preset (not active now), then back to env and delete the external
        _click_row(page, "loc", "Delete")
        page.click("#ask-ok")
        page.wait_for_selector("#presets-list li[data-id=loc]", state="detached")
        _click_row(page, "env", "Switch")
        _engine(
            http,
            lambda b: b["state"] == "ready" and not b["external"] and b.get("preset_id") == "env",
            "back on env",
        )
        _click_row(page, "ext", "Delete")
        page.click("#ask-ok")
        page.wait_for_selector("#presets-list li[data-id=ext]", state="detached")
        assert [p["id"] for p in http.get("/api/presets").json()["presets"]] == ["env"]
        page.screenshot(path=str(ARTIFACTS / f"ui-presets-engine-{size[0]}.png"))
        assert errors == [] and dialogs == []
    finally:
        page.close()
        remote.stop()
        gw.proc.stop()
