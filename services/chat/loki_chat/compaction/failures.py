"""What a conversation remembers of its failed summaries, so that none is asked twice.

A summary request is built from the torso being summarised (the messages before the cut):
the transcript path renders it, the continuation path names the same boundary. The
fingerprint of a failed summary is therefore the torso's (every message as stored, with its
``loki`` marks, in order) together with the summary budget; a torso whose summary failed
once is never sent for summarising again, on either path — whatever ids its big blocks
would get if they were archived again (issue 26: "a summary request identical to one that
already failed is never sent again").

The hold-off after a failure (no new try before the context grows 10% more, except at 90% of
the window; forgotten when the context drops) is the seeds' refusal hold-off, shared with the
refusal for lack of reduction: :attr:`~.state.ConvState.refused_at` and
:func:`~.decide.decide`.

In memory only, per chat instance: a restart forgets it (one more try at most).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

from loki_shared.canonical import canonical_json
from loki_shared.messages.chat import ChatMessage

#: Fingerprints remembered per conversation (the oldest forgotten first).
MAX_REMEMBERED = 64


def torso_fingerprint(torso: Iterable[ChatMessage], budget: int) -> str:
    """The fingerprint of a summary of ``torso`` with ``budget`` tokens: 32 hex characters
    (SHA-256 of the canonical JSON of each message, ``exclude_none``, in order, and of the
    budget). ``reasoning_content`` is left out (never sent to the summariser)."""
    h = hashlib.sha256(f"budget={budget}\n".encode())
    for message in torso:
        dumped = message.model_dump(exclude_none=True, exclude={"reasoning_content"})
        h.update(canonical_json(dumped))
        h.update(b"\n")
    return h.hexdigest()[:32]


class FailedSummaries:
    """The fingerprints of one conversation's failed summaries (at most
    :data:`MAX_REMEMBERED`, the oldest forgotten first), each with the context size
    (tokens) at which it failed."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()

    def remember(self, fingerprint: str, ctx_used: int) -> None:
        """Remember that the summary ``fingerprint`` failed with ``ctx_used`` tokens."""
        self._seen[fingerprint] = ctx_used
        self._seen.move_to_end(fingerprint)
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)

    def failed(self, fingerprint: str) -> bool:
        """Whether the summary ``fingerprint`` already failed (then it is never sent again)."""
        return fingerprint in self._seen

    def __len__(self) -> int:
        return len(self._seen)
