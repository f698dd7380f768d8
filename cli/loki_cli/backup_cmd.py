"""``loki backup PATH`` and ``loki restore PATH`` (see :mod:`loki_shared.backup`).

Which stack:

- ``loki backup`` reads a *running* stack: the stores named by ``LOKI_NATS_URL`` /
  ``LOKI_REDIS_URL`` when set, else those ``loki up`` recorded for this ``LOKI_HOME``
  (:mod:`loki_cli.runfile`). Nothing is stopped.
- ``loki restore`` writes into an *empty* stack: the stores named by the environment when set;
  otherwise, with no stack running on this ``LOKI_HOME``, it starts the embedded NATS and Redis
  on the home's data folders (as ``loki up`` would), restores, and stops them; ``loki up``
  then serves the restored data.

Logins (issues 22, 36): the stores ``loki up`` started are reached as NATS and Redis user
``backup``, the passwords read from ``LOKI_HOME/credentials.json``; stores named by the
environment with ``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD`` / ``LOKI_REDIS_USER`` /
``LOKI_REDIS_PASSWORD`` (or in their URLs). ``loki restore`` starting the embedded stores of
an empty home generates its credentials first, so the ``loki up`` that follows uses the same
ones.

The passphrase comes from ``--passphrase-file``, else ``LOKI_BACKUP_PASSPHRASE``, else a
prompt (asked twice for a new backup).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from loki_shared import credentials, servers
from loki_shared.backup import (
    MIN_PASSPHRASE_CHARS,
    BackupError,
    Target,
    create_backup,
    restore_backup,
)
from loki_shared.backup.passphrase import read_passphrase

from . import runfile
from .term import console, say

PASSPHRASE_FILE = typer.Option(
    None, "--passphrase-file", help="File whose first line is the passphrase."
)


def _home() -> Path:
    return Path(os.environ.get("LOKI_HOME", "./data")).resolve()


def _passphrase(file: Path | None, confirm: bool) -> str:
    def prompt(confirm: bool) -> str:
        hint = f" (at least {MIN_PASSPHRASE_CHARS} characters)" if confirm else ""
        return typer.prompt(
            f"Backup passphrase{hint}", hide_input=True, confirmation_prompt=confirm
        )

    return read_passphrase(file, confirm, prompt)


def _env_login(nats_url: str, redis_url: str) -> tuple[str, str]:
    """The environment's URLs with the environment's credentials folded in (when set)."""
    user, password = os.environ.get("LOKI_NATS_USER"), os.environ.get("LOKI_NATS_PASSWORD")
    if user:
        nats_url = credentials.with_userinfo(nats_url, user, password or "")
    redis_password = os.environ.get("LOKI_REDIS_PASSWORD")
    if redis_password:
        redis_user = os.environ.get("LOKI_REDIS_USER") or None
        redis_url = credentials.with_userinfo(redis_url, redis_user, redis_password)
    return nats_url, redis_url


def _embedded_login(home: Path, url: str, store: str) -> str:
    """``url`` of a store ``loki up`` started on ``home``, logged in as user ``backup`` (NATS)
    or ``backup`` (Redis) with ``home``'s credentials.

    Raises:
        BackupError: the credentials file is missing or unreadable.
    """
    try:
        creds = credentials.load(home / credentials.FILE)
    except credentials.CredentialsError as exc:
        raise BackupError(f"the stack's credentials: {exc}") from exc
    if store == "nats":
        return credentials.with_userinfo(url, "backup", creds.nats.get("backup", ""))
    return credentials.with_userinfo(url, "backup", creds.redis.get("backup", ""))


def _fail(exc: Exception) -> typer.Exit:
    say(exc, style="red")
    return typer.Exit(1)


def backup(
    path: Path = typer.Argument(..., help="File to write (must not exist)."),
    passphrase_file: Path | None = PASSPHRASE_FILE,
) -> None:
    """Back up the running stack into one file sealed with a passphrase."""
    home = _home()
    nats_url = os.environ.get("LOKI_NATS_URL") or ""
    redis_url = os.environ.get("LOKI_REDIS_URL") or ""
    try:
        nats_url, redis_url = _env_login(nats_url, redis_url)
        if not (nats_url and redis_url):
            info = runfile.read(home)
            if info is None:
                raise BackupError(
                    f"no running Loki found for LOKI_HOME={home}: start it (loki up), or set "
                    "LOKI_NATS_URL and LOKI_REDIS_URL"
                )
            nats_url = nats_url or _embedded_login(home, info.nats_url, "nats")
            redis_url = redis_url or _embedded_login(home, info.redis_url, "redis")
    except BackupError as exc:
        raise _fail(exc) from exc
    target = Target(redis_url, nats_url, home, os.environ.get("LOKI_SECRET_KEY") or None)
    try:
        summary = asyncio.run(create_backup(path, _passphrase(passphrase_file, True), target))
    except BackupError as exc:
        raise _fail(exc) from exc
    streams = ", ".join(f"{k}: {v}" for k, v in summary.streams.items()) or "none"
    say(
        f"backed up {summary.redis_keys} Redis keys, streams ({streams}) and "
        f"{len(summary.files)} files into {path}"
    )
    console.print("Keep the passphrase: without it the backup cannot be opened.")


def restore(
    path: Path = typer.Argument(..., help="Backup file written by `loki backup`."),
    passphrase_file: Path | None = PASSPHRASE_FILE,
) -> None:
    """Restore a backup into an empty LOKI_HOME (or the empty stores LOKI_*_URL name)."""
    home = _home()
    nats_url = os.environ.get("LOKI_NATS_URL") or ""
    redis_url = os.environ.get("LOKI_REDIS_URL") or ""
    started: list[servers.ManagedProcess] = []
    try:
        passphrase = _passphrase(passphrase_file, False)
        nats_url, redis_url = _env_login(nats_url, redis_url)
        if not (nats_url and redis_url):
            if runfile.read(home) is not None:
                raise BackupError(
                    f"Loki is running on LOKI_HOME={home}: stop it first (a restore writes "
                    "into an empty stack)"
                )
            if not nats_url:
                nats_url = _embedded(started, "nats", home)
            if not redis_url:
                redis_url = _embedded(started, "redis", home)
        target = Target(redis_url, nats_url, home, os.environ.get("LOKI_SECRET_KEY") or None)
        summary = asyncio.run(restore_backup(path, passphrase, target))
    except (
        BackupError,
        servers.ServerNotFound,
        servers.ServerStartError,
        credentials.CredentialsError,
    ) as exc:
        raise _fail(exc) from exc
    finally:
        for proc in reversed(started):
            proc.stop()
    streams = ", ".join(f"{k}: {v}" for k, v in summary.streams.items()) or "none"
    say(
        f"restored {summary.redis_keys} Redis keys, streams ({streams}) and "
        f"{len(summary.files)} files into LOKI_HOME={home}"
    )


def _embedded(started: list[servers.ManagedProcess], name: str, home: Path) -> str:
    """Start the embedded ``name`` server on ``home``'s data folder with ``home``'s
    credentials (created if new), as ``loki up`` does; return its URL logged in as the
    ``backup`` user (NATS) or with the password (Redis)."""
    creds = credentials.ensure(home)
    if name == "nats":
        conf = credentials.write_nats_config(home / credentials.NATS_CONF, creds)
        server = servers.start_nats(home / name, config=conf)
    else:
        conf = credentials.write_redis_config(home / credentials.REDIS_CONF, creds)
        server = servers.start_redis(home / name, config=conf)
    started.append(server.process)
    return _embedded_login(home, server.url, name)


def register(app: typer.Typer) -> None:
    """Add ``backup`` and ``restore`` to the ``loki`` command."""
    app.command()(backup)
    app.command()(restore)
