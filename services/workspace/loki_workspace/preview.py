"""``preview``: an HTML file of the workspace rendered by headless chromium (Debian's
``chromium``) inside the sandbox — no network, the workspace read as ``file://`` — giving a
screenshot (PNG, base64) and the page's title and visible text.

The text comes from the DOM the browser prints after the page's scripts ran (``--dump-dom``),
reduced to what a reader sees by the standard library's :class:`html.parser.HTMLParser`
(:func:`page_text`): the text nodes outside ``script``, ``style``, ``template``... and the
title. Without a browser (none installed, or it failed) the preview is the file's own text
read the same way, and ``png`` is "": what a model without vision is told anyway.

The browser runs with its own sandbox off (``--no-sandbox``): it needs user namespaces,
which the sandbox forbids (``--disable-userns``); bubblewrap is the sandbox here. It runs
without the address-space limit (it reserves far more than it uses) but with the others.
"""

from __future__ import annotations

import base64
import binascii
import shutil
from html.parser import HTMLParser

from .sandbox import Limits

#: Characters of the visible text kept (the contract's).
TEXT_MAX = 4000
#: Elements whose text is not shown.
HIDDEN = frozenset({"script", "style", "template", "noscript", "head", "svg", "canvas"})
#: Elements that end a line of text.
BLOCKS = frozenset(
    {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
     "header", "footer", "ul", "ol", "table", "pre", "blockquote", "nav", "main", "form"}
)  # fmt: skip
#: Markers between the parts of the browser's output.
DOM_MARK = "@@LOKI-DOM@@"
PNG_MARK = "@@LOKI-PNG@@"


class _Text(HTMLParser):
    """Collects a page's title and its visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.text: list[str] = []
        self._hidden = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in HIDDEN:
            self._hidden += 1
        elif tag in BLOCKS:
            self.text.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag in BLOCKS:
            self.text.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._hidden:
            self.text.append(data)


def page_text(html: str) -> tuple[str, str]:
    """(title, visible text) of the HTML document ``html``: runs of blanks made one space,
    empty lines dropped, the text cut at :data:`TEXT_MAX` characters."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    title = " ".join("".join(parser.title).split())
    lines = (" ".join(line.split()) for line in "".join(parser.text).splitlines())
    text = "\n".join(line for line in lines if line)
    return title, text[:TEXT_MAX]


def find_browser(name: str) -> str | None:
    """The browser's path (``name`` looked up on ``PATH``), None when there is none."""
    return shutil.which(name)


def browser_command(browser: str, url: str, width: int, height: int) -> list[str]:
    """The sandboxed command: the DOM, then the screenshot (base64), each after its marker
    (:func:`parse_output`). The browser's profile and output stay in the sandbox's ``/tmp``."""
    flags = (
        "--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
        "--no-default-browser-check --disable-breakpad --disable-extensions "
        "--hide-scrollbars --user-data-dir=/tmp/profile --virtual-time-budget=3000 "
        f"--window-size={width},{height}"
    )
    script = (
        f'b="$1"; u="$2"; "$b" {flags} --dump-dom "$u" >/tmp/dom.html 2>/dev/null; '
        f'"$b" {flags} --screenshot=/tmp/shot.png "$u" >/dev/null 2>&1; '
        f"echo {DOM_MARK}; cat /tmp/dom.html; echo; echo {PNG_MARK}; "
        "base64 -w0 /tmp/shot.png 2>/dev/null"
    )
    return ["sh", "-c", script, "preview", browser, url]


def parse_output(output: str) -> tuple[str, str]:
    """(the DOM, the screenshot as base64: "" when the browser made none) from
    :func:`browser_command`'s output."""
    if DOM_MARK not in output or PNG_MARK not in output:
        return "", ""
    after = output.split(DOM_MARK + "\n", 1)[-1]
    dom, png = after.split(PNG_MARK, 1)
    png = png.strip()
    try:
        raw = base64.b64decode(png, validate=True)
    except (binascii.Error, ValueError):
        return dom, ""
    return dom, png if raw.startswith(b"\x89PNG") else ""


def preview_limits(base: Limits) -> Limits:
    """``base`` for the browser: no address-space limit, room for its threads (the process
    limit counts them) and for the screenshot in the output."""
    return Limits(
        timeout_s=base.timeout_s,
        output_max=max(base.output_max, 32 * 1024 * 1024),
        output_kill=max(base.output_kill, 40 * 1024 * 1024),
        memory=None,
        procs=max(base.procs, 2048),
        file_size=base.file_size,
        tmp_size=base.tmp_size,
    )
