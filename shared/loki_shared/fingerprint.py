"""Cumulative fingerprints of the messages of a request.

``fingerprints(messages)[i] = sha256(fingerprints[i-1] || canonical_json(messages[i]))``
(hex, first 16 bytes), with an empty seed before message 0. Two requests whose fingerprint
lists share a prefix of length k sent the same first k messages, byte for byte, so a perf
record can tell where a prompt first diverged without carrying any text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from .canonical import canonical_json


def fingerprints(messages: Iterable[Any]) -> list[str]:
    """Return the cumulative fingerprint of each message (32 hex characters each).

    ``messages`` are the JSON objects actually sent (dicts); pydantic models are dumped
    with ``exclude_none``.
    """
    out: list[str] = []
    prev = b""
    for message in messages:
        if hasattr(message, "model_dump"):
            message = message.model_dump(exclude_none=True)
        digest = hashlib.sha256(prev + canonical_json(message)).digest()[:16]
        out.append(digest.hex())
        prev = digest
    return out


def tools_fingerprint(tools: list[Any] | None) -> str:
    """The fingerprint of a request's ``tools`` array (32 hex characters; ``""`` when the
    request offered none): two requests with equal fingerprints offered the same tools in the
    same order, so their prompt prefixes agree on them (issue 42: the perf cause ``tools``)."""
    if not tools:
        return ""
    return hashlib.sha256(canonical_json(tools)).digest()[:16].hex()


def common_prefix(a: list[str], b: list[str]) -> int:
    """Number of leading fingerprints ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
