"""The scheduled tasks dialog in headless Debian chromium, at phone size (390×844) and on a
laptop (1280×800): the gateway (subprocess) in front of the real chat service (in process)
on the real NATS and Redis, the scripted fake engine answering. A bad cron expression shows
the server's message and the dialog stays open; fixed, the task is saved, listed, runs, its
runs show their status, and a run's conversation opens in the main view with the task note
at the head of its user message, titled as the task, while the sidebar lists none of the
runs; switched off, then deleted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chat.helpers import ChatRunner
from tests.fakes.fake_engine import FakeEngine, text_reply
from tests.fakes.fake_supervisor import FakeSupervisor
from tests.gateway.conftest import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, Gateway, launch_gateway

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def gw(nats_url: str, redis_url: str, tmp_path_factory: Any) -> Any:
    """One gateway for the module (it keeps no task state: every route asks the chat)."""
    gateway = launch_gateway(nats_url, tmp_path_factory.mktemp("gw"), None, None, redis_url)
    yield gateway
    gateway.proc.stop()


@pytest.fixture
async def browser() -> Any:
    from playwright.async_api import async_playwright  # a missing package fails, never skips

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium missing: scripts/install.sh --test installs it")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield b
        await b.close()


async def fits(page: Any, viewport: dict[str, int]) -> None:
    """Nothing scrolls sideways: the page, the dialog."""
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"page is {width} px wide in {viewport['width']} px"
    box = await page.locator("#tasks-dialog").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"] + 0.5, box
    over = await page.eval_on_selector("#tasks-dialog", "d => d.scrollWidth - d.clientWidth")
    assert over <= 0, f"the dialog scrolls sideways by {over} px"


@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["phone", "laptop"])
async def test_tasks_dialog_creates_runs_opens_and_deletes(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    fake_engine: FakeEngine,
    gw: Gateway,
    browser: Any,
    viewport: dict[str, int],
) -> None:
    await chat_runner.start(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0)
    fake_engine.default = text_reply("Tick done.")
    page = await browser.new_page(viewport=viewport)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    popups: list[str] = []  # a browser pop-up (alert, confirm, prompt) is never used
    page.on("dialog", lambda d: (popups.append(d.message), asyncio.ensure_future(d.dismiss())))
    name = f"shot-tasks-{'phone' if viewport is PHONE else 'laptop'}"
    try:
        await page.goto(gw.url + "/")
        if viewport is PHONE:
            await page.click("#menu-btn")
        await page.click("#tasks-btn")
        await page.wait_for_selector("#tasks-list li.hint")  # "No task yet."
        await page.click("#task-new")
        await page.fill("#task-form [name=name]", "ticker")
        await page.fill("#task-form [name=prompt]", "Say tick.")
        await page.select_option("#task-form [name=kind]", "cron")
        await page.fill("#task-form [name=cron]", "61 * * * *")
        await page.fill("#task-form [name=tz]", "Europe/Paris")
        await page.click("#task-save")
        await page.wait_for_selector("#task-error:not([hidden])")
        assert "'cron' is not a valid cron expression" in await page.inner_text("#task-error")
        assert await page.is_visible("#task-form")  # the dialog stays open
        await fits(page, viewport)
        # fixed: every 2 seconds
        await page.select_option("#task-form [name=kind]", "interval")
        assert await page.is_hidden("#task-form [name=cron]")
        await page.fill("#task-form [name=interval_s]", "2")
        await page.click("#task-save")
        row = page.locator("#tasks-list li", has_text="ticker")
        await row.wait_for()
        assert "every 2 s · Europe/Paris" in await row.inner_text()
        # its runs: wait for one that ended ok
        deadline = time.monotonic() + 20
        await row.get_by_role("button", name="Runs").click()
        while not await page.locator("#task-runs-list li[data-status=ok]").count():
            assert time.monotonic() < deadline, await page.inner_text("#task-runs-list")
            await asyncio.sleep(0.5)
            await page.click("#task-runs-refresh")
        await fits(page, viewport)
        await page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
        ok = page.locator("#task-runs-list li[data-status=ok]").first
        assert "ok" in await ok.inner_text()
        await ok.get_by_role("button", name="Open").click()
        await page.wait_for_selector("#tasks-dialog", state="hidden")
        first_user = page.locator("#messages .msg.user").first
        await first_user.wait_for()
        assert "Say tick." in await first_user.inner_text()
        await page.locator("#messages", has_text="Tick done.").wait_for()
        # opened from the Tasks dialog, titled as the task; the sidebar lists none of the runs
        opened = await page.get_attribute("#messages", "data-conversation")
        assert await page.inner_text("#conv-title") == "Task: ticker"
        await page.evaluate("LokiApi.loadConversations()")
        listed = await page.eval_on_selector_all(
            "#conversations li", "ls => ls.map(l => l.dataset.id)"
        )
        runs = (await gw_json(gw, "/api/conversations?kind=task"))["conversations"]
        assert opened in {c["id"] for c in runs}
        assert not {c["id"] for c in runs} & set(listed), listed
        # switched off, then deleted
        if viewport is PHONE:
            await page.click("#menu-btn")
        await page.click("#tasks-btn")
        await row.get_by_role("checkbox", name="On").uncheck()
        await page.locator("#tasks-list li", has_text="· off").wait_for()
        tasks = (await gw_json(gw, "/api/tasks"))["tasks"]
        assert [t["enabled"] for t in tasks] == [False]
        await (
            page.locator("#tasks-list li", has_text="ticker")
            .get_by_role("button", name="Delete")
            .click()
        )
        await page.click("#ask-ok")  # Loki's own dialog asks first
        await page.wait_for_selector("#tasks-list li.hint")
        assert (await gw_json(gw, "/api/tasks"))["tasks"] == []
        assert errors == [] and popups == []
    finally:
        await page.close()


async def gw_json(gw: Gateway, path: str) -> Any:
    import httpx

    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
        return (await http.get(path)).json()


@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["phone", "laptop"])
async def test_tasks_dialog_shows_the_next_runs_as_the_schedule_is_typed(
    chat_runner: ChatRunner,
    supervisor: FakeSupervisor,
    gw: Gateway,
    browser: Any,
    viewport: dict[str, int],
) -> None:
    """Before anything is saved, the form shows the schedule's next three run times in the
    task's time zone, or why the server refuses it (a day that never comes, six fields)."""
    await chat_runner.start(task_tick_s=0.2, task_grace_s=60.0, task_wait_s=5.0)
    page = await browser.new_page(viewport=viewport)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    nxt = page.locator("#task-next")

    async def shows(state: str, text: str) -> str:
        deadline = time.monotonic() + 10
        while True:
            said = await nxt.inner_text()
            if await nxt.get_attribute("data-state") == state and text in said:
                return said
            assert time.monotonic() < deadline, (state, text, said)
            await asyncio.sleep(0.1)

    try:
        await page.goto(gw.url + "/")
        if viewport is PHONE:
            await page.click("#menu-btn")
        await page.click("#tasks-btn")
        await page.click("#task-new")
        await page.fill("#task-form [name=tz]", "Europe/Berlin")
        await page.select_option("#task-form [name=kind]", "cron")
        await page.fill("#task-form [name=cron]", "30 9 * * 1")
        said = await shows("ok", "Next runs (Europe/Berlin)")
        assert said.count("09:30") == 3, said
        assert said.count("+01:00") + said.count("+02:00") == 3, said
        await fits(page, viewport)
        await page.screenshot(path=str(ARTIFACTS / f"shot-tasks-next-{viewport['width']}.png"))
        await page.fill("#task-form [name=cron]", "0 0 30 2 *")
        await shows("error", "can never fire")
        await page.fill("#task-form [name=cron]", "0 0 9 * * 1")
        await shows("error", "has 6 fields, not 5")
        await fits(page, viewport)
        await page.select_option("#task-form [name=kind]", "interval")
        await page.fill("#task-form [name=interval_s]", "3600")
        said = await shows("ok", "Next runs (Europe/Berlin)")
        assert said.count(" · ") == 2, said
        await page.fill("#task-form [name=tz]", "Mars/Olympus")
        await shows("error", "'tz' is not a known time zone")
        assert (await gw_json(gw, "/api/tasks"))["tasks"] == []  # nothing was saved
        assert errors == []
    finally:
        await page.close()
