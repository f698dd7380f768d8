"""What a streamed choice carried besides the fields an assembler knows, merged in order.

A non-streamed answer built from a stream (the gateway's ``/v1`` assembly) must keep every
per-choice field the stream carried, not only the ones it reads (``logprobs.content`` of
llama-server's chunks, a field a newer engine adds): dropping them is how assembled answers
lose data (Floway #481, mlx-lm PR #1630). :class:`FieldMerger` keeps them, fragment after
fragment:

- a list is appended to the list so far (``logprobs.content``: one entry per token, in
  order);
- an object is merged key by key with the same rules;
- a string is appended to the string so far when ``join_text`` (delta fields: text comes in
  pieces, as ``content`` does), else replaces it (choice fields: a value, not a piece);
- ``null`` never replaces a value, but a key only ever seen as ``null`` stays (llama-server
  sends ``"logprobs": null`` on a legacy completion that did not ask for them, as OpenAI
  answers);
- any other value replaces the one so far (last wins).

Keys keep the order they were first seen in.
"""

from __future__ import annotations

import copy
from typing import Any


def merge(old: Any, new: Any, join_text: bool) -> Any:
    """``new`` (a later fragment's value) merged into ``old`` (the value so far) by the
    module's rules; returns the merged value (``old`` may be modified in place)."""
    if new is None:
        return old
    if old is None:
        return copy.deepcopy(new)
    if isinstance(old, list) and isinstance(new, list):
        old.extend(copy.deepcopy(new))
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in new.items():
            old[key] = merge(old.get(key), value, join_text)
        return old
    if join_text and isinstance(old, str) and isinstance(new, str):
        return old + new
    return copy.deepcopy(new)


class FieldMerger:
    """The fields of one streamed object (a choice, or a choice's ``delta``) that are not in
    ``known``, merged across its fragments (see the module docstring).

    Args:
        known: the keys the caller assembles itself (skipped here).
        join_text: strings are pieces to join (delta fields), not values (choice fields).
    """

    __slots__ = ("_fields", "join_text", "known")

    def __init__(self, known: frozenset[str] | set[str], join_text: bool) -> None:
        self.known = frozenset(known)
        self.join_text = join_text
        self._fields: dict[str, Any] = {}

    def take(self, fragment: Any) -> None:
        """Merge one fragment (anything but an object is ignored)."""
        if not isinstance(fragment, dict):
            return
        for key, value in fragment.items():
            if key in self.known:
                continue
            self._fields[key] = merge(self._fields.get(key), value, self.join_text)

    def fields(self) -> dict[str, Any]:
        """The merged fields, in the order first seen."""
        return dict(self._fields)


__all__ = ["FieldMerger", "merge"]
