"""The exact text rules of ``recall`` and ``recall_search`` (pure functions, no I/O).

Everything counts Unicode code points. The rules come from the original system (written in
Go), so lower-casing and white space follow Go's ``strings.ToLower`` / ``unicode.IsSpace``,
not Python's ``str.lower`` / ``str.isspace``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from loki_shared.recall_label import ELLIPSIS, GO_SPACE, go_trim

__all__ = [
    "ELLIPSIS",
    "EXCERPT_MAX",
    "LIMIT_DEFAULT",
    "LIMIT_MAX",
    "MAX_SEQ",
    "excerpt",
    "go_lower",
    "go_trim",
    "index_words",
    "keywords",
    "parse_id",
    "parse_limit",
    "quote_id",
    "score",
    "words",
]

#: Largest id accepted: an unsigned 64-bit integer.
MAX_SEQ = 2**64 - 1
LIMIT_DEFAULT = 5
LIMIT_MAX = 20
EXCERPT_MAX = 160

_DIGITS = re.compile(r"[0-9]+")
#: A word: a run of a–z, 0–9 or U+00E0–U+00FF of at least 2 code points. Because runs are
#: maximal (greedy, and the class excludes the separators), this finds exactly the words
#: of the split rule that are long enough.
_WORD = re.compile("[a-z0-9\u00e0-\u00ff]{2,}")
_SPACE_RUN = re.compile("[" + re.escape(GO_SPACE) + "]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def go_lower(text: str) -> str:
    """Lower-case ``text`` code point by code point with the simple case mapping, as Go's
    ``strings.ToLower`` (``unicode.ToLower`` per rune).

    Python's ``str.lower`` applies the full mapping, which differs in exactly two places:
    ``İ`` (U+0130) becomes ``i`` + U+0307 instead of ``i``, and a capital sigma at the end of
    a word becomes ``ς`` instead of ``σ``. Both are mapped first, then ``str.lower`` does the
    rest (every other code point lowers to one code point, the simple mapping).
    """
    if text.isascii():
        return text.lower()
    return text.replace("\u0130", "i").replace("\u03a3", "\u03c3").lower()


def words(lowered: str) -> list[str]:
    """The words (with repeats) of an already lower-cased text: split on every code point
    that is not ``a``–``z``, ``0``–``9`` or U+00E0–U+00FF, keep those of 2+ code points."""
    return _WORD.findall(lowered)


#: Byte table: word bytes (a-z, 0-9, 0xE0-0xFF) kept, every other byte becomes a space.
_WORD_BYTES = bytes(
    b if (0x61 <= b <= 0x7A or 0x30 <= b <= 0x39 or b >= 0xE0) else 0x20 for b in range(256)
)


def index_words(lowered: str) -> set[bytes]:
    """The distinct words of an already lower-cased text, as Latin-1 bytes (fast path of
    :func:`words` for indexing: every word code point is in Latin-1, and any other code point
    is a separator, so it is encoded as ``?`` and then turned into a space with the rest)."""
    raw = lowered.encode("latin-1", "replace").translate(_WORD_BYTES)
    return {w for w in raw.split() if len(w) > 1}


def keywords(query: str) -> set[str]:
    """The keyword set of a ``recall_search`` query: :func:`go_lower`, split, 2+ code points."""
    return set(_WORD.findall(go_lower(query)))


def score(kws: Iterable[str], lowered_label: str, lowered_content: str) -> int:
    """Score of one block: per keyword, +2 when the lower-cased label contains it, +1 when
    the lower-cased content contains it (substrings, not whole words)."""
    total = 0
    for kw in kws:
        if kw in lowered_label:
            total += 2
        if kw in lowered_content:
            total += 1
    return total


def parse_id(value: str) -> int | None:
    """The sequence number named by a ``recall`` id, or None when malformed.

    Tolerance: trim white space; remove one leading ``r``; then one leading ``R``; trim
    again; what remains must be ASCII decimal digits only (no sign; leading zeros allowed)
    and at most 2**64-1. ``"0"`` parses to 0 (which names no block).
    """
    rest = go_trim(value)
    if rest.startswith("r"):
        rest = rest[1:]
    if rest.startswith("R"):
        rest = rest[1:]
    rest = go_trim(rest)
    if not _DIGITS.fullmatch(rest):
        return None
    seq = int(rest)
    return seq if seq <= MAX_SEQ else None


def parse_limit(value: object) -> int:
    """The ``limit`` of ``recall_search``: a JSON number truncated toward zero, 1..20.

    Zero, negative, missing, non-finite, a string, a bool or anything else gives 5; more
    than 20 gives 20.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return LIMIT_DEFAULT
    if isinstance(value, float):
        if not math.isfinite(value):
            return LIMIT_DEFAULT
        value = math.trunc(value)
    if value <= 0:
        return LIMIT_DEFAULT
    return min(value, LIMIT_MAX)


def quote_id(value: str) -> str:
    """``value`` as a JSON string literal (non-ASCII kept as is; a lone surrogate, which
    UTF-8 cannot carry, is written as its ``\\uXXXX`` escape)."""
    quoted = json.dumps(value, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def excerpt(content: str) -> str:
    """One-line excerpt: every run of white space folded to one space, trimmed, and when
    longer than 160 code points cut to 160, trimmed again, then ``…``."""
    folded = _SPACE_RUN.sub(" ", content).strip(" ")
    if len(folded) > EXCERPT_MAX:
        return folded[:EXCERPT_MAX].rstrip(" ") + ELLIPSIS
    return folded
