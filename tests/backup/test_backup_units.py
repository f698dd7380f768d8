"""Backup and restore, part by part, on real Redis and NATS servers (no engine):
the sealed file, the Redis copy, the JetStream copy with the perf checkpoint, LOKI_HOME, and a
whole backup restored into an empty target — or refused by a target that is not empty."""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis
from nats.js.api import KeyValueConfig

from loki_shared import perf_checkpoint, subjects
from loki_shared.backup import (
    BackupError,
    Target,
    create_backup,
    home_part,
    jetstream_part,
    read_backup,
    redis_part,
    restore_backup,
)
from loki_shared.backup.sealed_file import (
    CHUNK_BYTES,
    MAGIC,
    BackupFileError,
    SealedReader,
    SealedWriter,
)
from loki_shared.perf_publish import ensure_perf_stream
from tests.conftest import start_nats

PASS = "correct horse battery staple"
FAST_N = 2**10  # scrypt cost for tests; the header records it


# --- the sealed file --------------------------------------------------------------------------
def seal(payload: bytes, passphrase: str = PASS) -> bytes:
    out = io.BytesIO()
    with SealedWriter(out, passphrase, scrypt_n=FAST_N) as w:
        w.write(payload)
    return out.getvalue()


def unseal(blob: bytes, passphrase: str = PASS) -> bytes:
    return io.BufferedReader(SealedReader(io.BytesIO(blob), passphrase)).read()


def test_sealed_file_round_trips_across_chunks_and_hides_the_payload():
    payload = os.urandom(100) + b"secret.key material " * 200_000  # over 3 chunks
    blob = seal(payload)
    assert len(payload) > 3 * CHUNK_BYTES
    assert blob.startswith(MAGIC)
    assert b"secret.key material" not in blob
    assert unseal(blob) == payload
    assert unseal(seal(b"")) == b""


def test_sealed_file_refuses_wrong_passphrase_damage_and_truncation():
    payload = b"x" * (2 * CHUNK_BYTES + 10)
    blob = seal(payload)
    with pytest.raises(BackupFileError, match="wrong passphrase"):
        unseal(blob, "another passphrase!")
    flipped = bytearray(blob)
    flipped[-20] ^= 1
    with pytest.raises(BackupFileError, match="does not open"):
        unseal(bytes(flipped))
    # Cut at the end of a frame: every remaining frame opens, but the last one is missing.
    header_len = int.from_bytes(blob[len(MAGIC) : len(MAGIC) + 4], "big")
    first = len(MAGIC) + 4 + header_len
    frame_len = int.from_bytes(blob[first : first + 4], "big")
    with pytest.raises(BackupFileError, match="truncated"):
        unseal(blob[: first + 4 + frame_len])
    # Two frames swapped.
    second = first + 4 + frame_len
    frame2_len = int.from_bytes(blob[second : second + 4], "big")
    swapped = (
        blob[:first]
        + blob[second : second + 4 + frame2_len]
        + blob[first:second]
        + blob[second + 4 + frame2_len :]
    )
    with pytest.raises(BackupFileError):
        unseal(swapped)
    with pytest.raises(BackupFileError, match="not a Loki backup"):
        unseal(b"PK\x03\x04" + blob)
    with pytest.raises(BackupFileError, match="at least 12"):
        seal(b"data", "short")


# --- Redis ------------------------------------------------------------------------------------
async def fill_redis(client: aioredis.Redis) -> None:
    await client.set(b"loki:chat:conv:a", b"\x01sealed\x00\xffblob")
    await client.hset(b"loki:chat:index", mapping={b"a": b"\x01x", b"b": b"\x02y"})
    await client.rpush(b"loki:test:list", b"one", b"two", b"one")
    await client.sadd(b"loki:test:set", b"p", b"q")
    await client.zadd(b"loki:test:zset", {b"m": 1.5, b"n": -3.25e-7})
    await client.xadd(b"loki:test:stream", {b"f": b"v"}, id=b"5-1")
    await client.set(b"loki:chat:lock:a", b"inst|3", px=60_000)  # runtime state
    await client.set(b"other:key", b"not ours")


