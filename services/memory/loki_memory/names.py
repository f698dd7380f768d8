"""Names, files and dates as the memory service accepts them (pure functions).

- a *slug* is lower-case letters and digits of any script (with their combining marks),
  ``-`` and ``_``, starting with a letter or digit, at most :data:`SLUG_MAX` characters;
  :func:`slugify` derives one from any name: a character that has an ASCII form
  (``é`` → ``e``, full-width ``Ａ`` → ``a``) is written in it, as before Unicode slugs
  existed, so a Latin name's slug is what it always was; a letter, digit or combining mark of
  another script is kept as written (lower-cased, NFC): ``"Diet notes"`` → ``diet-notes``,
  ``"Здоровье"`` → ``здоровье``, ``"日記"`` → ``日記``, ``"हिन्दी नोट्स"`` → ``हिन्दी-नोट्स``.
  Runs of ASCII punctuation and white space become ``-``; symbols, control and format
  characters are dropped. So a slug never holds ``.``, ``/``, ``\\``, a control character or
  white space, and ``..`` or a separator can never reach a file name;
- a *project id* stays ASCII (:func:`project_id_base`): the ASCII slug of its name, or, for a
  name written only in other scripts, ``p-`` and 8 hex digits of its SHA-256 (the name is kept
  as written for display);
- a page's file is ``<slug>.md``; :data:`INDEX_FILE` (``MEMORY.md``) is the index and never a
  page (nor is any name whose slug is ``memory``);
- a name stored before Unicode slugs, with letters of other scripts beside Latin ones, has
  the *legacy* slug (:func:`legacy_slug`: those letters dropped); lookups fall back on it.
- a date is ``YYYY-MM-DD`` (a real calendar day); a year period ``YYYY``, a month ``YYYY-MM``.

Every check raises :class:`loki_shared.errors.InvalidRequest` with a message that says what
to resend.
"""

from __future__ import annotations

import datetime as dt
import hashlib
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


def _cut(slug: str) -> str:
    return slug.strip("-_")[:SLUG_MAX].rstrip("-_")


def slugify(name: str) -> str:
    """The slug of ``name`` in any script (empty when ``name`` holds no letter or digit);
    the rules are in the module docstring."""
    out: list[str] = []
    other_script = False  # the last character kept was a letter of a script without ASCII
    for ch in unicodedata.normalize("NFC", name):
        ascii_form = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
        kind = unicodedata.category(ch)[0]
        if ascii_form:
            out.append(re.sub(r"[^a-z0-9_]+", "-", ascii_form.lower()))
            other_script = False
        elif kind in "LN":
            out.append(ch.lower())
            other_script = True
        elif kind == "M" and other_script:  # a vowel sign, virama, harakat... of that letter
            out.append(ch)
    return _cut(re.sub(r"-+", "-", "".join(out)))


def legacy_slug(name: str) -> str:
    """The slug names had before Unicode slugs: ASCII forms only, every other letter dropped
    (what pages, trackers and project ids stored then were derived with)."""
    ascii_text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    return _cut(re.sub(r"[^a-z0-9_]+", "-", ascii_text.lower()))


def project_id_base(name: str) -> str:
    """An ASCII project id for ``name`` (before a ``-2``, ``-3``... that makes it unique): its
    legacy slug (so a project id is derived as it always was), or ``p-`` and 8 hex digits of
    the SHA-256 of its NFC form when it holds no ASCII letter or digit (``"Здоровье"``)."""
    base = legacy_slug(name)
    if base:
        return base
    digest = hashlib.sha256(unicodedata.normalize("NFC", name).encode()).hexdigest()
    return f"p-{digest[:8]}"


def is_slug(text: str) -> bool:
    """Whether ``text`` is already an ASCII slug (what a project id given by a caller must
    be)."""
    return len(text) <= SLUG_MAX and bool(_SLUG.match(text))


def name(text: str, what: str) -> str:
    """``text`` stripped, checked to be 1-80 characters and to give a slug.

    Letters and digits of any script count; the name is kept as written (NFC) for display.

    Raises:
        InvalidRequest: empty, too long, a control character, or no letter or digit in it.
    """
    stripped = unicodedata.normalize("NFC", " ".join(text.split()))
    if not stripped or len(stripped) > NAME_MAX:
        raise InvalidRequest(f"{what} must be 1-{NAME_MAX} characters; got {len(stripped)}")
    if any(unicodedata.category(ch) == "Cc" for ch in stripped):
        raise InvalidRequest(f"{what} {text!r} holds a control character: resend it without")
    if not slugify(stripped):
        raise InvalidRequest(f"{what} {text!r} holds no letter or digit: resend a name with some")
    return stripped


def is_index(page: str) -> bool:
    """Whether ``page`` names the index (``MEMORY.md``, ``memory``, any case)."""
    stem = page.strip()
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    return stem.strip().lower() == "memory"


def _stem(page: str) -> str:
    stem = page.strip()
    if stem.lower().endswith(".md"):
        stem = stem[:-3]
    return stem


def page_file(page: str) -> str:
    """The file of ``page`` (``notes.md``, ``notes`` or ``"My notes"`` → ``my-notes.md``;
    ``"日記"`` → ``日記.md``).

    Raises:
        InvalidRequest: no letter or digit, or the index's name.
    """
    stem = _stem(page)
    slug = slugify(stem)
    if not slug:
        raise InvalidRequest(f"page {page!r} gives no file name: resend a name with letters")
    if slug == "memory":
        raise InvalidRequest(
            f"{INDEX_FILE} is the index, kept by Loki itself: write a page with another name"
        )
    return f"{slug}.md"


def legacy_page_file(page: str) -> str | None:
    """The file a page of this name had before Unicode slugs, when it differs from
    :func:`page_file`'s (None otherwise, or when it would be no page)."""
    slug = legacy_slug(_stem(page))
    if not slug or slug == "memory" or f"{slug}.md" == page_file(page):
        return None
    return f"{slug}.md"


def legacy_tracker_slug(tracker: str) -> str | None:
    """The slug a tracker of this name had before Unicode slugs, when it differs (else
    None)."""
    slug = legacy_slug(tracker)
    return slug if slug and slug != slugify(tracker) else None


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
