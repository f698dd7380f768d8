"""The commands: `loki backup` finds the running stack (its run file, or LOKI_*_URL), `loki
restore` fills an empty LOKI_HOME by starting its embedded stores, and `python -m
loki_shared.backup` does the same from inside a container (no engine needed)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import redis

from loki_cli import runfile
from loki_shared import credentials, servers
from tests.conftest import start_nats, start_redis

PASS = "a passphrase long enough"


def run(argv: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    full.update(LOKI_HOME=str(home), **env)
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120)


def loki(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    return run([str(Path(sys.executable).parent / "loki"), *args], home, **env)


def test_loki_backup_reads_the_running_stack_and_restore_fills_an_empty_home(tmp_path: Path):
    home = tmp_path / "home"
    # As `loki up` starts them: the home's own credentials (issue 22), URLs without a login.
    creds = credentials.ensure(home)
    nats_a = servers.start_nats(
        home / "nats",
        config=credentials.write_nats_config(home / credentials.NATS_CONF, creds),
    )
    redis_a = servers.start_redis(
        home / "redis",
        config=credentials.write_redis_config(home / credentials.REDIS_CONF, creds),
    )
    try:
        r = redis.Redis.from_url(redis_a.url, username="backup", password=creds.redis["backup"])
        r.set(b"loki:chat:conv:x", b"\x01blob")
        r.hset(b"loki:chat:index", b"x", b"\x01entry")
        (home / "secret.key").write_text("A" * 43 + "=\n")
        backup = tmp_path / "x.lokibak"

        # No stack running and no URLs: a clear refusal.
        out = loki("backup", str(backup), home=home, LOKI_BACKUP_PASSPHRASE=PASS)
        assert out.returncode == 1 and "no running Loki" in out.stderr, out.stderr
        assert not backup.exists()

        # The run file `loki up` writes (this process plays the launcher).
        runfile.write(home, nats_a.url, redis_a.url)
        assert runfile.read(home) is not None
        out = loki("backup", str(backup), home=home, LOKI_BACKUP_PASSPHRASE="short")
        assert out.returncode == 1 and "at least 12" in out.stderr, out.stderr
        out = loki("backup", str(backup), home=home, LOKI_BACKUP_PASSPHRASE=PASS)
        assert out.returncode == 0, out.stderr
        assert "2 Redis keys" in out.stderr
        runfile.remove(home)
        assert runfile.read(home, alive_only=False) is None
    finally:
        nats_a.process.stop()
        redis_a.process.stop()

    fresh = tmp_path / "fresh"
    pfile = tmp_path / "pass.txt"
    pfile.write_text(PASS + "\n")
    out = loki("restore", str(backup), "--passphrase-file", str(pfile), home=fresh)
    assert out.returncode == 0, out.stderr
    assert (fresh / "secret.key").read_text() == "A" * 43 + "=\n"
    # The stores' passwords are not in the backup: the restored home has passwords of its own.
    assert credentials.load(fresh / credentials.FILE) != creds
    # The embedded Redis the restore started kept the data in the home's append-only file.
    again = start_redis(fresh / "redis")
    try:
        r = redis.Redis.from_url(again.url)
        assert r.get(b"loki:chat:conv:x") == b"\x01blob"
        assert r.hgetall(b"loki:chat:index") == {b"x": b"\x01entry"}
    finally:
        again.process.stop()


def test_python_m_loki_shared_backup_works_from_the_environment(tmp_path: Path):
    home = tmp_path / "home"
    nats_a, redis_a = start_nats(tmp_path / "nats"), start_redis(tmp_path / "redis")
    nats_b, redis_b = start_nats(tmp_path / "nats2"), start_redis(tmp_path / "redis2")
    try:
        redis.Redis.from_url(redis_a.url).set(b"loki:recall:seq", b"7")
        path = tmp_path / "c.lokibak"
        env = dict(LOKI_BACKUP_PASSPHRASE=PASS, LOKI_SECRET_KEY="compose secret key text")
        cmd = [sys.executable, "-m", "loki_shared.backup"]
        out = run(
            [*cmd, "create", str(path)],
            home,
            LOKI_NATS_URL=nats_a.url,
            LOKI_REDIS_URL=redis_a.url,
            **env,
        )
        assert out.returncode == 0, out.stderr
        # The target's LOKI_SECRET_KEY must be the backup's.
        out = run(
            [*cmd, "restore", str(path)],
            tmp_path / "target",
            LOKI_NATS_URL=nats_b.url,
            LOKI_REDIS_URL=redis_b.url,
            LOKI_BACKUP_PASSPHRASE=PASS,
            LOKI_SECRET_KEY="another key",
        )
        assert out.returncode == 1 and "LOKI_SECRET_KEY" in out.stderr, out.stderr
        out = run(
            [*cmd, "restore", str(path)],
            tmp_path / "target",
            LOKI_NATS_URL=nats_b.url,
            LOKI_REDIS_URL=redis_b.url,
            **env,
        )
        assert out.returncode == 0, out.stderr
        assert redis.Redis.from_url(redis_b.url).get(b"loki:recall:seq") == b"7"
        # With the same LOKI_SECRET_KEY, no key file is written beside the data.
        assert not (tmp_path / "target" / "secret.key").exists()
    finally:
        for s in (nats_a, redis_a, nats_b, redis_b):
            s.process.stop()


def test_python_m_loki_shared_backup_pipes_through_standard_output_and_input(tmp_path: Path):
    """`create -` writes the file to standard output and `restore -` reads it from standard
    input (a backup piped out of a container and back), the report on standard error."""
    nats_a, redis_a = start_nats(tmp_path / "nats"), start_redis(tmp_path / "redis")
    nats_b, redis_b = start_nats(tmp_path / "nats2"), start_redis(tmp_path / "redis2")
    try:
        redis.Redis.from_url(redis_a.url).hset(b"loki:engine:presets", b"p", b"\x01x")
        home = tmp_path / "home"
        (home / "attachments").mkdir(parents=True)
        (home / "attachments" / "a.txt").write_bytes(b"attached")
        key_text = base64.b64encode(os.urandom(32)).decode() + "\n"
        (home / "secret.key").write_text(key_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
        cmd = [sys.executable, "-m", "loki_shared.backup"]
        # Without a passphrase source, `-` refuses rather than prompting on the data stream.
        out = subprocess.run([*cmd, "create", "-"], env=env, capture_output=True, timeout=60)
        assert out.returncode == 1 and b"LOKI_BACKUP_PASSPHRASE" in out.stderr
        env["LOKI_BACKUP_PASSPHRASE"] = PASS
        src = dict(env, LOKI_HOME=str(home), LOKI_NATS_URL=nats_a.url, LOKI_REDIS_URL=redis_a.url)
        out = subprocess.run([*cmd, "create", "-"], env=src, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(b"LOKI-BACKUP") and b"backed up 1 Redis keys" in out.stderr
        target = tmp_path / "target"
        dst = dict(env, LOKI_HOME=str(target), LOKI_NATS_URL=nats_b.url, LOKI_REDIS_URL=redis_b.url)
        back = subprocess.run(
            [*cmd, "restore", "-"], env=dst, input=out.stdout, capture_output=True, timeout=60
        )
        assert back.returncode == 0, back.stderr
        assert redis.Redis.from_url(redis_b.url).hgetall(b"loki:engine:presets") == {b"p": b"\x01x"}
        assert (target / "attachments" / "a.txt").read_bytes() == b"attached"
        assert (target / "secret.key").read_text() == key_text
    finally:
        for s in (nats_a, redis_a, nats_b, redis_b):
            s.process.stop()
