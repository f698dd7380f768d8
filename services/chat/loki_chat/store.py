"""Conversations in Redis: a head, the messages and the display log of each, one owner at a
time, and writes proportional to what changed.

Keys (values sealed with :mod:`loki_shared.sealing`; the AAD of each value is named):

- ``loki:chat:conv:<id>`` — the head (seq, queue, meter, title, project...: small and bounded;
  :meth:`~loki_chat.conversation.Conversation.to_head`), AAD = the key;
- ``loki:chat:msgs:<id>`` — list, one model-view message per element, AAD = ``<key>:<index>``
  (a persist rewrites from the first message that changed: usually it only appends; a
  compaction of the model view rewrites it, and the view is bounded by the context window);
- ``loki:chat:log:<id>`` — list, one chunk of display events per element, appended once per
  persist with the events logged since the last one: ``<first seq>-<last seq>|<sealed JSON
  list>``, AAD = ``<key>:<first>-<last>`` (a chunk cannot be moved to another conversation or
  another place unnoticed). A log compaction (:meth:`Conversation.compact_log`) rewrites the
  chunks from the first merged event on, a reset all of them;
- ``loki:chat:index`` — hash ``id -> {id, title, created, updated}`` (sealed);
- ``loki:chat:lock:<id>`` — the owner: ``"<instance>|<fencing token>"``, with an expiry
  (``lock_ttl_s``), renewed by the owner;
- ``loki:chat:fence:<id>`` — the fencing-token counter (INCR on every acquisition);
- ``loki:chat:seq:<id>`` — the highest seq the owner may have published live (reserved ahead
  in blocks, before publishing): after a crash mid-turn, the next owner continues after it,
  so a seq seen live but never persisted is never given to another event.

Every write is a Lua script that first checks the lock still holds this owner's exact value
(instance and token): an instance whose lock expired and was taken over by another can no
longer write, even if it still believes it owns the conversation. The head, the message and
log changes and the index entry of one persist are written by one script: all or nothing.

A version-1 conversation (one blob holding everything, before the lists) is read as it is and
rewritten in the new layout by its owner's first persist (:meth:`Store.load` marks it).

Encoding (JSON of the messages and new events, sealing) and decoding run in a worker thread
(:func:`asyncio.to_thread`): another conversation's turn on the same instance never waits for
a long conversation's write or load.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from loki_shared import recall_purge
from loki_shared.messages.chat import ChatEvent, ChatMessage
from loki_shared.sealing import Sealer, SealError

from .conversation import Conversation, Persisted
from .errors import FencedWrite

PREFIX = "loki:chat"
INDEX = f"{PREFIX}:index"
#: :meth:`Store.load`'s ``log_after`` for a read that needs none of the display log.
NO_LOG = sys.maxsize

# KEYS: lock, head, index, msgs, log. ARGV: lock value, head, id, info, messages kept (-1:
# all, append only), messages to append (n), log chunks kept (-1: all), the n messages, then
# the log chunks to append (none, one or two).
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
local keep_m = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local keep_l = tonumber(ARGV[7])
if keep_m == 0 then redis.call('DEL', KEYS[4])
elseif keep_m > 0 then redis.call('LTRIM', KEYS[4], 0, keep_m - 1) end
for i = 1, n do redis.call('RPUSH', KEYS[4], ARGV[7 + i]) end
if keep_l == 0 then redis.call('DEL', KEYS[5])
elseif keep_l > 0 then redis.call('LTRIM', KEYS[5], 0, keep_l - 1) end
for i = 8 + n, #ARGV do redis.call('RPUSH', KEYS[5], ARGV[i]) end
return 1
"""
_DELETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[1])
redis.call('SADD', KEYS[5], ARGV[3])
redis.call('SADD', KEYS[6], ARGV[3])
redis.call('DEL', KEYS[7])
redis.call('DEL', KEYS[8])
return 1
"""
_RESERVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
"""
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


def conv_key(cid: str) -> str:
    return f"{PREFIX}:conv:{cid}"


def msgs_key(cid: str) -> str:
    return f"{PREFIX}:msgs:{cid}"


def log_key(cid: str) -> str:
    return f"{PREFIX}:log:{cid}"


def lock_key(cid: str) -> str:
    return f"{PREFIX}:lock:{cid}"


def fence_key(cid: str) -> str:
    return f"{PREFIX}:fence:{cid}"


def seq_key(cid: str) -> str:
    return f"{PREFIX}:seq:{cid}"


def new_conversation_id() -> str:
    """A fresh id (32 hex characters: a valid NATS subject token)."""
    return uuid.uuid4().hex


@dataclass
class _Write:
    """One persist, planned on the event loop and encoded in a worker thread."""

    head: dict
    messages: list[ChatMessage]
    stored_messages: list[str]
    keep_chunks: int  # -1: append only
    events: list[ChatEvent]
    rewrite_from: int | None
    compacted: int  # events up to this seq are final: a chunk never mixes them with others
    # filled by the encoding
    message_json: list[str] = field(default_factory=list)
    args: list[bytes | str | int] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)


