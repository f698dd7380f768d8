"""Where a backup passphrase comes from: a file, ``LOKI_BACKUP_PASSPHRASE``, or a prompt."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from pathlib import Path

from .bundle import BackupError

PASSPHRASE_ENV = "LOKI_BACKUP_PASSPHRASE"


def _getpass_prompt(confirm: bool) -> str:
    first = getpass.getpass("Backup passphrase: ")
    if confirm and getpass.getpass("Same passphrase again: ") != first:
        raise BackupError("the two passphrases differ")
    return first


def read_passphrase(
    file: Path | str | None, confirm: bool, prompt: Callable[[bool], str] = _getpass_prompt
) -> str:
    """The passphrase from ``file`` (its first line), else ``LOKI_BACKUP_PASSPHRASE``, else
    ``prompt(confirm)`` (``confirm``: ask twice, for a new backup).

    Raises:
        BackupError: the file cannot be read, or the prompt refused.
    """
    if file:
        try:
            return Path(file).read_text().splitlines()[0]
        except (OSError, IndexError) as exc:
            raise BackupError(f"cannot read the passphrase from {file}: {exc}") from exc
    env = os.environ.get(PASSPHRASE_ENV)
    if env:
        return env
    return prompt(confirm)
