"""``loki backup PATH`` and ``loki restore PATH`` (see :mod:`loki_shared.backup`).

Which stack:

- ``loki backup`` reads a *running* stack: the stores named by ``LOKI_NATS_URL`` /
  ``LOKI_REDIS_URL`` when set, else those ``loki up`` recorded for this ``LOKI_HOME``
  (:mod:`loki_cli.runfile`). Nothing is stopped.
- ``loki restore`` writes into an *empty* stack: the stores named by the environment when set;
  otherwise, with no stack running on this ``LOKI_HOME``, it starts the embedded NATS and Redis
  on the home's data folders (as ``loki up`` would), restores, and stops them; ``loki up``
  then serves the restored data.

The passphrase comes from ``--passphrase-file``, else ``LOKI_BACKUP_PASSPHRASE``, else a
prompt (asked twice for a new backup).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer
from rich.console import Console

from loki_shared import servers
from loki_shared.backup import (
    MIN_PASSPHRASE_CHARS,
    BackupError,
    Target,
    create_backup,
    restore_backup,
)
from loki_shared.backup.passphrase import read_passphrase

from . import runfile

console = Console(stderr=True)

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


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[red]{exc}[/]")
    return typer.Exit(1)


def backup(
    path: Path = typer.Argument(..., help="File to write (must not exist)."),
    passphrase_file: Path | None = PASSPHRASE_FILE,
) -> None:
    """Back up the running stack into one file sealed with a passphrase."""
    home = _home()
    nats_url = os.environ.get("LOKI_NATS_URL") or ""
    redis_url = os.environ.get("LOKI_REDIS_URL") or ""
    if not (nats_url and redis_url):
        info = runfile.read(home)
        if info is None:
            raise _fail(
                BackupError(
                    f"no running Loki found for LOKI_HOME={home}: start it (loki up), or set "
                    "LOKI_NATS_URL and LOKI_REDIS_URL"
                )
            )
        nats_url, redis_url = nats_url or info.nats_url, redis_url or info.redis_url
    target = Target(redis_url, nats_url, home, os.environ.get("LOKI_SECRET_KEY") or None)
    try:
        summary = asyncio.run(create_backup(path, _passphrase(passphrase_file, True), target))
    except BackupError as exc:
        raise _fail(exc) from exc
    streams = ", ".join(f"{k}: {v}" for k, v in summary.streams.items()) or "none"
    console.print(
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
    except (BackupError, servers.ServerNotFound, servers.ServerStartError) as exc:
        raise _fail(exc) from exc
    finally:
        for proc in reversed(started):
            proc.stop()
    streams = ", ".join(f"{k}: {v}" for k, v in summary.streams.items()) or "none"
    console.print(
        f"restored {summary.redis_keys} Redis keys, streams ({streams}) and "
        f"{len(summary.files)} files into LOKI_HOME={home}"
    )


def _embedded(started: list[servers.ManagedProcess], name: str, home: Path) -> str:
    """Start the embedded ``name`` server on ``home``'s data folder (as ``loki up`` does)."""
    start = servers.start_nats if name == "nats" else servers.start_redis
    server = start(home / name)
    started.append(server.process)
    return server.url


def register(app: typer.Typer) -> None:
    """Add ``backup`` and ``restore`` to the ``loki`` command."""
    app.command()(backup)
    app.command()(restore)
