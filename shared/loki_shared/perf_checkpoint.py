"""The perf metrics checkpoint: its key, its JSON shape, and how a restored stream rebinds it.

The perf service keeps its Prometheus counters as a checkpoint in the JetStream key-value
bucket ``LOKI_PERF_TOTALS`` (key :data:`CHECKPOINT_KEY`)::

    {"stream": "<identity of the LOKI_PERF stream>", "totals": {"v": 1, "seq": N, ...}}

``totals.seq`` is the sequence, in that stream, of the last record counted, and ``stream``
names the stream those sequences belong to (:func:`stream_identity`: its creation time), so a
checkpoint is never applied to a stream that was recreated (whose sequences start again).

A backup restores the stream into a new one (new identity, records renumbered from 1), so
:func:`rebind` rewrites the checkpoint for it. The shape lives here, once, because both the
perf service and the backup read it.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from typing import Any

CHECKPOINT_KEY = "totals"


class CheckpointError(ValueError):
    """The checkpoint is not a JSON object with ``stream`` and a version-1 ``totals``."""


def stream_identity(info: Any) -> str:
    """The identity of a stream (a nats-py ``StreamInfo``): its creation time, ISO 8601."""
    return info.created.isoformat() if getattr(info, "created", None) else ""


def encode(stream_id: str, totals: dict[str, Any]) -> bytes:
    """The checkpoint value for ``totals`` (the perf ``Totals.dump()`` dict) in ``stream_id``."""
    return json.dumps({"stream": stream_id, "totals": totals}, separators=(",", ":")).encode()


def decode(raw: bytes) -> tuple[str, dict[str, Any]]:
    """``(stream identity, totals dict)`` of a checkpoint value.

    Raises:
        CheckpointError: not a checkpoint of this shape.
    """
    try:
        data = json.loads(raw)
        stream_id = data.get("stream", "")
        totals = data["totals"]
        if not isinstance(totals, dict) or totals.get("v") != 1 or not isinstance(stream_id, str):
            raise CheckpointError("not a version-1 perf checkpoint")
        int(totals["seq"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"unreadable perf checkpoint: {exc}") from exc
    return stream_id, totals


def rebind(raw: bytes, stream_id: str, old_seqs: list[int]) -> bytes:
    """Rewrite a checkpoint for the same records restored into a new stream.

    Args:
        raw: the checkpoint value as backed up.
        stream_id: the restored stream's :func:`stream_identity`.
        old_seqs: the backed-up records' sequences in the old stream, ascending; the record
            at ``old_seqs[i]`` is now at sequence ``i + 1``.

    Returns:
        The checkpoint whose ``seq`` is the new sequence of the last restored record it had
        counted (0 when it had counted none of them), so the perf service counts exactly the
        restored records the checkpoint did not include.

    Raises:
        CheckpointError: ``raw`` is not a checkpoint.
    """
    _, totals = decode(raw)
    totals = dict(totals)
    totals["seq"] = bisect_right(old_seqs, int(totals["seq"]))
    return encode(stream_id, totals)
