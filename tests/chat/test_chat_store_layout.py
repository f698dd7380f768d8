"""The conversation store's layout (issue 37): writes proportional to what changed, the log
compacted turn by turn, version-1 blobs migrated, everything deleted, nothing on the loop.

Real Redis; the conversations are built in memory (no engine needed: what is under test is
what a persist writes and what a load reads back)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import redis.asyncio as aioredis

from loki_chat.conversation import Conversation
from loki_chat.store import INDEX, NO_LOG, Store, conv_key, log_key, msgs_key
from loki_shared.messages.chat import ChatMessage
from loki_shared.sealing import SealError, service_sealer
from tests.chat.helpers import SECRET


def add_turn(conv: Conversation, n: int, deltas: int = 300) -> None:
    """One turn as the actor logs it: the user event, ``deltas`` content deltas, the end."""
    text = f"question {n}"
    conv.messages.append(ChatMessage(role="user", content=text))
    conv.new_event({"role": "user", "content": text}, loki={"event": "user"})
    conv.new_event({"role": "assistant", "content": ""})
    for i in range(deltas):
        conv.new_event({"content": f"w{i} "})
    conv.messages.append(
        ChatMessage(role="assistant", content="".join(f"w{i} " for i in range(deltas)))
    )
    conv.new_event({}, finish_reason="stop", loki={"event": "turn_end", "steps": 1})


@pytest.fixture
async def store(redis_db, tmp_path):
    client = aioredis.Redis.from_url(redis_db)
    yield Store(client, service_sealer(tmp_path, SECRET), "i1", lock_ttl_s=30)
    await client.aclose()


class Recorder:
    """Wraps the store's write script and records the bytes each call sends."""

    def __init__(self, store: Store) -> None:
        self.sizes: list[int] = []
        real = store._write

        async def write(keys, args):
            self.sizes.append(sum(len(a) if isinstance(a, bytes | str) else 8 for a in args))
            return await real(keys=keys, args=args)

        store._write = write


async def long_conversation(store: Store, cid: str, turns: int) -> tuple[Conversation, str]:
    lock = await store.try_acquire(cid)
    conv = Conversation(id=cid)
    for n in range(turns):
        conv.compact_log()  # what the actor does when a turn starts
        add_turn(conv, n)
        await store.save(conv, lock)
    return conv, lock


async def test_a_persist_writes_what_changed_not_the_conversation(store):
    """The same turn added to a 5-turn and to a 150-turn conversation sends the same number
    of bytes, within a few percent (the head's numbers grow by a few digits)."""
    sizes = {}
    for turns in (5, 150):
        conv, lock = await long_conversation(store, f"c{turns}", turns)
        rec = Recorder(store)
        conv.compact_log()
        add_turn(conv, turns)
        await store.save(conv, lock)
        sizes[turns] = rec.sizes[-1]
    assert sizes[150] < sizes[5] * 1.05, sizes
    # and a persist with nothing new sends only the head and the index entry
    rec = Recorder(store)
    await store.save(conv, lock)
    assert rec.sizes[-1] < 2_000, rec.sizes


async def test_finished_turns_are_compacted_and_load_back_the_same(store):
    conv, lock = await long_conversation(store, "c", 3)
    raw_chunks = await store.r.lrange(log_key("c"), 0, -1)
    assert len(raw_chunks) == 3  # turn 1 and 2 merged into one chunk each, turn 3 as logged
    back = await store.load("c")
    assert back is not None
    assert [m.model_dump() for m in back.messages] == [m.model_dump() for m in conv.messages]
    assert [e.model_dump() for e in back.log] == [e.model_dump() for e in conv.log]
    # turns 1 and 2: user event, one merged assistant text, the end; turn 3: all 303 events
    assert len(back.log) == 3 + 3 + 303
    merged = back.log[1]
    assert merged.delta["content"].startswith("w0 w1 ") and merged.merged_from == 2
    assert merged.seq == 302  # the last seq it absorbed
    seqs = [e.seq for e in back.log]
    assert seqs == sorted(set(seqs)) and back.seq == 909  # never reused, never reordered
    # resuming inside the merged run: the merged event says where it began
    events, _ = back.events_after(100)
    assert events[0].seq == 302 and events[0].merged_from == 2 <= 100


