"""JetStream in a backup: every Loki stream and key-value bucket, message by message.

What is copied: every stream named ``LOKI_*`` (the perf ring ``LOKI_PERF``, the audit events
``LOKI_EVENTS``), and every key-value bucket or object store whose name starts with ``LOKI_``
(streams ``KV_LOKI_*`` / ``OBJ_LOKI_*``: the perf counters' checkpoint ``LOKI_PERF_TOTALS``
today). A bucket is a stream with naming conventions, so one mechanism covers all three: the
stream's configuration, then its stored messages in order (subject, headers, data).

A restore creates each stream with its configuration and publishes the messages again in
order. Sequences restart at 1 in the new stream; the one thing that refers to sequences, the
perf checkpoint, is rewritten for the new stream (:func:`loki_shared.perf_checkpoint.rebind`).
Plain streams are restored before buckets so the rewrite knows the new stream.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from .. import perf_checkpoint, subjects

_BUCKET_PREFIXES = ("KV_", "OBJ_")


class JetStreamBackupError(Exception):
    """The target already holds a Loki stream with messages (a restore never merges)."""


def is_loki_stream(name: str) -> bool:
    """Whether a backup copies the stream ``name`` (see the module docstring)."""
    for prefix in _BUCKET_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name.startswith("LOKI_")


def is_bucket(name: str) -> bool:
    return name.startswith(_BUCKET_PREFIXES)


@dataclass
class StoredMsg:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "subject": self.subject,
            "data": base64.b64encode(self.data).decode("ascii"),
            "headers": self.headers or None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoredMsg:
        return cls(
            int(data["seq"]),
            str(data["subject"]),
            base64.b64decode(data["data"], validate=True),
            data.get("headers") or None,
        )


@dataclass
class StreamCopy:
    """One stream: ``config`` (JetStream's JSON form), ``identity`` (perf checkpoint's
    :func:`~loki_shared.perf_checkpoint.stream_identity`) and its messages in order."""

    name: str
    config: dict[str, Any]
    identity: str = ""
    messages: list[StoredMsg] = field(default_factory=list)


async def snapshot(js: JetStreamContext) -> list[StreamCopy]:
    """Copy every Loki stream and bucket of the JetStream context ``js`` (nats-py).

    Each stream is read up to the last sequence it had when its copy began; records written
    meanwhile are left for the next backup.

    Raises:
        nats.errors.Error: JetStream is unreachable.
    """
    out: list[StreamCopy] = []
    for info in await js.streams_info():
        name = info.config.name
        if name is None or not is_loki_stream(name):
            continue
        copy = StreamCopy(name, info.config.as_dict(), perf_checkpoint.stream_identity(info))
        seq, last = info.state.first_seq, info.state.last_seq
        while info.state.messages and seq <= last:
            try:
                msg = await js.get_msg(name, seq=seq, next=True)
            except nats.js.errors.NotFoundError:
                break
            if msg.seq is None or msg.seq > last:
                break
            copy.messages.append(
                StoredMsg(msg.seq, msg.subject or "", msg.data or b"", msg.headers or None)
            )
            seq = msg.seq + 1
        out.append(copy)
    out.sort(key=lambda c: (is_bucket(c.name), c.name))
    return out


async def ensure_empty(js: JetStreamContext, names: list[str]) -> None:
    """Refuse a target where one of the streams ``names`` already holds messages.

    Raises:
        JetStreamBackupError: such a stream exists and is not empty.
    """
    for name in names:
        try:
            info = await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            continue
        if info.state.messages:
            raise JetStreamBackupError(
                f"the target NATS already holds stream {name} with {info.state.messages} "
                "messages: restore only into an empty store"
            )


async def load(js: JetStreamContext, copies: list[StreamCopy]) -> None:
    """Create each stream of ``copies`` (plain streams first) and publish its messages.

    Raises:
        nats.errors.Error: JetStream refused a stream or a message.
    """
    restored: dict[str, tuple[str, list[int], str]] = {}
    for copy in sorted(copies, key=lambda c: (is_bucket(c.name), c.name)):
        config = StreamConfig.from_response(dict(copy.config))
        try:
            await js.add_stream(config=config)
        except nats.js.errors.BadRequestError:
            # Created meanwhile by a service with its own configuration (empty: checked
            # before): keep it as it is.
            pass
        info = await js.stream_info(copy.name)
        for msg in copy.messages:
            data = _fixup(copy.name, msg, restored)
            await js.publish(msg.subject, data, stream=copy.name, headers=msg.headers)
        restored[copy.name] = (
            perf_checkpoint.stream_identity(info),
            [m.seq for m in copy.messages],
            copy.identity,
        )


def _fixup(stream: str, msg: StoredMsg, restored: dict[str, tuple[str, list[int], str]]) -> bytes:
    """The data to publish for ``msg``: as stored, except the perf checkpoint, rebound to the
    restored ``LOKI_PERF`` stream (see :func:`loki_shared.perf_checkpoint.rebind`)."""
    checkpoint_subject = f"$KV.{subjects.KV_PERF_TOTALS}.{perf_checkpoint.CHECKPOINT_KEY}"
    if stream != f"KV_{subjects.KV_PERF_TOTALS}" or msg.subject != checkpoint_subject:
        return msg.data
    if not msg.data or subjects.STREAM_PERF not in restored:
        return msg.data
    new_identity, old_seqs, old_identity = restored[subjects.STREAM_PERF]
    try:
        counted_identity, _ = perf_checkpoint.decode(msg.data)
    except perf_checkpoint.CheckpointError:
        return msg.data
    if counted_identity != old_identity:
        # A checkpoint the perf service would not have used either: leave it unusable.
        return msg.data
    return perf_checkpoint.rebind(msg.data, new_identity, old_seqs)
