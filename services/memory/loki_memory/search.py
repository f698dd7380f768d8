"""Word search over a project's pages (pure; the pages are few and already opened).

A page's score sums, over the distinct words of the query, 3 per occurrence in its title, 2
per occurrence in its description and 1 per occurrence in its text (words: runs of letters and
digits, case-insensitive). Pages scoring 0 are left out; ties go by file. The snippet is the
text line holding the most query words, cut to :data:`SNIPPET_MAX` characters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from loki_shared.errors import InvalidRequest
from loki_shared.messages.projects import Page, SearchHit

SNIPPET_MAX = 200
LIMIT_MAX = 50
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``."""
    return _WORD.findall(text.lower())


def search(pages: Iterable[Page], query: str, limit: int) -> list[SearchHit]:
    """The pages matching ``query``, best first, at most ``limit``.

    Raises:
        InvalidRequest: no word in ``query``, or ``limit`` outside 1-50.
    """
    wanted = set(words(query))
    if not wanted:
        raise InvalidRequest("query holds no word: resend some words to look for")
    if not 1 <= limit <= LIMIT_MAX:
        raise InvalidRequest(f"limit {limit} is outside 1-{LIMIT_MAX}: resend one inside")
    hits = []
    for page in pages:
        title, desc, body = (
            Counter(words(page.title)),
            Counter(words(page.description)),
            Counter(words(page.content)),
        )
        score = sum(3 * title[w] + 2 * desc[w] + body[w] for w in wanted)
        if score:
            hits.append(
                SearchHit(
                    file=page.file,
                    title=page.title,
                    description=page.description,
                    score=float(score),
                    snippet=_snippet(page, wanted),
                )
            )
    hits.sort(key=lambda h: (-h.score, h.file))
    return hits[:limit]


def _snippet(page: Page, wanted: set[str]) -> str:
    best, best_count = "", 0
    for text_line in page.content.splitlines():
        count = len(wanted & set(words(text_line)))
        if count > best_count:
            best, best_count = text_line.strip(), count
    if not best:
        best = page.description or page.title
    return best if len(best) <= SNIPPET_MAX else best[: SNIPPET_MAX - 1] + "…"
