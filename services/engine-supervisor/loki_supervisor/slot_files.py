"""SLOT_PERSIST's file rules (pure): how a saved slot file is named, which files are stale,
which one holds the conversation that owned slot 0.

A file is named ``loki-slot-<model>-<n_ctx>-<conversation>-<fingerprint>.bin``:

- ``model``: 12 hex characters of sha256 over the model file's resolved path, size and
  modification time (:func:`model_key`): another file, or the same path rewritten, is another
  model;
- ``n_ctx``: the slot's ``n_ctx`` (tokens) when it was saved: a state saved at one window is
  never restored into another;
- ``conversation``: 12 hex characters of sha256 of the conversation id (ids may hold any
  character; llama.cpp's ``--slot-save-path`` accepts only a plain file name);
- ``fingerprint``: the first 16 hex characters of the prompt's last cumulative fingerprint
  (:mod:`loki_shared.fingerprint`), ``0`` × 16 when the caller did not send one.

Several engines (issue 44, :mod:`loki_supervisor.slot_transfer`) name files the same way,
the model part being :func:`model_name_key` of the engine's ``model_path``, and clean their
shared directory with :func:`pool_stale_files`.

Table tests: ``tests/engine/test_slot_files.py``, ``tests/engine/test_slot_transfer_rules.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Files older than this are stale (s): a day, as the seeds' SLOT_PERSIST says.
MAX_AGE_S = 86400.0
#: LOKI_SLOT_PERSIST_MAX_MB's default (MiB): all kept slot files together stay below it.
DEFAULT_MAX_MB = 2048
NO_FINGERPRINT = "0" * 16
#: A save is written under this prefix and renamed once complete (a name with it is a
#: foreign file for :func:`stale_files`, an unfinished save for :func:`pool_stale_files`).
PART_PREFIX = "part-"

_NAME = re.compile(
    r"^loki-slot-(?P<model>[0-9a-f]{12})-(?P<n_ctx>[0-9]+)-(?P<conversation>[0-9a-f]{12})"
    r"-(?P<fingerprint>[0-9a-f]{16})\.bin$"
)


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def model_key(path: Path) -> str:
    """12 hex characters naming a model file: sha256 of its resolved path, size in bytes
    and ``st_mtime_ns``.

    Raises:
        OSError: the file cannot be stat'ed.
    """
    resolved = path.resolve()
    st = resolved.stat()
    return _hex(f"{resolved}\0{st.st_size}\0{st.st_mtime_ns}", 12)


def model_name_key(model: str) -> str:
    """12 hex characters naming a followed engine's model by its name (``/props``
    ``model_path``): a pooled engine's file is not the supervisor's to stat, so engines that
    report the same path are taken to serve the same model."""
    return _hex(model, 12)


def conversation_key(conversation: str) -> str:
    """12 hex characters of sha256 of a conversation id."""
    return _hex(conversation, 12)


def fingerprint_key(fingerprint: str | None) -> str:
    """The fingerprint part of a name: the first 16 lowercase hex characters of a
    :func:`loki_shared.fingerprint.fingerprints` value; :data:`NO_FINGERPRINT` when absent
    or not hex."""
    fp = (fingerprint or "").strip().lower()[:16]
    return fp if len(fp) == 16 and all(c in "0123456789abcdef" for c in fp) else NO_FINGERPRINT


@dataclass(frozen=True)
class SlotKey:
    """What a slot file is keyed by (see the module docstring); ``conversation`` and
    ``fingerprint`` are already the hex parts of the name."""

    model: str
    n_ctx: int
    conversation: str
    fingerprint: str

    @property
    def filename(self) -> str:
        """The file name llama-server writes under ``--slot-save-path``."""
        return f"loki-slot-{self.model}-{self.n_ctx}-{self.conversation}-{self.fingerprint}.bin"


def parse(name: str) -> SlotKey | None:
    """The key of a Loki slot file name; None for any other name."""
    m = _NAME.match(name)
    if m is None:
        return None
    return SlotKey(m["model"], int(m["n_ctx"]), m["conversation"], m["fingerprint"])


def is_slot_file(name: str) -> bool:
    """Whether ``name`` is a Loki slot file name (kept at launch when SLOT_PERSIST is on)."""
    return _NAME.match(name) is not None


@dataclass(frozen=True)
class SlotFile:
    """One file of the slot directory: its name, size (bytes) and ``st_mtime`` (s)."""

    name: str
    size: int
    mtime: float


def stale_files(
    files: Iterable[SlotFile],
    model: str,
    n_ctx: int,
    now: float,
    max_bytes: int,
    max_age_s: float = MAX_AGE_S,
) -> dict[str, str]:
    """Which files to delete, with why (name → reason), in this order of rules:

    1. not a Loki slot file name → ``foreign file``;
    2. another model or another ``n_ctx`` → ``other model`` / ``other n_ctx``;
    3. modified more than ``max_age_s`` ago → ``older than a day`` (or the age given);
    4. an older file of the same conversation (another fingerprint) → ``superseded``: one
       file per conversation, the newest;
    5. the files left, oldest first, until their total is at most ``max_bytes`` →
       ``over LOKI_SLOT_PERSIST_MAX_MB`` (a single file above the limit goes too).
    """
    doomed: dict[str, str] = {}
    kept: list[tuple[SlotFile, SlotKey]] = []
    for f in files:
        key = parse(f.name)
        if key is None:
            doomed[f.name] = "foreign file"
        elif key.model != model:
            doomed[f.name] = "other model"
        elif key.n_ctx != n_ctx:
            doomed[f.name] = "other n_ctx"
        elif now - f.mtime > max_age_s:
            doomed[f.name] = (
                "older than a day" if max_age_s == MAX_AGE_S else f"older than {max_age_s:g} s"
            )
        else:
            kept.append((f, key))
    doomed.update(_prune(kept, max_bytes, "over LOKI_SLOT_PERSIST_MAX_MB"))
    return doomed


def _prune(kept: list[tuple[SlotFile, SlotKey]], max_bytes: int, over: str) -> dict[str, str]:
    """Rules 4 and 5 of :func:`stale_files` over the files still kept: one file per
    conversation (the newest; the others ``superseded``), then the oldest go (``over``) until
    the total is at most ``max_bytes``."""
    doomed: dict[str, str] = {}
    kept = sorted(kept, key=lambda fk: (fk[0].mtime, fk[0].name), reverse=True)  # newest first
    seen: set[str] = set()
    survivors: list[SlotFile] = []
    for f, key in kept:
        if key.conversation in seen:
            doomed[f.name] = "superseded"
        else:
            seen.add(key.conversation)
            survivors.append(f)
    total = sum(f.size for f in survivors)
    for f in reversed(survivors):  # oldest first
        if total <= max_bytes:
            break
        doomed[f.name] = over
        total -= f.size
    return doomed


def pool_stale_files(
    files: Iterable[SlotFile],
    now: float,
    max_bytes: int,
    max_age_s: float = MAX_AGE_S,
    part_prefix: str = PART_PREFIX,
    keep: Iterable[str] = (),
) -> dict[str, str]:
    """Which files of a pool's shared slot directory to delete, with why (name → reason).

    Unlike :func:`stale_files`, files of other models and ``n_ctx`` stay (pooled engines may
    differ) and foreign names stay (the directory is shared), except a ``part_prefix`` file
    older than ``max_age_s`` (a save cut short). Among Loki slot files: older than
    ``max_age_s`` → ``older than a day``; an older file of the same conversation →
    ``superseded``; then oldest first until the total is at most ``max_bytes`` →
    ``over max_bytes``. Names in ``keep`` (being restored right now) are never deleted.
    """
    kept_names = set(keep)
    doomed: dict[str, str] = {}
    live: list[tuple[SlotFile, SlotKey]] = []
    for f in files:
        if f.name in kept_names:
            continue
        key = parse(f.name)
        if key is None:
            if f.name.startswith(part_prefix) and now - f.mtime > max_age_s:
                doomed[f.name] = "unfinished save"
        elif now - f.mtime > max_age_s:
            doomed[f.name] = (
                "older than a day" if max_age_s == MAX_AGE_S else f"older than {max_age_s:g} s"
            )
        else:
            live.append((f, key))
    doomed.update(_prune(live, max_bytes, "over max_bytes"))
    return doomed


def owner_file(files: Iterable[SlotFile], model: str, n_ctx: int) -> SlotFile | None:
    """The file of the conversation that owned slot 0 last: the newest Loki slot file of
    this model and ``n_ctx`` (only the owner's state is ever saved, so the last save is the
    last owner); None when there is none."""
    mine = [
        f
        for f in files
        if (k := parse(f.name)) is not None and k.model == model and k.n_ctx == n_ctx
    ]
    return max(mine, key=lambda f: (f.mtime, f.name), default=None)


def list_dir(path: Path) -> list[SlotFile]:
    """The plain files of ``path`` (none when it does not exist)."""
    out: list[SlotFile] = []
    try:
        entries = list(path.iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            st = entry.lstat()
        except OSError:
            continue
        if entry.is_file() and not entry.is_symlink():
            out.append(SlotFile(entry.name, st.st_size, st.st_mtime))
    return out
