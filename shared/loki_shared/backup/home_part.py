"""``LOKI_HOME`` in a backup: the files that hold data, and the service key.

Every regular file under ``LOKI_HOME`` is data unless it is one of these, left out:

- the stores a backup copies through their own protocols: ``redis/`` and ``nats/``
  (the embedded Redis's and JetStream's files);
- what is rebuilt from the data: ``slots/`` (llama-server's saved prompt caches) and
  ``*.snap`` files (the recall index snapshot, rebuilt from the archive);
- runtime state: ``run/`` (the running stack's address file, the generated server
  configurations);
- ``credentials.json``: the stores' passwords of this installation (issue 22); a restored
  stack gets passwords of its own (:mod:`loki_shared.credentials`);
- temporary files (``*.tmp``) and backups themselves (``*.lokibak``);
- ``secret.key``: the service key travels apart, inside the sealed file (:func:`service_key`).

So files a later version keeps under ``LOKI_HOME`` (attachments, say) are in the backup with no
change here. Symbolic links and special files are skipped.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from ..sealing import KEY_BYTES, KEY_FILE, key_from_text

SKIP_DIRS = frozenset({"redis", "nats", "slots", "run"})
SKIP_SUFFIXES = (".snap", ".tmp", ".lokibak")
#: Files at the top of ``LOKI_HOME`` that never go into a backup, besides the service key.
SKIP_FILES = frozenset({"credentials.json"})


class HomeBackupError(Exception):
    """A target ``LOKI_HOME`` that holds another key or other files of the same names."""


def data_files(home: Path) -> list[str]:
    """Relative POSIX paths of the data files under ``home``, sorted (see the module docstring)."""
    out: list[str] = []
    if not home.is_dir():
        return out
    for root, dirs, files in os.walk(home):
        rel_root = Path(root).relative_to(home)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        dirs.sort()
        for name in sorted(files):
            rel = rel_root / name
            path = home / rel
            if rel == Path(KEY_FILE) or name.endswith(SKIP_SUFFIXES):
                continue
            if rel_root == Path(".") and name in SKIP_FILES:
                continue
            if path.is_symlink() or not path.is_file():
                continue
            out.append(rel.as_posix())
    return sorted(out)


def service_key(home: Path, secret_key: str | None) -> bytes:
    """The service key in use, read without creating anything
    (``LOKI_SECRET_KEY`` when set, else ``home/secret.key``).

    Raises:
        HomeBackupError: no key at all (the stack never ran with this ``LOKI_HOME``).
    """
    if secret_key:
        return key_from_text(secret_key)
    path = home / KEY_FILE
    try:
        raw = base64.b64decode(path.read_text().strip(), validate=True)
    except (OSError, ValueError) as exc:
        raise HomeBackupError(
            f"no service key: neither LOKI_SECRET_KEY nor a readable {path} ({exc})"
        ) from exc
    if len(raw) != KEY_BYTES:
        raise HomeBackupError(f"{path} does not hold a {KEY_BYTES}-byte key")
    return raw


def check_target(home: Path, secret_key: str | None, key: bytes, files: dict[str, bytes]) -> bool:
    """Check that ``home`` can receive the backup; return whether ``secret.key`` must be written.

    The target's key (``LOKI_SECRET_KEY``, else an existing ``secret.key``) must be the
    backup's, since every stored value is sealed with it; with neither, the backup's key is
    written as ``secret.key``. A file of the backup must not exist with other content.

    Raises:
        HomeBackupError: another key, or a file in the way.
    """
    write_key = False
    if secret_key:
        if key_from_text(secret_key) != key:
            raise HomeBackupError(
                "LOKI_SECRET_KEY is not the key of this backup: unset it (the restore then "
                "writes the backup's key to LOKI_HOME/secret.key) or set the key the backed-up "
                "stack used"
            )
    elif (home / KEY_FILE).exists():
        if service_key(home, None) != key:
            raise HomeBackupError(
                f"{home / KEY_FILE} holds another key: restore into an empty LOKI_HOME"
            )
    else:
        write_key = True
    for rel, data in files.items():
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise HomeBackupError(f"refusing a path outside LOKI_HOME: {rel}")
        path = home / rel
        if path.exists() and (not path.is_file() or path.read_bytes() != data):
            raise HomeBackupError(f"{path} exists: restore into an empty LOKI_HOME")
    return write_key


def write_files(home: Path, files: dict[str, bytes], key: bytes | None) -> None:
    """Write the backup's files under ``home`` (0600, directories 0700) and, when ``key`` is
    given, ``secret.key`` (0600, created exclusively)."""
    home.mkdir(parents=True, exist_ok=True)
    if key is not None:
        fd = os.open(home / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(base64.b64encode(key).decode("ascii") + "\n")
    for rel, data in files.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
