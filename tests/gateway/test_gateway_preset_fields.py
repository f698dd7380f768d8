"""The preset editor's model-file picker and UBATCH field, and the sidebar picker's inline
message, in headless Debian chromium at phone and desktop sizes (issue 17, item 5).

The fake peers answer the ``models`` action with the supervisor's own listing
(``loki_supervisor.model_files.list_model_files``) of a directory holding the bundled model
(real GGUF header) and a file that is not a GGUF.
"""

from __future__ import annotations

import os

import pytest

from loki_shared import servers

from .conftest import ARTIFACTS

SIZES = [(390, 844), (1280, 800)]


def _restore(peers):
    peers.presets = {k: v for k, v in peers.presets.items() if k == "env"}
    peers.active_preset = "env"
    peers.switches.clear()
    peers.switch_refusal = None
    peers.model_dirs = []


def _open_drawer(page):
    page.click("#menu-btn")  # the drawer slides in: measured once it is in place
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")


def _open_editor(page, width):
    if width < 700:
        _open_drawer(page)
    page.click("#presets-btn")
    page.wait_for_selector("#presets-list li[data-id=env]")


@pytest.mark.parametrize("size", SIZES, ids=["phone", "desktop"])
def test_model_file_is_picked_from_the_list_and_ubatch_saved(
    browser, gateway, peers, tmp_path, size
):
    (tmp_path / "models").mkdir()
    os.symlink(servers.find_bundled_model(), tmp_path / "models" / "smol.gguf")
    (tmp_path / "models" / "junk.gguf").write_bytes(b"nope")
    peers.model_dirs = [tmp_path / "models"]
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(gateway.url + "/")
        _open_editor(page, size[0])
        page.click("#preset-new-local")
        select = "#preset-form select[name=model]"
        page.wait_for_function(f"document.querySelector('{select}').options.length == 3")
        labels = page.eval_on_selector_all(
            f"{select} option", "os => os.map(o => [o.value, o.textContent])"
        )
        assert labels[0][0] == "" and labels[0][1].startswith("bundled model (")
        smol = str(tmp_path / "models" / "smol.gguf")
        assert dict(labels)[smol].startswith("smol.gguf · ") and dict(labels)[smol].endswith(
            " · llama"
        )
        assert "unreadable" in dict(labels)[str(tmp_path / "models" / "junk.gguf")]
        assert page.input_value(select) == ""  # a new preset: the bundled model
        page.fill("#preset-form [name=id]", "picked")
        page.select_option(select, smol)
        page.fill("#preset-form [name=ubatch]", "256")
        box = page.locator("#preset-form [name=ubatch]").bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= size[0]
        page.screenshot(path=str(ARTIFACTS / f"ui-preset-model-{size[0]}.png"))
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden")
        saved = peers.presets["picked"]
        assert (saved.model, saved.ubatch) == (smol, 256)
        # edited again: the file chosen and UBATCH shown; a file set by hand outside the
        # list is kept as its own option, never silently replaced
        page.locator("#presets-list li", has_text="picked").get_by_role(
            "button", name="Edit"
        ).click()
        page.wait_for_function(f"document.querySelector('{select}').value === {smol!r}")
        assert page.input_value("#preset-form [name=ubatch]") == "256"
        page.click("#preset-cancel")
        saved.model = str(servers.find_bundled_model())  # a path outside LOKI_MODEL_DIRS
        page.reload()
        _open_editor(page, size[0])
        page.wait_for_selector("#presets-list li[data-id=picked]")
        page.locator("#presets-list li", has_text="picked").get_by_role(
            "button", name="Edit"
        ).click()
        page.wait_for_function(f"document.querySelector('{select}').value === {saved.model!r}")
        assert "not under LOKI_MODEL_DIRS" in page.inner_text(f"{select} option:checked")
        page.click("#preset-save")
        page.wait_for_selector("#preset-form", state="hidden")
        assert peers.presets["picked"].model == saved.model
        assert errors == []
    finally:
        _restore(peers)
        page.close()


@pytest.mark.parametrize("size", SIZES, ids=["phone", "desktop"])
def test_sidebar_picker_says_a_refused_switch_inline(browser, gateway, peers, size):
    peers.presets["other"] = peers.presets["env"].model_copy(
        update={"id": "other", "name": "Other"}
    )
    peers.switch_refusal = "the engine is busy: try again"
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(gateway.url + "/")
        page.wait_for_selector("#preset-picker option[value=other]", state="attached")
        if size[0] < 700:
            _open_drawer(page)
        page.select_option("#preset-picker", "other")
        page.wait_for_selector("#preset-picker-msg:not([hidden])")
        page.wait_for_function(
            "document.getElementById('preset-picker-msg').textContent.includes('busy')"
        )
        msg = page.inner_text("#preset-picker-msg")
        assert msg == "Preset not switched: the engine is busy: try again"
        assert "error" in page.get_attribute("#preset-picker-msg", "class")
        box = page.locator("#preset-picker-msg").bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= size[0]
        # the picker goes back to the active preset
        page.wait_for_function("document.getElementById('preset-picker').value === 'env'")
        page.screenshot(path=str(ARTIFACTS / f"ui-preset-picker-refused-{size[0]}.png"))
        # accepted: the message goes away
        peers.switch_refusal = None
        page.select_option("#preset-picker", "other")
        page.wait_for_selector("#preset-picker-msg", state="hidden")
        assert peers.switches == ["other"]
        assert dialogs == []  # never a modal alert
    finally:
        _restore(peers)
        page.close()
