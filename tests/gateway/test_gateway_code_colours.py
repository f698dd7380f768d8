"""The file viewer's colours (``loki_gateway.routes.code_colours``, issue 43): Pygments' HTML,
one line per ``<span class="line">``, each line standing alone (its spans closed inside it,
so a multi-line string or comment never leaks its colour into the page's structure); the text
recovered whole from the HTML; the lexer by the file's name, plain text when none fits; the
stylesheet scoped to ``.code-view``, light and dark."""

from __future__ import annotations

import re
from html import unescape

import pytest

from loki_gateway.routes.code_colours import SCOPE, colour, stylesheet

SAMPLES = {
    "pkg/mod.py": 'x = """first\nsecond <b>\nthird"""\n# done & dusted\n',
    "src/main.c": "/* a comment\n   over lines */\nint main(void) { return 0; }\n",
    "site/index.html": '<!-- note\nmore -->\n<script>alert("x")</script>\n<p onclick="y">t</p>\n',
    "notes.unknownext": "plain <text> & more\n\tindented\n",
    "Makefile": "all:\n\tcc -o a a.c\n",
}


def _text_of(html: str) -> str:
    return unescape(re.sub(r"<[^>]*>", "", html))


@pytest.mark.parametrize("path", sorted(SAMPLES))
def test_every_line_stands_alone_and_the_text_is_whole(path: str) -> None:
    text = SAMPLES[path]
    got = colour(path, text)
    rows = got.html.split("\n")
    assert got.lines == len(rows) == text.count("\n")
    for row in rows:
        assert row.startswith('<span class="line">') and row.endswith("</span>"), row
        assert row.count("<span") == row.count("</span>"), row
        tags = re.findall(r"<[^>]*>", row)
        assert all(re.fullmatch(r'<span class="[\w ]+">|</span>', t) for t in tags), tags
    assert _text_of(got.html) + "\n" == text


def test_the_lexer_is_chosen_by_the_file_name() -> None:
    assert colour("a/b/tool.py", "x = 1\n").language == "Python"
    assert colour("Makefile", "all:\n").language == "Makefile"
    assert colour("data.unknownext", "x\n").language == "Text only"
    assert '<span class="k">def</span>' in colour("m.py", "def f(): pass\n").html
    assert colour("empty.py", "").lines == 0 and colour("empty.py", "").html == ""


def test_the_stylesheet_is_scoped_light_then_dark() -> None:
    css = stylesheet()
    rules = [line for line in css.splitlines() if "{" in line and not line.startswith("@")]
    assert rules and all(line.strip().startswith(SCOPE) for line in rules), rules[:3]
    light, dark = css.split("@media (prefers-color-scheme: dark)")
    assert f"{SCOPE} .k {{" in light and f"{SCOPE} .k {{" in dark
    assert "pre {" not in css and "linenos" not in css  # nothing outside the viewer
