"""``python -m loki_shared.backup create|restore PATH``: back up or restore a stack from inside
one of its containers (compose), where the ``loki`` command is not installed.

PATH ``-`` is standard output (create) or standard input (restore), so a backup can be piped
out of a container and back in without a shared folder; the passphrase must then come from
the file or the variable, and the report goes to standard error.

The stack is the one the ``LOKI_*`` environment names (``LOKI_REDIS_URL``, ``LOKI_NATS_URL``,
``LOKI_HOME``, ``LOKI_SECRET_KEY``): every Loki container has it. The passphrase comes from
``--passphrase-file``, else ``LOKI_BACKUP_PASSPHRASE``, else a prompt (asked twice for a new
backup). Exit status: 0 done, 1 refused or failed (one line says why).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from ..credentials import with_userinfo
from ..settings import LokiSettings
from .bundle import BackupError, Target, create_backup, restore_backup
from .passphrase import PASSPHRASE_ENV, read_passphrase


def target_from_env() -> Target:
    """The stack the ``LOKI_*`` environment describes, logged in with its credentials
    (``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD`` / ``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD`` or
    ``LOKI_SECRETS_DIR``: in compose, the ``loki-backup`` service's, user ``backup``)."""
    s = LokiSettings()
    nats_url, redis_url = s.nats_url, s.redis_url
    login = s.nats_options()
    if login:
        nats_url = with_userinfo(nats_url, login["user"], login["password"])
    if s.redis_password is not None:
        redis_url = with_userinfo(redis_url, s.redis_user, s.redis_password.get_secret_value())
    return Target(
        redis_url=redis_url,
        nats_url=nats_url,
        home=Path(s.home),
        secret_key=s.secret_key.get_secret_value() if s.secret_key else None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loki_shared.backup", description=__doc__)
    parser.add_argument("action", choices=["create", "restore"])
    parser.add_argument("path", help="backup file, or - for standard output / input")
    parser.add_argument("--passphrase-file", help="file whose first line is the passphrase")
    args = parser.parse_args(argv)
    piped = args.path == "-"
    try:
        if piped and not (args.passphrase_file or os.environ.get(PASSPHRASE_ENV)):
            raise BackupError(
                f"with -, give the passphrase in {PASSPHRASE_ENV} or --passphrase-file"
            )
        passphrase = read_passphrase(args.passphrase_file, confirm=args.action == "create")
        target = target_from_env()
        if args.action == "create":
            dest = sys.stdout.buffer if piped else Path(args.path)
            summary = asyncio.run(create_backup(dest, passphrase, target))
            verb = "backed up"
        else:
            src = sys.stdin.buffer if piped else Path(args.path)
            summary = asyncio.run(restore_backup(src, passphrase, target))
            verb = "restored"
    except BackupError as exc:
        print(f"loki backup: {exc}", file=sys.stderr)
        return 1
    streams = ", ".join(f"{k} {v}" for k, v in summary.streams.items()) or "none"
    print(
        f"{verb} {summary.redis_keys} Redis keys, streams ({streams}), "
        f"{len(summary.files)} files: {args.path}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
