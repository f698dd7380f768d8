"""``loki.workspace.preview``: an HTML file rendered by Debian's chromium in the sandbox
(a screenshot of the size asked, the title and the text after the page's scripts ran), and
without a browser the page's own text only."""

from __future__ import annotations

import base64
import shutil
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from loki_shared import subjects
from loki_workspace.service import WorkspaceService
from tests.workspace.conftest import ask, workspace_settings

PAGE = (
    "<!doctype html><html><head><title>Tiny page</title>"
    "<style>body{background:#fff}</style></head><body><h1>Hello</h1>"
    "<p id='x'>static text</p><script>document.getElementById('x').textContent = "
    "'written by the script'</script></body></html>"
)


async def _page(nc: NATS) -> None:
    assert (await ask(nc, subjects.WORKSPACE_CREATE, project="web")).error is None
    wrote = await ask(nc, subjects.WORKSPACE_WRITE, project="web", op="write",
                      path="site/index.html", content=PAGE)  # fmt: skip
    assert wrote.error is None


@pytest.mark.slow
async def test_preview_renders_with_chromium(workspace: WorkspaceService, nc: NATS) -> None:
    assert shutil.which("chromium"), "Debian's chromium is needed (scripts/install.sh)"
    await _page(nc)
    reply = await ask(nc, subjects.WORKSPACE_PREVIEW, project="web", path="site/index.html",
                      width=640, height=400, timeout=120)  # fmt: skip
    assert reply.error is None, reply.error
    png = base64.b64decode(reply.png)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (width, height) == (640, 400)
    assert reply.title == "Tiny page"
    assert reply.text == "Hello\nwritten by the script"
    # nothing of the browser's is left in the workspace
    listed = await ask(nc, subjects.WORKSPACE_FILES, project="web", op="list")
    assert [e.path for e in listed.entries] == ["site", "site/index.html"]


@pytest.fixture
async def no_browser(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[None]:
    settings = workspace_settings(
        nats_url, redis_db, tmp_path / "home", workspace_browser="no-such-browser"
    )
    service = WorkspaceService(settings)
    await service.start()
    yield
    await service.stop()


async def test_without_a_browser_the_preview_is_the_text(no_browser: None, nc: NATS) -> None:
    await _page(nc)
    reply = await ask(nc, subjects.WORKSPACE_PREVIEW, project="web", path="site/index.html")
    assert reply.error is None
    assert (reply.png, reply.title) == ("", "Tiny page")
    assert reply.text == "Hello\nstatic text"  # the file's own text: no script ran
    outside = await ask(nc, subjects.WORKSPACE_PREVIEW, project="web", path="../x.html")
    assert outside.error.type == "forbidden"
    missing = await ask(nc, subjects.WORKSPACE_PREVIEW, project="web", path="nope.html")
    assert missing.error.type == "invalid_request"
