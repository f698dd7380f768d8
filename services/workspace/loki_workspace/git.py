"""The ``git`` tool: ``status``, ``diff``, ``commit``, ``log`` of a workspace, each run in the
sandbox like any command (a repository's configuration can name programs: they run there,
not in the service). Commits are made by "Loki" (author and committer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loki_shared.errors import InvalidRequest
from loki_shared.messages.workspace import GitRequest

from . import paths

#: Who commits: git's author and committer variables, set in the sandbox for every git run.
IDENTITY: Mapping[str, str] = {
    "GIT_AUTHOR_NAME": "Loki",
    "GIT_AUTHOR_EMAIL": "loki@localhost",
    "GIT_COMMITTER_NAME": "Loki",
    "GIT_COMMITTER_EMAIL": "loki@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}
#: Every git run's prefix: no pager.
GIT = ("git", "--no-pager")
#: Said first in each sandbox (its ``HOME`` is a fresh ``/tmp``): any repository is safe
#: whoever owns it — git's own check refuses a clone's source owned by another user, and a
#: ``-c safe.directory`` on the command line does not reach the process reading the source.
TRUST = "git config --global --add safe.directory '*'"


def trusted(argv: Sequence[str]) -> list[str]:
    """``argv`` (a git command line) run after :data:`TRUST`."""
    return ["sh", "-c", TRUST + ' && exec "$@"', "git", *argv]


def commands(req: GitRequest) -> list[list[str]]:
    """The git command lines ``req`` runs, in order (each in the sandbox, :func:`trusted`;
    the first to fail ends the sequence): ``commit`` is ``add`` then ``commit``.

    Raises:
        InvalidRequest: ``commit`` without ``message``; a path that :func:`paths.parts`
            refuses (Forbidden for one leaving the workspace).
    """
    named = [paths.display(paths.parts(p)) for p in req.paths]
    if req.op == "status":
        return [[*GIT, "status", "--short", "--branch"]]
    if req.op == "diff":
        staged = ["--staged"] if req.staged else []
        return [[*GIT, "diff", "--stat", "--patch", *staged, "--", *named]]
    if req.op == "log":
        fmt = "--format=%h %ad %an: %s"
        return [[*GIT, "log", f"-n{req.limit}", "--date=iso", fmt]]
    if not req.message or not req.message.strip():
        raise InvalidRequest("commit needs 'message' (what the change does, one line or more)")
    add: list[str] = [*GIT, "add", "-A", "--", *named] if named else [*GIT, "add", "-A"]
    commit: list[str] = [*GIT, "commit", "-m", req.message]
    return [add, commit + (["--", *named] if named else [])]


def info_script() -> Sequence[str]:
    """A command printing a workspace's branch, head commit and whether it is dirty, three
    parts separated by ``@@`` lines (:func:`parse_info`)."""
    script = (
        f"{TRUST}; git symbolic-ref --short -q HEAD; echo @@; "
        "git rev-parse -q --verify HEAD; echo @@; git status --porcelain | head -n 1"
    )
    return ["sh", "-c", script]


def parse_info(output: str) -> tuple[str, str, bool]:
    """(branch, head, dirty) from :func:`info_script`'s output ("" for what is missing)."""
    parts = (output.split("@@\n") + ["", "", ""])[:3]
    branch, head, status = (p.strip() for p in parts)
    return branch, head, bool(status)
