"""Canonical JSON: the one serialisation used for request bodies and fingerprints.

Keys sorted, no insignificant white space, UTF-8 (no ``\\u`` escapes for non-ASCII), so the
same value always gives the same bytes — the basis of llama.cpp prompt-cache reuse.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Return ``value`` as canonical JSON bytes.

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
        ValueError: ``value`` holds NaN or an infinity (not JSON).
    """
    return json.dumps(
        value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
    ).encode("utf-8")
