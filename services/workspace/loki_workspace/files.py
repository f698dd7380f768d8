"""The file tools over one workspace: ``list``, ``glob``, ``grep``, ``read``, ``write``,
``edit``. They run in the service (no sandbox needed: no program of the workspace runs), on
paths checked by :mod:`.paths`, and open each file component by component below the
workspace's root without following a symlink (``O_NOFOLLOW``): a symlink swapped in by a
command between the check and the open is refused, never followed.

Shapes are the contract's (:mod:`loki_shared.messages.workspace`); sizes are bytes.
"""

from __future__ import annotations

import contextlib
import errno
import mimetypes
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from loki_shared.errors import Conflict, Forbidden, InvalidRequest, NotFound
from loki_shared.messages.workspace import (
    FileEntry,
    FilesReply,
    FilesRequest,
    GrepMatch,
    ReadReply,
    ReadRequest,
    WriteReply,
    WriteRequest,
)

from . import paths

#: Bytes looked at to tell text from binary (a NUL in them is binary).
SNIFF = 8192
#: The largest file read whole to cut lines from it, or searched by grep.
SCAN_MAX = 32 * 1024 * 1024
#: Entries a list, glob or grep walks at most (a workspace of a million files stays bounded).
WALK_MAX = 200_000
#: Characters of a grep match's line kept.
LINE_MAX = 500
#: Known signatures of binary formats: (leading bytes, MIME type).
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\x7fELF", "application/x-executable"),
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: One lock per workspace root: an edit reads, changes and writes a file while no other
#: write of that workspace runs (two conversations of one project editing one file at once
#: both get their change; none reads a file half written).
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def workspace_lock(root: Path) -> threading.Lock:
    """The lock of the workspace at ``root`` (made on first use)."""
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(str(root), threading.Lock())


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each with its ``\n`` (the last one may have none), cut at ``\n``
    only — as an editor, ``grep -n`` and ``sed`` count them: a form feed, a lone ``\r`` or a
    U+2028 inside a line (minified code) does not start another."""
    out = [line + "\n" for line in text.split("\n")]
    out[-1] = out[-1][:-1]
    return out if out[-1] else out[:-1]


@dataclass(frozen=True)
class Caps:
    """The file tools' caps: ``read_max`` (bytes of text one read returns) and
    ``write_max`` (the largest file written)."""

    read_max: int
    write_max: int


def sniff_mime(head: bytes, name: str) -> str:
    """What a file that is not UTF-8 text looks like: its signature's MIME type; text in
    another encoding as ``text/plain; charset=...`` (``utf-16`` after its byte-order mark,
    ``iso-8859-1`` for 8-bit text without a NUL: Latin-1, Windows-1252...); else the name's
    guess, else ``application/octet-stream``. (A WebP is ``RIFF....WEBP``.)"""
    for magic, mime in MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "text/plain; charset=utf-16"
    if (
        head
        and b"\0" not in head[:SNIFF]
        and not any(0 < b < 9 or 13 < b < 27 for b in head[:SNIFF])
    ):
        return "text/plain; charset=iso-8859-1"
    guess, _ = mimetypes.guess_type(name)
    return guess or "application/octet-stream"


def is_text(data: bytes) -> bool:
    """Whether ``data`` reads as UTF-8 text: no NUL in its first :data:`SNIFF` bytes and
    valid UTF-8 (a character cut at the end of a partial read is allowed)."""
    if b"\0" in data[:SNIFF]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(data) - 3 and exc.reason == "unexpected end of data"
    return True


def line_ends(text: str, old: str, new: str) -> tuple[str, str]:
    """(``old``, ``new``) in the line ends of ``text`` when ``old`` is found only so: a
    model sends ``\n`` for a file written with ``\r\n`` (Windows) and the other way
    round; the file keeps its own."""
    if old in text:
        return old, new
    if "\r\n" in text and "\r\n" not in old and "\n" in old:
        crlf = old.replace("\n", "\r\n")
        if crlf in text:
            return crlf, new.replace("\r\n", "\n").replace("\n", "\r\n")
    if "\r\n" in old:
        lf = old.replace("\r\n", "\n")
        if lf in text:
            return lf, new.replace("\r\n", "\n")
    return old, new


class Files:
    """The file tools over the workspace whose real, absolute root is ``root``.

    Args:
        root: the workspace's folder (resolved: no symlink in it).
        caps: the read and write caps.
        owner: (uid, gid) given to what a write creates (the sandbox's user when the
            service runs as root), None: left as created.
    """

    def __init__(self, root: Path, caps: Caps, owner: tuple[int, int] | None) -> None:
        self.root = root
        self.caps = caps
        self.owner = owner
        #: ``time.monotonic()`` past which a grep stops and answers what it found, said
        #: ``truncated`` (None: no bound; set by :mod:`.search`'s child process).
        self.deadline: float | None = None
        #: Whether a search stopped at :attr:`deadline` (its reply is ``truncated``).
        self.stopped = False

    # --- opening below the root -----------------------------------------------------------
    @contextlib.contextmanager
    def _dir(self, rel: tuple[str, ...], make: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``rel`` (resolved components), opened one component at
        a time without following a symlink; ``make``: missing folders are created.

        Raises:
            Forbidden: a component is (now) a symlink.
            NotFound: a folder is missing (and ``make`` is false).
            InvalidRequest: a component is a file.
        """
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for i, part in enumerate(rel):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise NotFound(f"no folder {paths.display(rel[: i + 1])!r}") from None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    self._own(nxt)
                except OSError as exc:
                    raise self._refused(rel[: i + 1], exc) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def _refused(self, rel: tuple[str, ...], exc: OSError) -> Exception:
        where = paths.display(rel)
        if isinstance(exc, NotADirectoryError):
            return InvalidRequest(f"{where!r} is a file, not a folder")
        if exc.errno == errno.ELOOP:  # a symlink appeared where the check saw none
            return Forbidden(f"{where!r} changed into a symlink: refused")
        return InvalidRequest(f"{where!r}: {exc.strerror}")

    def _own(self, fd: int) -> None:
        if self.owner is not None:
            os.fchown(fd, *self.owner)

    def _open_file(self, rel: tuple[str, ...]) -> int:
        """A read-only descriptor of the regular file ``rel``.

        Raises: NotFound, InvalidRequest (a folder, not a regular file), Forbidden."""
        if not rel:
            raise InvalidRequest("'.' is the workspace's root folder: name a file to read")
        with self._dir(rel[:-1]) as parent:
            try:
                # O_NONBLOCK: a FIFO a command made would block the open until a writer came
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                fd = os.open(rel[-1], flags, dir_fd=parent)
            except FileNotFoundError:
                raise NotFound(f"no file {paths.display(rel)!r}") from None
            except OSError as exc:
                raise self._refused(rel, exc) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidRequest(f"{paths.display(rel)!r} is not a file: list a folder instead")
        return fd

    def _read_bytes(self, rel: tuple[str, ...], cap: int) -> tuple[bytes, int]:
        """(at most ``cap`` bytes of the file ``rel``, its size)."""
        fd = self._open_file(rel)
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return fh.read(cap), size

    # --- read ------------------------------------------------------------------------------
    def read(self, req: ReadRequest) -> ReadReply:
        """Lines ``offset`` .. ``offset + limit - 1`` of ``req.path`` (within
        ``caps.read_max`` bytes; ``truncated`` when the cap cut them), or for a binary file
        ``binary`` with its ``mime`` and no text.

        Raises: Forbidden, InvalidRequest, NotFound (see :mod:`.paths`)."""
        rel, _ = paths.resolve(self.root, req.path)
        with workspace_lock(self.root):
            data, size = self._read_bytes(rel, SCAN_MAX)
        shown = paths.display(rel)
        if not is_text(data):
            return ReadReply(path=shown, size=size, binary=True, mime=sniff_mime(data, rel[-1]))
        lines = split_lines(data.decode("utf-8", "replace"))
        total = len(lines)
        first = req.offset
        if total and first > total:
            raise InvalidRequest(
                f"offset {first} is past the end of {shown!r} ({total} lines): resend a smaller one"
            )
        chosen = lines[first - 1 : (first - 1 + req.limit) if req.limit else None]
        kept: list[str] = []
        used = 0
        cut = False
        for line in chosen:
            n = len(line.encode("utf-8"))
            if used + n > self.caps.read_max:
                if not kept:  # one enormous line (minified code): its head, said cut
                    kept.append(line.encode()[: self.caps.read_max].decode("utf-8", "ignore"))
                    cut = True
                break
            kept.append(line)
            used += n
        truncated = cut or len(kept) < len(chosen) or size > len(data)
        return ReadReply(
            path=shown,
            text="".join(kept),
            first_line=first if kept else 0,
            last_line=first + len(kept) - 1 if kept else 0,
            total_lines=total,
            size=size,
            truncated=truncated,
        )

    # --- write, edit -------------------------------------------------------------------------
    def write(self, req: WriteRequest) -> WriteReply:
        """``write``: ``content`` replaces ``path`` (folders made); ``edit``: ``old`` becomes
        ``new`` (once, or everywhere with ``replace_all``).

        Raises:
            InvalidRequest: a missing field, a folder, a file too big, a binary file edited.
            Forbidden: a path outside the workspace or inside ``.git``.
            NotFound: ``edit`` of a missing file.
            Conflict: ``edit`` whose ``old`` is absent, or found several times without
                ``replace_all`` (nothing written).
        """
        rel, _ = paths.resolve(self.root, req.path)
        if not rel:
            raise InvalidRequest("'.' is the workspace's root folder: name a file to write")
        if paths.touches_git(rel):
            raise Forbidden(f"{req.path!r} is inside .git: the repository is changed with git")
        if "\\" in req.path and not os.path.lexists(self.root.joinpath(*rel)):
            raise InvalidRequest(
                f"path {req.path!r} holds a backslash: folders are separated by '/' here "
                f"(e.g. {req.path.replace(chr(92), '/')!r}); resend it so"
            )
        if req.op == "write":
            if req.content is None:
                raise InvalidRequest("write needs 'content' (the file's whole new text)")
            with workspace_lock(self.root):
                return self._store(rel, req.content, replacements=0)
        if req.old is None or req.new is None or req.old == "":
            raise InvalidRequest("edit needs 'old' (non-empty, exact text) and 'new'")
        if req.old == req.new:
            raise InvalidRequest(
                "'old' and 'new' are the same text: nothing would change; resend 'new' with "
                "the change"
            )
        with workspace_lock(self.root):
            return self._edit(rel, req)

    def _edit(self, rel: tuple[str, ...], req: WriteRequest) -> WriteReply:
        assert req.old is not None and req.new is not None
        data, size = self._read_bytes(rel, self.caps.write_max + 1)
        if size > self.caps.write_max or not is_text(data):
            raise InvalidRequest(
                f"{paths.display(rel)!r} is not UTF-8 text ({sniff_mime(data, rel[-1])}): edit "
                "changes UTF-8 text only; change it with run (e.g. sed), or convert it first "
                "(iconv) if the user agrees"
            )
        text = data.decode("utf-8")
        old, new = line_ends(text, req.old, req.new)
        count = text.count(old)
        if count == 0:
            raise Conflict(
                f"'old' was not found in {paths.display(rel)!r}: read the file and resend "
                "the exact text (spaces and line ends included)"
            )
        if count > 1 and not req.replace_all:
            raise Conflict(
                f"'old' occurs {count} times in {paths.display(rel)!r}: add surrounding lines "
                "to make it unique, or set replace_all"
            )
        return self._store(rel, text.replace(old, new), replacements=count)

    def _store(self, rel: tuple[str, ...], text: str, replacements: int) -> WriteReply:
        data = text.encode("utf-8")
        if len(data) > self.caps.write_max:
            raise InvalidRequest(
                f"{len(data)} bytes is more than the {self.caps.write_max} a file may have here"
            )
        with self._dir(rel[:-1], make=True) as parent:
            flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO: ENXIO
            try:
                fd = os.open(rel[-1], flags | os.O_TRUNC, dir_fd=parent)
                created = False
            except FileNotFoundError:
                fd = os.open(rel[-1], flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=parent)
                created = True
                self._own(fd)
            except IsADirectoryError:
                raise InvalidRequest(f"{paths.display(rel)!r} is a folder") from None
            except OSError as exc:
                raise self._refused(rel, exc) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise InvalidRequest(f"{paths.display(rel)!r} is not a regular file: not written")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        return WriteReply(
            path=paths.display(rel), created=created, size=len(data), replacements=replacements
        )

    # --- list, glob, grep ---------------------------------------------------------------------
    def walk(
        self, base: tuple[str, ...], depth: int
    ) -> Iterator[tuple[tuple[str, ...], FileEntry]]:
        """The entries below ``base`` (resolved components), ``depth`` levels, sorted, never
        ``.git`` and never through a symlink (a symlink is an entry of kind ``symlink``);
        at most :data:`WALK_MAX`.

        Raises: NotFound, InvalidRequest (``base`` is a file), Forbidden."""
        seen = 0

        def scan(rel: tuple[str, ...], level: int) -> Iterator[tuple[tuple[str, ...], FileEntry]]:
            nonlocal seen
            found: list[tuple[str, str, int]] = []  # (name, kind, size), read while open
            with self._dir(rel) as fd, os.scandir(fd) as it:
                for entry in it:
                    if entry.is_symlink():
                        found.append((entry.name, "symlink", 0))
                    elif entry.is_dir(follow_symlinks=False):
                        found.append((entry.name, "dir", 0))
                    elif entry.is_file(follow_symlinks=False):
                        size = entry.stat(follow_symlinks=False).st_size
                        found.append((entry.name, "file", size))
            for name, kind, size in sorted(found):
                if name == paths.GIT_DIR:
                    continue
                seen += 1
                if seen > WALK_MAX:
                    return
                child = (*rel, name)
                yield child, FileEntry(path=paths.display(child), kind=kind, size=size)  # type: ignore[arg-type]
                if kind == "dir" and level < depth:
                    yield from scan(child, level + 1)

        yield from scan(base, 1)

    def files(self, req: FilesRequest) -> FilesReply:
        """``list``, ``glob`` or ``grep`` (see
        :class:`~loki_shared.messages.workspace.FilesRequest`), at most ``max_results``.

        Raises:
            InvalidRequest: a missing or invalid ``pattern`` (glob, grep), a bad ``include``.
            Forbidden, NotFound: see :mod:`.paths`.
        """
        base, _ = paths.resolve(self.root, req.path)
        if req.op == "list":
            return self._collect((e for _, e in self.walk(base, req.depth)), req.max_results)
        if not req.pattern:
            raise InvalidRequest(f"{req.op} needs 'pattern'")
        if req.op == "glob":
            rx = paths.glob_regex(req.pattern)
            walked = self._until_deadline(self.walk(base, 64))
            found = (
                e for rel, e in walked if e.kind == "file" and rx.match(paths.under(base, rel))
            )
            reply = self._collect(found, req.max_results)
            reply.truncated = reply.truncated or self.stopped
            return reply
        return self._grep(base, req)

    def _until_deadline(
        self, items: Iterator[tuple[tuple[str, ...], FileEntry]]
    ) -> Iterator[tuple[tuple[str, ...], FileEntry]]:
        """``items`` until :attr:`deadline` (then :attr:`stopped` is set)."""
        for item in items:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.stopped = True
                return
            yield item

    @staticmethod
    def _collect(items: Iterator[FileEntry], limit: int) -> FilesReply:
        out: list[FileEntry] = []
        for item in items:
            if len(out) == limit:
                return FilesReply(entries=out, truncated=True)
            out.append(item)
        return FilesReply(entries=out)

    def _grep(self, base: tuple[str, ...], req: FilesRequest) -> FilesReply:
        assert req.pattern is not None
        try:
            rx = re.compile(req.pattern)
        except re.error as exc:
            raise InvalidRequest(f"grep pattern {req.pattern!r}: {exc} — resend it fixed") from None
        include = paths.glob_regex(req.include) if req.include else None
        try:
            mode = os.lstat(self.root.joinpath(*base)).st_mode
        except FileNotFoundError:
            raise NotFound(f"no file or folder {paths.display(base)!r}") from None
        if base and stat.S_ISREG(mode):
            file = FileEntry(path=paths.display(base), kind="file")
            return self.grep_files([(base, file)], rx, req.max_results)
        targets = (  # walked as searched: a deadline stops both
            (rel, e)
            for rel, e in self.walk(base, 64)
            if e.kind == "file"
            and e.size <= SCAN_MAX
            and (include is None or include.match(paths.under(base, rel)))
        )
        return self.grep_files(targets, rx, req.max_results)

    def grep_files(
        self,
        targets: Iterable[tuple[tuple[str, ...], FileEntry]],
        rx: re.Pattern[str],
        limit: int,
    ) -> FilesReply:
        matches: list[GrepMatch] = []
        for rel, entry in targets:
            if self.deadline is not None and time.monotonic() > self.deadline:
                return FilesReply(matches=matches, truncated=True)  # too wide: what was found
            try:
                data, _ = self._read_bytes(rel, SCAN_MAX)
            except (NotFound, InvalidRequest, Forbidden):
                continue
            if not is_text(data):
                continue
            for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
                line = line.removesuffix("\r")
                if rx.search(line):
                    if len(matches) == limit:
                        return FilesReply(matches=matches, truncated=True)
                    matches.append(GrepMatch(path=entry.path, line=number, text=line[:LINE_MAX]))
        return FilesReply(matches=matches)
