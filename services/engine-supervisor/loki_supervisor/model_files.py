"""The GGUF files a preset may pick: every ``*.gguf`` under ``LOKI_MODEL_DIRS``.

``LOKI_MODEL_DIRS`` lists directories separated by ``:`` or ``,`` (read once at start-up;
empty: none, and the bundled model is always offered). Each file is described by its path,
its name, its size in bytes and its ``general.architecture`` read from the GGUF header with
:func:`loki_supervisor.facts.read_gguf_metadata` (``None`` when the header cannot be read, with
the reason in ``error``). Later parts of a split model (``-00002-of-00003.gguf``...) are left
out: llama-server is given the first part.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loki_shared import servers

from .facts import read_gguf_metadata

#: At most this many files are listed (a directory of thousands is not a picker).
MAX_FILES = 500
_LATER_PART = re.compile(r"-0*(\d+)-of-\d+\.gguf$", re.IGNORECASE)


def parse_dirs(raw: str) -> list[Path]:
    """``LOKI_MODEL_DIRS`` text → directories (``:`` or ``,`` separated, blanks dropped)."""
    return [Path(p.strip()).expanduser() for p in re.split(r"[:,]", raw) if p.strip()]


def describe(path: Path) -> dict[str, Any]:
    """``{"path", "name", "size_bytes", "architecture", "error"}`` of one GGUF file."""
    info: dict[str, Any] = {"path": str(path), "name": path.name, "architecture": None}
    try:
        info["size_bytes"] = path.stat().st_size
        meta = read_gguf_metadata(path, lambda k: k == "general.architecture")
        arch = meta.get("general.architecture")
        info["architecture"] = arch if isinstance(arch, str) else None
    except (OSError, ValueError) as exc:
        info.setdefault("size_bytes", None)
        info["error"] = str(exc)[:200]
    return info


def _is_later_part(path: Path) -> bool:
    m = _LATER_PART.search(path.name)
    return bool(m and int(m.group(1)) > 1)


def list_model_files(dirs: list[Path]) -> dict[str, Any]:
    """The GGUF files under ``dirs`` (recursively, sorted by path), the bundled model first.

    Returns ``{"dirs": [{"path", "exists"}], "bundled": <path or None>, "files": [...]}``
    (files as :func:`describe` gives them, at most :data:`MAX_FILES`; ``truncated`` true
    when more were found). Blocking: run it in a thread.
    """
    seen: set[Path] = set()  # a file reached twice (nested or repeated dirs) is listed once
    found: list[Path] = []
    for root in dirs:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.gguf")):
            real = path.parent.resolve() / path.name
            if real in seen or not path.is_file() or _is_later_part(path):
                continue
            seen.add(real)
            found.append(path)
    try:
        bundled: Path | None = servers.find_bundled_model()
    except servers.ServerNotFound:  # no bundled model installed: none offered
        bundled = None
    return {
        "dirs": [{"path": str(d), "exists": d.is_dir()} for d in dirs],
        "bundled": describe(bundled) if bundled else None,
        "files": [describe(p) for p in found[:MAX_FILES]],
        "truncated": len(found) > MAX_FILES,
    }
