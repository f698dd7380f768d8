"""Syntax colours of the Code panel's file viewer, computed here with Pygments, and the
stylesheet they need (``GET /code-colours.css``).

:func:`colour` turns a file's text into HTML lines: each line one ``<span class="line">``
holding Pygments' ``<span class="…">`` tokens, every character of the text escaped by
Pygments' HTML formatter (``&``, ``<``, ``>``, quotes), so the HTML carries no markup but
those spans and their class names. The lexer is chosen by the file's name (plain text when
none fits). The classes are Pygments' short token names under ``.code-view``; the
stylesheet gives them the ``default`` style's colours (chosen for WCAG AA contrast on its own
background) and, under ``prefers-color-scheme: dark``, ``github-dark``'s. It has no secret in
it and is served outside ``/api`` (a ``<link>`` sends no key).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from fastapi import APIRouter
from fastapi.responses import Response
from pygments import highlight  # type: ignore[import-untyped]
from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
from pygments.lexer import Lexer  # type: ignore[import-untyped]
from pygments.lexers import get_lexer_for_filename  # type: ignore[import-untyped]
from pygments.lexers.special import TextLexer  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]

router = APIRouter(tags=["code"])

#: The CSS scope of the colours (the viewer's ``<pre>``).
SCOPE = ".code-view"
LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"


@dataclass(frozen=True)
class Coloured:
    """A file coloured: ``html`` (one ``<span class="line">`` per line of the text, joined
    by ``\\n``), ``language`` (the lexer's name, ``Text only`` when none fits) and ``lines``
    (how many)."""

    html: str
    language: str
    lines: int


def _lexer(path: str) -> Lexer:
    name = path.rsplit("/", 1)[-1]
    try:
        return get_lexer_for_filename(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer(stripnl=False, ensurenl=False)


def colour(path: str, text: str) -> Coloured:
    """``text`` (a file's text, already cut to what is shown) coloured for the file name of
    ``path`` (workspace-relative). CPU-bound (Pygments' regular expressions): call it off
    the event loop on long texts."""
    lexer = _lexer(path)
    body = highlight(text, lexer, HtmlFormatter(nowrap=True)) if text else ""
    # HtmlFormatter closes and reopens its spans at each newline: every line stands alone
    rows = body.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    html = "\n".join(f'<span class="line">{row}</span>' for row in rows)
    return Coloured(html=html, language=str(lexer.name), lines=len(rows))


@lru_cache(maxsize=1)
def stylesheet() -> str:
    """The CSS of the token classes under :data:`SCOPE`: light, then dark in a
    ``prefers-color-scheme: dark`` block."""

    def rules(style: str) -> str:
        fmt = HtmlFormatter(style=style)
        lines = fmt.get_background_style_defs(SCOPE) + fmt.get_token_style_defs(SCOPE)
        return "\n".join(lines)

    dark = "\n".join("  " + line for line in rules(DARK_STYLE).splitlines())
    return (
        f"/* Pygments '{LIGHT_STYLE}' and '{DARK_STYLE}' token colours, generated */\n"
        f"{rules(LIGHT_STYLE)}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
    )


@router.get("/code-colours.css", include_in_schema=False)
async def code_colours_css() -> Response:
    """The token colours of the file viewer (:func:`stylesheet`), cached a day."""
    return Response(
        stylesheet(),
        media_type="text/css",
        headers={"Cache-Control": "max-age=86400"},
    )
