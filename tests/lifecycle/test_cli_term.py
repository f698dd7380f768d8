"""What the ``loki`` command prints (:mod:`loki_cli.term`): a message is one line at any
terminal width, and text from elsewhere keeps its brackets (never read as rich markup)."""

from __future__ import annotations

import pytest

from loki_cli import term

# An error as the restore refuses a store (the key's repr has brackets-like text elsewhere)
MESSAGE = (
    "the target Redis already holds Loki data (for one, b'loki:recall:owner:p:default'): "
    "restore only into an empty store (nothing was restored) [red]not a style[/]"
)


@pytest.fixture
def narrow():
    before = term.console.width
    term.console.width = 30  # a narrow terminal: rich would break lines at 30 columns
    yield
    term.console.width = before


def test_a_long_message_stays_on_one_line_and_keeps_its_brackets(narrow, capsys):
    term.say(RuntimeError(MESSAGE), style="red")
    assert capsys.readouterr().err == MESSAGE + "\n"


def test_a_label_and_its_text(narrow, capsys):
    term.say("[tokens] counted 3 texts", "loki", "bold cyan")
    term.say("/opt/models/[x].gguf", "bundled model  missing:", "red")
    assert capsys.readouterr().err.splitlines() == [
        "loki [tokens] counted 3 texts",
        "bundled model  missing: /opt/models/[x].gguf",
    ]