class Store:
    """Sealed conversations (head, messages, display log) and ownership locks.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        sealer: the service sealer.
        instance: this instance's id (written in lock values).
        lock_ttl_s: lock expiry in seconds.
    """

    def __init__(
        self, client: aioredis.Redis, sealer: Sealer, instance: str, lock_ttl_s: float
    ) -> None:
        self.r = client
        self.sealer = sealer
        self.instance = instance
        self.ttl_ms = int(lock_ttl_s * 1000)
        self._write = client.register_script(_WRITE)
        self._delete = client.register_script(_DELETE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._reserve = client.register_script(_RESERVE)

    # -- locks ------------------------------------------------------------------------------
    async def try_acquire(self, cid: str) -> str | None:
        """Take the lock of ``cid`` if free; return the lock value (with a new fencing
        token) or None when another owner holds it."""
        token = await self.r.incr(fence_key(cid))
        value = f"{self.instance}|{token}"
        ok = await self.r.set(lock_key(cid), value, nx=True, px=self.ttl_ms)
        return value if ok else None

    async def owner(self, cid: str) -> str | None:
        """The instance holding ``cid``'s lock, or None."""
        raw = await self.r.get(lock_key(cid))
        if raw is None:
            return None
        return raw.decode().split("|", 1)[0]

    async def renew(self, cid: str, value: str) -> bool:
        return bool(await self._renew(keys=[lock_key(cid)], args=[value, self.ttl_ms]))

    async def release(self, cid: str, value: str) -> bool:
        return bool(await self._release(keys=[lock_key(cid)], args=[value]))

    # -- conversations ----------------------------------------------------------------------
    async def load(self, cid: str, log_after: int | None = None) -> Conversation | None:
        """The stored conversation, or None when absent (head, messages and log read in one
        MULTI transaction; opened and parsed in a worker thread).

        ``log_after``: None, the whole display log; a seq, only the log's chunks that hold
        events after it are opened (:data:`NO_LOG`: none) — a read that needs no older event
        (a replay after a seq, the state) costs what is new, not the conversation's age. Such
        a conversation is ``persisted.partial``: :meth:`save` refuses it.

        Raises:
            loki_shared.sealing.SealError: a value does not open with this key (or was moved).
            ValueError: a stored value is not what this layout writes.
        """
        pipe = self.r.pipeline(transaction=True)
        pipe.get(conv_key(cid))
        pipe.lrange(msgs_key(cid), 0, -1)
        pipe.lrange(log_key(cid), 0, -1)
        head, msgs, chunks = await pipe.execute()
        if head is None:
            return None
        return await asyncio.to_thread(self._decode, cid, head, msgs, chunks, log_after)

    def _decode(
        self,
        cid: str,
        head: bytes,
        msgs: list[bytes],
        chunks: list[bytes],
        log_after: int | None = None,
    ) -> Conversation:
        key = conv_key(cid)
        data = json.loads(self.sealer.open(head, key.encode()))
        if data.get("v", 1) < 2:  # one blob with everything: the owner's next persist rewrites it
            conv = Conversation.from_blob(data)
            conv.persisted = Persisted(rewrite_from=0, legacy=True)
            return conv
        conv = Conversation.from_blob(data)
        mkey = msgs_key(cid)
        texts = [self.sealer.open(m, f"{mkey}:{i}".encode()).decode() for i, m in enumerate(msgs)]
        conv.messages = [ChatMessage.model_validate_json(t) for t in texts]
        lkey = log_key(cid)
        stored: list[tuple[int, int]] = []
        for raw in chunks:
            label, _, sealed = raw.partition(b"|")
            first_s, _, last_s = label.decode().partition("-")
            first, last = int(first_s), int(last_s)
            if stored and first <= stored[-1][1]:
                raise ValueError(f"log chunk {first}-{last} of {cid} is out of order")
            stored.append((first, last))
            if log_after is not None and last <= log_after:
                continue  # nothing after log_after in it: not opened
            events = json.loads(self.sealer.open(sealed, f"{lkey}:{first}-{last}".encode()))
            conv.log.extend(ChatEvent.model_validate(e) for e in events)
        conv.persisted = Persisted(messages=texts, chunks=stored, partial=log_after is not None)
        return conv

    async def save(self, conv: Conversation, lock_value: str) -> None:
        """Write what changed since the last save, atomically, only while ``lock_value``
        still holds the lock: the head, the messages from the first that changed, the
        display events logged since (one chunk; from ``rewrite_from`` after a compaction or
        a reset), and the index entry.

        Raises:
            FencedWrite: the lock is no longer this owner's (nothing was written).
        """
        done = conv.persisted
        if done.partial:
            raise ValueError(f"conversation {conv.id} was read without its whole log: not saved")
        rewrite = done.rewrite_from
        if rewrite is None:
            keep = -1
            after = done.last_seq
        else:
            kept = [c for c in done.chunks if c[1] < rewrite]
            keep = len(kept)
            after = kept[-1][1] if kept else 0
        start = len(conv.log)
        while start > 0 and conv.log[start - 1].seq > after:
            start -= 1
        plan = _Write(
            head=conv.to_head(),
            messages=list(conv.messages),
            stored_messages=done.messages,
            keep_chunks=keep,
            events=conv.log[start:],
            rewrite_from=rewrite,
            compacted=conv.log_compacted,
        )
        info = conv.info()
        await asyncio.to_thread(self._encode, conv.id, plan, info)
        ok = await self._write(
            keys=[lock_key(conv.id), conv_key(conv.id), INDEX, msgs_key(conv.id), log_key(conv.id)],
            args=[lock_value, *plan.args],
        )
        if not ok:
            raise FencedWrite(f"lock of {conv.id} lost; write refused")
        done.messages = plan.message_json
        if keep >= 0:
            done.chunks = done.chunks[:keep]
        done.chunks.extend(plan.chunks)
        if done.rewrite_from == rewrite:  # not marked again while this write ran
            done.rewrite_from = None
        done.legacy = False

    def _encode(self, cid: str, plan: _Write, info: dict) -> None:
        """JSON and seals of one write (a worker thread): fills ``plan.args``."""
        key = conv_key(cid)
        head = self.sealer.seal(json.dumps(plan.head, ensure_ascii=False).encode(), key.encode())
        sealed_info = self.sealer.seal(json.dumps(info).encode(), f"{INDEX}:{cid}".encode())
        texts = [
            json.dumps(m.model_dump(exclude_none=True), ensure_ascii=False) for m in plan.messages
        ]
        stored = plan.stored_messages
        same = 0
        while same < min(len(texts), len(stored)) and texts[same] == stored[same]:
            same += 1
        keep_m = -1 if same == len(stored) else same
        mkey = msgs_key(cid)
        new = [
            self.sealer.seal(texts[i].encode(), f"{mkey}:{i}".encode())
            for i in range(same, len(texts))
        ]
        args: list[bytes | str | int] = [head, cid, sealed_info, keep_m, len(new), plan.keep_chunks]
        args.extend(new)
        # compacted events and fresh ones go to separate chunks: the next compaction then
        # rewrites only the fresh ones
        final = [e for e in plan.events if e.seq <= plan.compacted]
        fresh = plan.events[len(final) :]
        for part in (final, fresh):
            if not part:
                continue
            first, last = part[0].seq, part[-1].seq
            body = json.dumps(
                [e.model_dump(exclude_none=True) for e in part], ensure_ascii=False
            ).encode()
            label = f"{first}-{last}"
            sealed = self.sealer.seal(body, f"{log_key(cid)}:{label}".encode())
            args.append(label.encode() + b"|" + sealed)
            plan.chunks.append((first, last))
        plan.message_json = texts
        plan.args = args

    async def delete(self, cid: str, lock_value: str) -> None:
        """Remove the head, the messages, the log, the index entry and the lock, and record
        (same atomic script)
        that the recall service must delete the blocks it archived
        (:mod:`loki_shared.recall_purge`).

        Raises:
            FencedWrite: the lock is no longer this owner's.
        """
        ok = await self._delete(
            keys=[
                lock_key(cid),
                conv_key(cid),
                INDEX,
                seq_key(cid),
                recall_purge.PURGE_KEY,
                recall_purge.GONE_KEY,
                msgs_key(cid),
                log_key(cid),
            ],
            args=[lock_value, cid, recall_purge.member(conversation=cid)],
        )
        if not ok:
            raise FencedWrite(f"lock of {cid} lost; delete refused")

    async def reserve_seq(self, cid: str, lock_value: str, upto: int) -> None:
        """Record that seqs up to ``upto`` may be published live (fenced like a write).

        Raises:
            FencedWrite: the lock is no longer this owner's.
        """
        ok = await self._reserve(keys=[lock_key(cid), seq_key(cid)], args=[lock_value, upto])
        if not ok:
            raise FencedWrite(f"lock of {cid} lost; seq reservation refused")

    async def reserved_seq(self, cid: str) -> int:
        """The highest seq a previous owner may have published (0 when none)."""
        raw = await self.r.get(seq_key(cid))
        return int(raw) if raw else 0

    async def list_infos(self) -> list[dict]:
        """Index entries (newest first); unreadable ones are skipped."""
        raw = await self.r.hgetall(INDEX)
        out = []
        for cid, blob in raw.items():
            cid_s = cid.decode()
            try:
                out.append(json.loads(self.sealer.open(blob, f"{INDEX}:{cid_s}".encode())))
            except (SealError, ValueError):  # sealed with another key, or not our JSON
                continue
        out.sort(key=lambda d: d.get("updated", 0), reverse=True)
        return out
