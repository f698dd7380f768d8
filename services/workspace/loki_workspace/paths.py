"""The rules a workspace path obeys (pure, but for :func:`resolve`, which asks the file system
where a path's symlinks lead).

A path comes from the model or a person: relative to the workspace's root, POSIX form. It is
refused before anything is touched when it is absolute, holds a NUL, or has a ``..`` that
climbs above the root (``a/../../x``); then it is resolved on the disk, symlinks followed,
and refused when the result is outside the root (a symlink to ``/etc/passwd`` made by a
command). Refusals are :class:`~loki_shared.errors.Forbidden`, except a malformed path
(NUL, empty) which is :class:`~loki_shared.errors.InvalidRequest`.

File tools never write inside ``.git`` (a repository's internals are git's: hooks written
there would run at the next commit, in the sandbox, but still unasked); they never list it
either.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from loki_shared.errors import Forbidden, InvalidRequest

#: The repository's own folder: never listed, never written by the file tools.
GIT_DIR = ".git"
#: Where commands see the workspace (the sandbox's ``/workspace``, what ``pwd`` prints): a
#: path under it is refused like any absolute one, its refusal giving the relative path.
SANDBOX_ROOT = "/workspace"


def parts(path: str) -> tuple[str, ...]:
    """``path``'s components after the lexical rules, ``.`` and empty ones dropped, each ``..``
    taking back the one before it (``"a/./b/../c"`` -> ``("a", "c")``; ``"."`` -> ``()``).

    Raises:
        InvalidRequest: ``path`` holds a NUL character.
        Forbidden: ``path`` is absolute, or a ``..`` climbs above the workspace's root.
    """
    if "\0" in path:
        raise InvalidRequest(f"path {path!r} holds a NUL character: resend it without")
    if path == SANDBOX_ROOT or path.startswith(SANDBOX_ROOT + "/"):
        inner = path[len(SANDBOX_ROOT) :].strip("/") or "."
        raise Forbidden(
            f"path {path!r} is absolute ({SANDBOX_ROOT} is the workspace as commands see it): "
            f"give it relative to the workspace's root: {inner!r}"
        )
    if path.startswith("/"):
        raise Forbidden(
            f"path {path!r} is absolute: give it relative to the workspace's root, e.g. 'src/x.py'"
        )
    if path == "~" or path.startswith("~/"):
        raise InvalidRequest(
            f"path {path!r} names a home folder: the workspace has none; give the path "
            "relative to the workspace's root, e.g. 'notes.txt'"
        )
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise Forbidden(f"path {path!r} leaves the workspace (a '..' above its root)")
            out.pop()
            continue
        out.append(part)
    return tuple(out)


def is_inside(root: str, target: str) -> bool:
    """Whether the absolute, normalised path ``target`` is ``root`` or below it."""
    return target == root or target.startswith(root.rstrip("/") + "/")


def touches_git(rel: tuple[str, ...]) -> bool:
    """Whether a workspace-relative path (its :func:`parts`) is inside a ``.git`` folder."""
    return GIT_DIR in rel


def resolve(root: Path, path: str) -> tuple[tuple[str, ...], Path]:
    """``path`` (as sent) checked by :func:`parts`, then resolved on the disk below ``root``
    (the workspace's real, absolute root): every symlink followed, a missing tail kept as
    written.

    Returns:
        (the resolved path's components relative to ``root``, the resolved absolute path).

    Raises:
        InvalidRequest, Forbidden: see :func:`parts`; Forbidden also when a symlink leads
            outside ``root``.
    """
    rel = on_disk(root, parts(path))
    real = os.path.realpath(os.path.join(root, *rel)) if rel else str(root)
    if not is_inside(str(root), real):
        raise Forbidden(
            # the target is not named: it is a path of the service's host (LOKI_HOME's
            # folder...), which the model has no business learning
            f"path {path!r} leads outside the workspace (through a symlink): "
            "only the workspace's own files can be used"
        )
    inner = os.path.relpath(real, root)
    return (() if inner == "." else tuple(inner.split("/"))), Path(real)


def on_disk(root: Path, rel: tuple[str, ...]) -> tuple[str, ...]:
    """``rel`` with each component that does not exist as written replaced by the entry of
    its folder that is the same name in another Unicode form (``café`` composed, NFC, as a
    model writes it; decomposed, NFD, as a clone made on macOS may hold it), so that a name
    reaches the file it shows and a write never makes a second file that looks the same.
    Components are kept as written when no entry matches (a file to create)."""
    out: list[str] = []
    folder = str(root)
    for i, part in enumerate(rel):
        here = os.path.join(folder, part)
        if not os.path.lexists(here) and not part.isascii():
            want = unicodedata.normalize("NFC", part)
            try:
                names = os.listdir(folder)
            except OSError:  # not a folder (yet): the open says so
                return (*out, *rel[i:])
            part = next((n for n in names if unicodedata.normalize("NFC", n) == want), part)
            here = os.path.join(folder, part)
        out.append(part)
        folder = here
    return tuple(out)


def display(rel: tuple[str, ...]) -> str:
    """A path's components as the workspace-relative POSIX path a reply gives (``.`` for
    the root)."""
    return "/".join(rel) or "."


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regular expression matching the workspace-relative paths that the glob
    ``pattern`` names: ``**`` any number of folders (``src/**/*.py`` matches
    ``src/a.py`` and ``src/a/b.py``), ``*`` and ``?`` within one component, ``[...]`` a
    character class; a pattern without ``/`` matches a file's name at any depth
    (``*.py`` is ``**/*.py``).

    Raises:
        InvalidRequest: ``pattern`` is empty or absolute, or its ``[...]`` is not a valid
            class (``[z-a]``).
    """
    if not pattern or pattern.startswith("/"):
        raise InvalidRequest(f"glob {pattern!r}: give a relative pattern, e.g. 'src/**/*.py'")
    given = pattern
    if "/" not in pattern:
        pattern = "**/" + pattern
    while "**/**/" in pattern:  # the same folders, and no backtracking over them
        pattern = pattern.replace("**/**/", "**/")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as exc:
        raise InvalidRequest(f"glob {given!r}: {exc} — resend it fixed") from None


def under(base: tuple[str, ...], rel: tuple[str, ...]) -> str:
    """``rel`` relative to the folder ``base`` (both workspace-relative components), as a
    POSIX path: what a glob below ``base`` is matched against."""
    return "/".join(rel[len(base) :])
