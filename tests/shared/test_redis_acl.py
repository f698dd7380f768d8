"""Issue 36: one Redis ACL user per service, from the table of loki_shared.permissions, on the
suite's real Redis: each service reads and writes its own keys and is refused another's; the
``default`` user is off; the health user may only PING."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from loki_shared import permissions
from loki_shared.settings import LokiSettings

from ..conftest import AUTH, plain_url, start_redis

#: a key each service owns, under its patterns in the table
OWN = {
    "gateway": "loki:memory:kdf",
    "chat": "loki:chat:conv:acl-test",
    "recall": "loki:recall:blocks",
    "memory": "loki:projects:meta",
    "engine-supervisor": "loki:engine:presets",
}


def login(redis_url: str, user: str) -> redis.Redis:
    """A client logged in as ``user`` the way a service is (LokiSettings.redis_options)."""
    settings = LokiSettings(
        redis_url=plain_url(redis_url),
        redis_user=user,
        redis_password=AUTH.creds.redis[user],
    )
    return redis.Redis.from_url(settings.redis_url, **settings.redis_options())


@pytest.mark.parametrize("user", sorted(OWN))
def test_a_service_writes_its_own_keys_and_not_anothers(redis_db: str, user: str) -> None:
    client = login(redis_db, user)
    try:
        client.set(OWN[user], b"mine")
        assert client.get(OWN[user]) == b"mine"
        for other, key in OWN.items():
            if other == user or (other == "gateway" and user in ("recall", "memory")):
                continue  # recall and memory read the gateway's key record (next test)
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.get(key)
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.set(key, b"theirs")
    finally:
        client.close()


def test_readers_of_the_memory_key_record_cannot_write_it(redis_db: str) -> None:
    """recall and memory read ``loki:memory:kdf`` (the gateway writes it), never write it."""
    gateway = login(redis_db, "gateway")
    gateway.set(OWN["gateway"], b"params")
    for user in ("recall", "memory"):
        client = login(redis_db, user)
        assert client.get(OWN["gateway"]) == b"params"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(OWN["gateway"], b"forged")
        client.close()
    gateway.close()


def test_dangerous_commands_are_refused_and_default_is_off(redis_db: str) -> None:
    chat = login(redis_db, "chat")
    with pytest.raises(redis.exceptions.NoPermissionError):
        chat.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        chat.keys("loki:*")
    chat.close()
    bare = redis.Redis.from_url(plain_url(redis_db))
    with pytest.raises(redis.exceptions.AuthenticationError):
        bare.ping()
    bare.close()
    health = login(redis_db, permissions.REDIS_HEALTH_USER)
    assert health.ping() is True
    with pytest.raises(redis.exceptions.NoPermissionError):
        health.get("loki:chat:index")
    health.close()


def test_every_grant_with_keys_stays_under_loki() -> None:
    """Every pattern is a ``loki:`` key (the backup's ``loki:*`` covers them all)."""
    for row in permissions.USERS:
        for pattern in (*row.redis_keys, *row.redis_reads):
            assert pattern.startswith("loki:"), (row.user, pattern)


def test_a_transaction_survives_a_restart(tmp_path: Path) -> None:
    """A MULTI/EXEC block (how Redis records Loki's fenced Lua writes in its append-only file)
    is replayed after a restart: Redis 7.0 replays it as ``default`` and checks it at EXEC, so
    ``default`` keeps its permissions while off (found by the compose check's down/up)."""
    server = start_redis(tmp_path / "redis")
    chat = login(server.url, "chat")
    pipe = chat.pipeline(transaction=True)
    pipe.set("loki:chat:conv:kept", b"blob")
    pipe.hset("loki:chat:index", "kept", b"entry")
    pipe.execute()
    chat.close()
    server.process.stop()
    again = start_redis(tmp_path / "redis", port=server.port)
    try:
        chat = login(again.url, "chat")
        assert chat.get("loki:chat:conv:kept") == b"blob"
        assert chat.hget("loki:chat:index", "kept") == b"entry"
        chat.close()
    finally:
        again.process.stop()
