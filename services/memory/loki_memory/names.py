"""Names, files and dates as the memory service accepts them (pure functions).

- a *slug* is lower case ASCII letters, digits, ``-`` and ``_``, starting with a letter or
  digit, at most :data:`SLUG_MAX` characters; :func:`slugify` derives one from any name
  (accents dropped, other runs of characters become ``-``): ``"Diet notes"`` → ``diet-notes``;
- a page's file is ``<slug>.md``; :data:`INDEX_FILE` (``MEMORY.md``) is the index and never a
  page;
- a date is ``YYYY-MM-DD`` (a real calendar day); a year period ``YYYY``, a month ``YYYY-MM``.

Every check raises :class:`loki_shared.errors.InvalidRequest` with a message that says what
to resend.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata

from loki_shared.errors import InvalidRequest

SLUG_MAX = 48
NAME_MAX = 80
DESCRIPTION_MAX = 300
INDEX_FILE = "MEMORY.md"
_SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_YEAR = re.compile(r"^\d{4}$")
_MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def slugify(name: str) -> str:
    """The slug of ``name`` (may be empty when ``name`` holds no letter or digit)."""
    ascii_text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9_]+", "-", ascii_text.lower()).strip("-_")
    return slug[:SLUG_MAX].rstrip("-_")


def is_slug(text: str) -> bool:
    """Whether ``text`` is already a slug (what a project id given by a caller must be)."""
    return len(text) <= SLUG_MAX and bool(_SLUG.match(text))


def name(text: str, what: str) -> str:
    """``text`` stripped, checked to be 1-80 characters and to give a slug.

    Raises:
        InvalidRequest: empty, too long, or no letter or digit in it.
    """
    stripped = " ".join(text.split())
    if not stripped or len(stripped) > NAME_MAX:
        raise InvalidRequest(f"{what} must be 1-{NAME_MAX} characters; got {len(stripped)}")
    if not slugify(stripped):
        raise InvalidRequest(f"{what} {text!r} holds no letter or digit: resend a name with some")
    return stripped


def is_index(page: str) -> bool:
    """Whether ``page`` names the index (``MEMORY.md``, ``memory``, any case)."""
    stem = page.strip()
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    return stem.strip().lower() == "memory"


def page_file(page: str) -> str:
    """The file of ``page`` (``notes.md``, ``notes`` or ``"My notes"`` → ``my-notes.md``).

    Raises:
        InvalidRequest: no letter or digit, or the index's name.
    """
    stem = page.strip()
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    slug = slugify(stem)
    if not slug:
        raise InvalidRequest(f"page {page!r} gives no file name: resend a name with letters")
    if slug == "memory":
        raise InvalidRequest(
            f"{INDEX_FILE} is the index, kept by Loki itself: write a page with another name"
        )
    return f"{slug}.md"


def tracker_slug(tracker: str) -> str:
    """The slug of a tracker name or slug.

    Raises:
        InvalidRequest: no letter or digit.
    """
    slug = slugify(tracker)
    if not slug:
        raise InvalidRequest(f"tracker {tracker!r} gives no name: resend a name with letters")
    return slug


def description(text: str) -> str:
    """A one-line description: white space runs become one space.

    Raises:
        InvalidRequest: longer than :data:`DESCRIPTION_MAX` characters.
    """
    line = " ".join(text.split())
    if len(line) > DESCRIPTION_MAX:
        raise InvalidRequest(
            f"description is {len(line)} characters: resend one line of at most {DESCRIPTION_MAX}"
        )
    return line


def date(text: str | None, today: dt.date | None = None) -> str:
    """``text`` checked as ``YYYY-MM-DD``; None is ``today`` (default: today, UTC).

    Raises:
        InvalidRequest: not a real ``YYYY-MM-DD`` day.
    """
    if text is None:
        return (today or dt.datetime.now(dt.UTC).date()).isoformat()
    text = text.strip()
    if _DAY.match(text):
        try:
            return dt.date.fromisoformat(text).isoformat()
        except ValueError:
            pass
    raise InvalidRequest(f"date {text!r} is not a day: resend it as YYYY-MM-DD, e.g. 2026-03-14")


def value(number: float) -> float:
    """``number`` checked to be finite.

    Raises:
        InvalidRequest: NaN or infinite.
    """
    if not math.isfinite(number):
        raise InvalidRequest(f"value {number!r} is not a finite number: resend a number")
    return float(number)


def period(level: str, text: str) -> str:
    """A tracker read's ``period`` checked for ``level``: ``YYYY`` for ``year``, ``YYYY-MM``
    for ``month``, ``YYYY-MM`` or ``YYYY-MM-DD`` for ``events``.

    Raises:
        InvalidRequest: the wrong shape for the level.
    """
    text = text.strip()
    if level == "year" and _YEAR.match(text):
        return text
    if level in ("month", "events") and _MONTH.match(text):
        return text
    if level == "events" and _DAY.match(text):
        return date(text)
    shapes = {"year": "YYYY", "month": "YYYY-MM", "events": "YYYY-MM or YYYY-MM-DD"}
    raise InvalidRequest(
        f"period {text!r} does not fit level {level!r}: resend it as {shapes.get(level, '')}"
    )


def format_value(number: float) -> str:
    """``number`` as a person writes it: ``70`` for 70.0, ``70.5``, the shortest exact form."""
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(number)
