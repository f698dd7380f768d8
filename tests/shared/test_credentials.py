"""Issue 22: the stores' passwords, generated once (``loki up``: LOKI_HOME, 0600; compose: the
init step's folder), and a service logging in from them through its settings."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import nats
import pytest

from loki_shared import credentials, permissions, servers, subjects
from loki_shared.settings import LokiSettings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_once_into_the_home_mode_0600(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = credentials.ensure(home)
    path = home / credentials.FILE
    assert mode(path) == 0o600
    assert set(first.nats) == {row.user for row in permissions.USERS}
    assert set(first.redis) == set(permissions.redis_users())
    every = [*first.nats.values(), *first.redis.values()]
    assert len(set(every)) == len(every)  # all distinct
    assert all(len(p) >= 40 for p in every)
    assert credentials.ensure(home) == first  # read back, never regenerated
    # a user the table gains later gets a password; the others keep theirs
    data = json.loads(path.read_text())
    del data["nats"]["bench"]
    path.write_text(json.dumps(data))
    again = credentials.ensure(home)
    assert {k: v for k, v in again.nats.items() if k != "bench"} == {
        k: v for k, v in first.nats.items() if k != "bench"
    }
    assert again.nats["bench"] and again.nats["bench"] != first.nats["bench"]
    assert mode(path) == 0o600


def test_an_unreadable_file_is_an_error_not_new_passwords(tmp_path: Path) -> None:
    (tmp_path / credentials.FILE).write_text("{not json")
    with pytest.raises(credentials.CredentialsError, match="credentials.json"):
        credentials.ensure(tmp_path)


def test_urls_with_and_without_the_login() -> None:
    url = credentials.with_userinfo("nats://127.0.0.1:4222", "chat", "p/w@x")
    assert url == "nats://chat:p%2Fw%40x@127.0.0.1:4222"
    assert credentials.redact(url) == "nats://chat:***@127.0.0.1:4222"
    assert credentials.without_userinfo(url) == "nats://127.0.0.1:4222"
    redis_url = credentials.with_userinfo("redis://h:6379/0", None, "pw")
    assert redis_url == "redis://:pw@h:6379/0"
    assert credentials.url_login(url) == {"inbox_prefix": "_INBOX.chat"}
    assert credentials.url_login("nats://h:1") == {}


def test_compose_init_folder_and_a_service_logging_in_from_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "secrets"
    creds = credentials.init_folder(folder)
    assert mode(folder) == 0o700 and mode(folder / credentials.FILE) == 0o600
    assert credentials.init_folder(folder) == creds  # rerun: same passwords
    chat = folder / "chat"
    assert {p.name for p in chat.iterdir()} == {
        "loki_nats_user",
        "loki_nats_password",
        "loki_redis_user",
        "loki_redis_password",
    }
    assert (chat / "loki_nats_password").read_text() == creds.nats["chat"]
    assert (folder / "redis" / "redis.conf").read_text() == permissions.redis_config(creds.redis)
    assert (folder / "redis" / "password").read_text() == creds.redis["health"]
    assert "chat" not in {p.name for p in (folder / "gateway").iterdir()}
    # the settings read the folder LOKI_SECRETS_DIR names; the environment wins over it
    monkeypatch.setenv("LOKI_SECRETS_DIR", str(chat))
    for var in ("LOKI_NATS_USER", "LOKI_NATS_PASSWORD", "LOKI_REDIS_USER", "LOKI_REDIS_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    settings = LokiSettings()
    login = settings.nats_options()
    assert login == {
        "user": "chat",
        "password": creds.nats["chat"],
        "inbox_prefix": "_INBOX.chat",
    }
    assert settings.redis_options() == {"username": "chat", "password": creds.redis["chat"]}
    monkeypatch.setenv("LOKI_NATS_PASSWORD", "from-env")
    assert LokiSettings().nats_options()["password"] == "from-env"
    monkeypatch.delenv("LOKI_NATS_PASSWORD")

    # the generated nats.conf runs a real nats-server that lets chat in, as chat
    server = servers.start_nats(tmp_path / "nats", config=folder / "nats" / "nats.conf")
    try:

        async def check() -> None:
            errors: list[str] = []

            async def error_cb(exc: Exception) -> None:
                errors.append(str(exc))

            nc = await nats.connect(server.url, error_cb=error_cb, **login)
            await nc.publish(subjects.chat_events("c1"), b"{}")
            await nc.publish(subjects.MEMORY_KEY, b"{}")
            await nc.flush()
            await asyncio.sleep(0.2)
            await nc.close()
            assert len(errors) == 1 and subjects.MEMORY_KEY in errors[0], errors

        asyncio.run(check())
    finally:
        server.stop()
