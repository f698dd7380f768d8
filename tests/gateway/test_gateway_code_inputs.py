"""The Code panel's workspace routes fed names and files from the world (issue 43), against
the REAL workspace service (the fixtures of :mod:`tests.gateway.test_gateway_code_workspace`):
names with spaces (a trailing one too), a leading ``-``, composed or decomposed accents; a
text file in another encoding than UTF-8; a home path; a clone source with a NUL or with
hooks and repository configuration naming programs — each listed and shown, or refused with
a 4xx that names what to resend; nothing a repository names runs outside the sandbox."""

from __future__ import annotations

import os
import subprocess
import unicodedata
from pathlib import Path

from tests.gateway.test_gateway_code_workspace import (  # noqa: F401 - fixtures
    _git_repo,
    api,
    code,
    error_of,
    workspace_service,
)

NAMES = (
    "my notes.txt",
    "trailing space.txt ",
    "-rf.txt",
    "--help.md",
    unicodedata.normalize("NFD", "café.txt"),
)


def test_odd_names_are_listed_and_shown(api, peers, code, tmp_path):  # noqa: F811
    ws = code.workspace("gwnames")
    ws.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (ws / name).write_text(f"text of {name}\n")
    (ws / "latin.c").write_bytes("/* café */\n".encode("latin-1"))
    cid = peers.new_conv("odd names").info.id
    code.code_mode(cid, "gwnames")
    r = api.get("/api/chat/files", params={"conversation": cid})
    assert r.status_code == 200, r.text
    listed = {e["path"] for e in r.json()["entries"]}
    assert set(NAMES) <= listed
    for name in NAMES:
        r = api.get("/api/chat/files/content", params={"conversation": cid, "path": name})
        assert r.status_code == 200, (name, r.text)
        assert r.json()["text"] == f"text of {name}\n", name
    nfc = unicodedata.normalize("NFC", "café.txt")  # as a person types it
    r = api.get("/api/chat/files/content", params={"conversation": cid, "path": nfc})
    assert r.status_code == 200, r.text
    r = api.get("/api/chat/files/content", params={"conversation": cid, "path": "latin.c"})
    assert r.status_code == 200, r.text
    assert "iso-8859-1" in r.json()["note"] and "binary" not in r.json()["note"].lower()
    err = error_of(
        api.get("/api/chat/files/content", params={"conversation": cid, "path": "~/x"}), 400
    )
    assert "~" in err["message"]


def test_a_clone_source_with_a_nul_or_with_hooks(api, tmp_path):  # noqa: F811
    sandbox = api.get("/api/workspace", params={"project": "probe"}).json()["sandbox"]
    err = error_of(
        api.post("/api/workspace", json={"project": "gwnul", "clone_from": "/tmp/\0x"}), 400
    )
    assert "NUL" in err["message"]
    if not sandbox:
        return
    source = _git_repo(tmp_path / "hooked")
    marker = tmp_path / "ran-on-the-host"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    for name in ("post-checkout", "post-merge", "pre-commit", "fsmonitor-watchman"):
        path = source / ".git" / "hooks" / name
        path.write_text(hook)
        path.chmod(0o755)
    for key, value in (
        ("core.fsmonitor", str(source / ".git" / "hooks" / "fsmonitor-watchman")),
        ("core.hooksPath", str(source / ".git" / "hooks")),
        ("filter.x.smudge", f"touch {marker}; cat"),
    ):
        subprocess.run(["git", "-C", str(source), "config", key, value], check=True)
    (source / ".gitattributes").write_text("* filter=x\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x.invalid"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x.invalid"}
    subprocess.run(["git", "-C", str(source), "add", "-A"], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(source), "-c", "core.hooksPath=/dev/null", "commit", "-qm", "attrs"],
        check=True,
        env=env,
    )
    marker.unlink(missing_ok=True)
    r = api.post("/api/workspace", json={"project": "gwhooked", "clone_from": str(source)})
    assert r.status_code == 201, r.text
    info = api.get("/api/workspace", params={"project": "gwhooked"})
    assert info.status_code == 200 and info.json()["head"], info.text
    assert not marker.exists()
    assert not Path(str(marker)).exists()
