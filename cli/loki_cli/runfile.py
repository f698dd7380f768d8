"""The running stack's address file, ``LOKI_HOME/run/stack.json``.

``loki up`` writes it once NATS and Redis listen (their URLs are free loopback ports chosen at
start) and removes it when it stops, so commands run beside a live stack — ``loki backup`` —
find its stores. Mode 0600: it names the stores, not a secret, but no one else needs it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

RUN_FILE = Path("run") / "stack.json"


@dataclass(frozen=True)
class RunInfo:
    """What a running stack left: the launcher's pid and the stores it uses."""

    pid: int
    nats_url: str
    redis_url: str


def write(home: Path, nats_url: str, redis_url: str) -> None:
    """Record the stack of this process (replacing a stale file)."""
    path = home / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": os.getpid(), "nats_url": nats_url, "redis_url": redis_url}, fh)
    os.replace(tmp, path)


def remove(home: Path) -> None:
    """Remove the file if this process wrote it."""
    info = read(home, alive_only=False)
    if info is not None and info.pid == os.getpid():
        (home / RUN_FILE).unlink(missing_ok=True)


def read(home: Path, alive_only: bool = True) -> RunInfo | None:
    """The stack recorded under ``home``; None when there is none, the file is unreadable, or
    (``alive_only``) its launcher is no longer running."""
    try:
        data = json.loads((home / RUN_FILE).read_text())
        info = RunInfo(int(data["pid"]), str(data["nats_url"]), str(data["redis_url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if alive_only and not _alive(info.pid):
        return None
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