async def test_redis_copy_is_every_persistent_loki_key_of_every_type(redis_db: str):
    src = aioredis.Redis.from_url(redis_db)
    dst = aioredis.Redis.from_url(redis_db.rsplit("/", 1)[0] + "/1")
    try:
        await fill_redis(src)
        snap = await redis_part.snapshot(src)
        assert snap.volatile == 1
        names = [k.key for k in snap.keys]
        assert b"other:key" not in names and b"loki:chat:lock:a" not in names
        assert len(names) == 6
        again = [
            redis_part.RedisKey.from_json(json.loads(json.dumps(k.to_json()))) for k in snap.keys
        ]
        await redis_part.ensure_empty(dst)
        await redis_part.load(dst, again)
        assert await dst.get(b"loki:chat:conv:a") == b"\x01sealed\x00\xffblob"
        assert await dst.hgetall(b"loki:chat:index") == {b"a": b"\x01x", b"b": b"\x02y"}
        assert await dst.lrange(b"loki:test:list", 0, -1) == [b"one", b"two", b"one"]
        assert await dst.smembers(b"loki:test:set") == {b"p", b"q"}
        assert await dst.zrange(b"loki:test:zset", 0, -1, withscores=True) == [
            (b"n", -3.25e-7),
            (b"m", 1.5),
        ]
        assert await dst.xrange(b"loki:test:stream") == [(b"5-1", {b"f": b"v"})]
        assert await dst.exists(b"loki:chat:lock:a", b"other:key") == 0
        with pytest.raises(redis_part.RedisBackupError, match="already holds Loki data"):
            await redis_part.ensure_empty(dst)
    finally:
        await dst.flushdb()
        await src.aclose()
        await dst.aclose()


# --- JetStream and the perf checkpoint --------------------------------------------------------
async def fill_jetstream(nc) -> list[bytes]:
    """Five perf records at sequences 3..7 (two purged before them), an audit event, and a
    checkpoint that counted up to sequence 5. Returns the five record payloads."""
    js = nc.jetstream()
    await ensure_perf_stream(js)
    await js.add_stream(name=subjects.STREAM_EVENTS, subjects=["loki.events.>"])
    payloads = [json.dumps({"kind": "main", "n": i}).encode() for i in range(5)]
    # Purge after two records so the kept ones start at sequence 3.
    for p in payloads[:2]:
        await js.publish(subjects.PERF_RECORD, p)
    await js.purge_stream(subjects.STREAM_PERF)
    for i, p in enumerate(payloads):
        await js.publish(subjects.PERF_RECORD, p, headers={"Nats-Msg-Id": f"r{i}"})
    await js.publish(subjects.EVENTS_ARCHIVE, b'{"seq": 1}')
    info = await js.stream_info(subjects.STREAM_PERF)
    kv = await js.create_key_value(config=KeyValueConfig(bucket=subjects.KV_PERF_TOTALS, history=1))
    totals = {"v": 1, "seq": 5, "counters": {}, "hists": {}}  # counted seqs 3, 4, 5
    await kv.put(perf_checkpoint.CHECKPOINT_KEY, b"stale")
    await kv.put(
        perf_checkpoint.CHECKPOINT_KEY,
        perf_checkpoint.encode(perf_checkpoint.stream_identity(info), totals),
    )
    return payloads