async def test_a_read_after_a_seq_opens_only_the_chunks_after_it(store, monkeypatch):
    """``load(cid, log_after)``: the chunks whose events all come before ``log_after`` are
    not opened; the events after it are the whole load's; such a conversation is never
    saved (its log is not whole)."""
    conv, lock = await long_conversation(store, "c", 40)
    whole = await store.load("c")
    assert whole is not None
    opened: list[bytes] = []
    real_open = store.sealer.open

    def counting(data: bytes, context: bytes) -> bytes:
        opened.append(context)
        return real_open(data, context)

    monkeypatch.setattr(store.sealer, "open", counting)
    after = whole.log[-5].seq  # inside the last turn's chunk
    tail = await store.load("c", after)
    assert tail is not None and tail.persisted.partial
    log_opened = [c for c in opened if c.startswith(log_key("c").encode())]
    assert len(log_opened) == 1  # the last chunk only, of 40
    assert [e.model_dump() for e in tail.events_after(after)[0]] == [
        e.model_dump() for e in whole.events_after(after)[0]
    ]
    assert tail.seq == whole.seq and len(tail.messages) == len(whole.messages)
    opened.clear()
    bare = await store.load("c", NO_LOG)
    assert bare is not None and bare.log == [] and bare.seq == whole.seq
    assert not [c for c in opened if c.startswith(log_key("c").encode())]
    with pytest.raises(ValueError, match="whole log"):
        await store.save(tail, lock)


async def test_a_version_1_blob_is_migrated_by_its_owner(store):
    """A conversation stored before the lists (one sealed blob with messages and log) loads
    as it was, and its owner's first persist rewrites it in the new layout."""
    old = Conversation(id="old", title="Kept for months")
    add_turn(old, 0, deltas=5)
    blob = old.to_blob()
    blob["v"] = 1
    key = conv_key("old")
    await store.r.set(key, store.sealer.seal(json.dumps(blob).encode(), key.encode()))
    loaded = await store.load("old")
    assert loaded is not None and loaded.persisted.legacy
    assert [e.model_dump() for e in loaded.log] == [e.model_dump() for e in old.log]
    lock = await store.try_acquire("old")
    await store.save(loaded, lock)
    head = json.loads(store.sealer.open(await store.r.get(key), key.encode()))
    assert head["v"] == 2 and "log" not in head and "messages" not in head
    assert await store.r.llen(msgs_key("old")) == 2 and await store.r.llen(log_key("old")) == 1
    again = await store.load("old")
    assert again.title == "Kept for months" and not again.persisted.legacy
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in old.messages]
    assert [e.model_dump() for e in again.log] == [e.model_dump() for e in old.log]


async def test_a_reset_rewrites_the_log_and_delete_removes_every_key(store):
    conv, lock = await long_conversation(store, "c", 2)
    conv.messages.clear()
    conv.clear_log()
    conv.new_event({}, loki={"event": "reset"})
    await store.save(conv, lock)
    back = await store.load("c")
    assert back.messages == [] and [e.loki for e in back.log] == [{"event": "reset"}]
    assert back.log[0].seq == conv.seq == 607  # seq goes on after a reset
    await store.delete("c", lock)
    for key in (conv_key("c"), msgs_key("c"), log_key("c")):
        assert not await store.r.exists(key), key
    assert not await store.r.hexists(INDEX, "c")


async def test_a_chunk_moved_to_another_conversation_does_not_open(store):
    await long_conversation(store, "a", 1)
    await long_conversation(store, "b", 1)
    chunk = (await store.r.lrange(log_key("a"), 0, -1))[0]
    await store.r.rpush(log_key("b"), chunk.replace(b"1-303|", b"304-606|", 1))
    with pytest.raises(SealError):
        await store.load("b")


async def test_a_message_moved_inside_the_list_does_not_open(store):
    await long_conversation(store, "a", 1)
    first, second = await store.r.lrange(msgs_key("a"), 0, -1)
    await store.r.delete(msgs_key("a"))
    await store.r.rpush(msgs_key("a"), second, first)
    with pytest.raises(SealError):
        await store.load("a")


async def test_sealing_and_parsing_run_off_the_event_loop(store, monkeypatch):
    """JSON and AES-GCM of a persist and a load run in a worker thread: the loop's thread
    never seals or opens (another conversation's turn is not held up by a long one's)."""
    conv, lock = await long_conversation(store, "c", 2)
    loop_thread = threading.current_thread()
    threads: set[threading.Thread] = set()
    seal, open_ = store.sealer.seal, store.sealer.open

    def seal_spy(*a, **kw):
        threads.add(threading.current_thread())
        return seal(*a, **kw)

    def open_spy(*a, **kw):
        threads.add(threading.current_thread())
        return open_(*a, **kw)

    monkeypatch.setattr(store.sealer, "seal", seal_spy)
    monkeypatch.setattr(store.sealer, "open", open_spy)
    conv.compact_log()
    add_turn(conv, 2)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await store.save(conv, lock)
    await store.load("c")
    task.cancel()
    assert threads and loop_thread not in threads
