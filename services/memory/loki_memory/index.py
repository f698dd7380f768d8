"""``MEMORY.md``, the index of a project's pages, kept by code (never written by the model).

One line per page, sorted by file: ``- [Title](file.md) — description`` (``- [Title](file.md)``
when the description is empty). The key of a line is its ``](file.md)`` part. A page's title
is its first ``# `` heading, else its file's stem.
"""

from __future__ import annotations

from collections.abc import Iterable

from loki_shared.messages.projects import PageMeta

#: What the index's own "page" is called when read (``loki.projects.page.read MEMORY.md``).
INDEX_TITLE = "Index"


def title_of(content: str, file: str) -> str:
    """The page's first ``# `` heading (without the ``#``), else ``file`` without ``.md``."""
    for line in content.splitlines():
        if line.startswith("# ") and line[2:].strip():
            return line[2:].strip()
    return file[:-3] if file.endswith(".md") else file


def line(meta: PageMeta) -> str:
    """The index line of one page."""
    head = f"- [{meta.title}]({meta.file})"
    return f"{head} — {meta.description}" if meta.description else head


def lines(metas: Iterable[PageMeta]) -> list[str]:
    """The index lines of ``metas``, sorted by file."""
    return [line(m) for m in sorted(metas, key=lambda m: m.file)]


def text(metas: Iterable[PageMeta]) -> str:
    """The text of ``MEMORY.md``: one line per page, each ending with a newline (empty when
    there is no page)."""
    return "".join(f"{entry}\n" for entry in lines(metas))