async def test_jetstream_copy_restores_streams_buckets_and_rebinds_the_checkpoint(tmp_path):
    a, b = start_nats(tmp_path / "a"), start_nats(tmp_path / "b")
    src = await nats.connect(a.url)
    dst = await nats.connect(b.url)
    try:
        payloads = await fill_jetstream(src)
        await src.jetstream().add_stream(name="OTHER", subjects=["other.>"])
        copies = await jetstream_part.snapshot(src.jetstream())
        names = [c.name for c in copies]
        assert names == [
            subjects.STREAM_EVENTS,
            subjects.STREAM_PERF,
            f"KV_{subjects.KV_PERF_TOTALS}",
        ]
        perf = copies[1]
        assert [m.seq for m in perf.messages] == [3, 4, 5, 6, 7]
        assert [m.data for m in perf.messages] == payloads
        # The bucket keeps one value per key: the stale one is gone.
        assert len(copies[2].messages) == 1

        await jetstream_part.ensure_empty(dst.jetstream(), names)
        await jetstream_part.load(dst.jetstream(), copies)
        js = dst.jetstream()
        info = await js.stream_info(subjects.STREAM_PERF)
        assert info.state.messages == 5 and info.state.first_seq == 1
        assert info.config.max_msgs == subjects.STREAM_PERF_MAX_MSGS
        got = [(await js.get_msg(subjects.STREAM_PERF, seq=s)).data for s in range(1, 6)]
        assert got == payloads
        ev = await js.stream_info(subjects.STREAM_EVENTS)
        assert ev.state.messages == 1
        kv = await js.key_value(subjects.KV_PERF_TOTALS)
        stream_id, totals = perf_checkpoint.decode((await kv.get("totals")).value)
        # The checkpoint now names the new stream; it had counted old seqs 3..5, now 1..3.
        assert stream_id == perf_checkpoint.stream_identity(info)
        assert totals["seq"] == 3
        # The services open the restored stream and bucket as their own (same configuration).
        await ensure_perf_stream(js)
        await js.create_key_value(config=KeyValueConfig(bucket=subjects.KV_PERF_TOTALS, history=1))
        with pytest.raises(jetstream_part.JetStreamBackupError, match="already holds"):
            await jetstream_part.ensure_empty(js, names)
    finally:
        await src.close()
        await dst.close()
        a.process.stop()
        b.process.stop()


def test_rebind_counts_only_restored_records_the_checkpoint_had_counted():
    raw = perf_checkpoint.encode("old", {"v": 1, "seq": 10})
    assert perf_checkpoint.decode(perf_checkpoint.rebind(raw, "new", [8, 9, 10, 11]))[1]["seq"] == 3
    # The checkpoint lagged behind records evicted before the backup: none of the kept ones
    # was counted, all of them will be.
    assert perf_checkpoint.decode(perf_checkpoint.rebind(raw, "n", [20, 21]))[1]["seq"] == 0
    with pytest.raises(perf_checkpoint.CheckpointError):
        perf_checkpoint.rebind(b"stale", "n", [1])


# --- LOKI_HOME --------------------------------------------------------------------------------
def test_home_files_are_data_except_stores_caches_runtime_and_the_key(tmp_path: Path):
    home = tmp_path / "home"
    for rel in (
        "secret.key",
        "redis/appendonlydir/x.aof",
        "nats/jetstream/x",
        "slots/slot0.bin",
        "run/stack.json",
        "run/nats.conf",
        "credentials.json",
        "recall-index.snap",
        "recall-index.snap.12.tmp",
        "old.lokibak",
        "attachments/ab/cd.bin",
        "attachments/credentials.json",  # only the top-level file is the stores' passwords
        "notes.txt",
    ):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(b"data")
    (home / "link").symlink_to(home / "notes.txt")
    assert home_part.data_files(home) == [
        "attachments/ab/cd.bin",
        "attachments/credentials.json",
        "notes.txt",
    ]


