"""The CLI's one terminal: every command writes to standard error through :data:`console`.

Two rules keep what it prints readable by people and by scripts alike:

- ``soft_wrap``: a line is never broken at the terminal's width (an error message that a
  script greps for stays on one line, whatever ``COLUMNS`` says);
- text that comes from elsewhere (an exception, a service's log line, a path) is escaped
  before it meets rich's markup, so a ``[`` in it is printed as it is, never read as a style.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)


def say(text: object, label: str = "", style: str = "") -> None:
    """Print ``text`` (any object, shown with ``str``) after an optional ``label`` in
    ``style`` (a rich style such as ``"red"``); ``text`` is never read as markup."""
    body = escape(str(text))
    if label:
        console.print(f"[{style}]{escape(label)}[/] {body}" if style else f"{escape(label)} {body}")
    else:
        console.print(f"[{style}]{body}[/]" if style else body)
