"""Backup and restore of a Loki stack: one file, sealed with a passphrase.

A backup holds everything needed to bring a stack back: every persistent Redis key under
``loki:`` (conversations, the archive, the memory key's KDF record, presets...), every Loki
JetStream stream and key-value bucket (the perf ring and counters, audit events...), the data
files of ``LOKI_HOME`` and the service key those values are sealed with. It is read from a
running stack without stopping it and restored into an empty one.

- :mod:`.sealed_file` — the file format (scrypt-derived key, AES-GCM frames);
- :mod:`.redis_part`, :mod:`.jetstream_part`, :mod:`.home_part` — what is copied, and how;
- :mod:`.bundle` — :func:`create_backup` / :func:`restore_backup`;
- ``python -m loki_shared.backup create|restore PATH`` — the command the compose images run
  (``loki backup`` / ``loki restore`` wrap the same functions).
"""

from .bundle import BackupError, BackupSummary, Target, create_backup, read_backup, restore_backup
from .sealed_file import MIN_PASSPHRASE_CHARS, BackupFileError

__all__ = [
    "MIN_PASSPHRASE_CHARS",
    "BackupError",
    "BackupFileError",
    "BackupSummary",
    "Target",
    "create_backup",
    "read_backup",
    "restore_backup",
]