def test_target_home_must_hold_no_other_key_nor_other_files(tmp_path: Path):
    key = os.urandom(32)
    home = tmp_path / "home"
    assert home_part.check_target(home, None, key, {"notes.txt": b"a"}) is True
    home_part.write_files(home, {"notes.txt": b"a"}, key)
    assert (home / "secret.key").stat().st_mode & 0o777 == 0o600
    assert home_part.service_key(home, None) == key
    assert home_part.check_target(home, None, key, {"notes.txt": b"a"}) is False
    with pytest.raises(home_part.HomeBackupError, match="exists"):
        home_part.check_target(home, None, key, {"notes.txt": b"b"})
    with pytest.raises(home_part.HomeBackupError, match="another key"):
        home_part.check_target(home, None, os.urandom(32), {})
    env_key = base64.b64encode(key).decode()
    assert home_part.check_target(tmp_path / "empty", env_key, key, {}) is False
    with pytest.raises(home_part.HomeBackupError, match="LOKI_SECRET_KEY"):
        home_part.check_target(tmp_path / "empty", "some other key text", key, {})
    with pytest.raises(home_part.HomeBackupError, match="outside"):
        home_part.check_target(tmp_path / "empty", None, key, {"../x": b""})


# --- a whole backup ---------------------------------------------------------------------------
async def test_backup_restores_into_an_empty_target_and_refuses_a_full_one(
    redis_db: str, tmp_path: Path
):
    a, b = start_nats(tmp_path / "a"), start_nats(tmp_path / "b")
    src_redis = aioredis.Redis.from_url(redis_db)
    dst_url = redis_db.rsplit("/", 1)[0] + "/2"
    dst_redis = aioredis.Redis.from_url(dst_url)
    nc = await nats.connect(a.url)
    try:
        home = tmp_path / "home"
        key = os.urandom(32)
        home_part.write_files(home, {"attachments/a.bin": b"\x00\x01"}, key)
        await fill_redis(src_redis)
        payloads = await fill_jetstream(nc)
        source = Target(redis_db, a.url, home)
        path = tmp_path / "out" / "loki.lokibak"
        path.parent.mkdir()
        summary = await create_backup(path, PASS, source, scrypt_n=FAST_N)
        assert summary.redis_keys == 6 and summary.redis_volatile_skipped == 1
        assert summary.files == ["attachments/a.bin"]
        assert path.stat().st_mode & 0o777 == 0o600
        assert base64.b64encode(key) not in path.read_bytes() and key not in path.read_bytes()
        assert list(path.parent.iterdir()) == [path]
        with pytest.raises(BackupError, match="exists"):
            await create_backup(path, PASS, source, scrypt_n=FAST_N)
        with pytest.raises(BackupError, match="wrong passphrase"):
            read_backup(path, "not the passphrase")

        # A target that is not empty refuses, and nothing is written anywhere.
        fresh = tmp_path / "fresh"
        with pytest.raises(BackupError, match="already holds Loki data.*nothing was restored"):
            await restore_backup(path, PASS, Target(redis_db, b.url, fresh))
        assert not fresh.exists()
        info = await nc.jetstream().stream_info(subjects.STREAM_PERF)
        assert info.state.messages == 5

        done = await restore_backup(path, PASS, Target(dst_url, b.url, fresh))
        assert done.redis_keys == 6
        assert home_part.service_key(fresh, None) == key
        assert (fresh / "attachments/a.bin").read_bytes() == b"\x00\x01"
        assert await dst_redis.get(b"loki:chat:conv:a") == b"\x01sealed\x00\xffblob"
        assert await dst_redis.exists(b"loki:chat:lock:a") == 0
        nc2 = await nats.connect(b.url)
        try:
            js = nc2.jetstream()
            got = [(await js.get_msg(subjects.STREAM_PERF, seq=s)).data for s in range(1, 6)]
            assert got == payloads
        finally:
            await nc2.close()
        # A second restore into the same target is refused (it is not empty any more).
        with pytest.raises(BackupError, match="nothing was restored"):
            await restore_backup(path, PASS, Target(dst_url, b.url, fresh))
    finally:
        await dst_redis.flushdb()
        await src_redis.aclose()
        await dst_redis.aclose()
        await nc.close()
        a.process.stop()
        b.process.stop()
