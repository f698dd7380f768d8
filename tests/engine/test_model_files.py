"""The model-file list of the preset editor (``LOKI_MODEL_DIRS``): real GGUF files (the bundled
model) read for their architecture, a broken file named ``.gguf`` shown with its error, later
parts of a split model left out, directories that do not exist reported."""

from __future__ import annotations

import os
from pathlib import Path

from loki_shared import servers
from loki_supervisor.model_files import list_model_files, parse_dirs


def test_parse_dirs_accepts_colons_and_commas():
    assert parse_dirs(" /a:/b , /c,, ") == [Path("/a"), Path("/b"), Path("/c")]
    assert parse_dirs("") == []


def test_lists_gguf_files_with_size_and_architecture(tmp_path: Path):
    bundled = servers.find_bundled_model()
    (tmp_path / "sub").mkdir()
    os.symlink(bundled, tmp_path / "sub" / "small.gguf")
    os.symlink(bundled, tmp_path / "big-00001-of-00002.gguf")
    os.symlink(bundled, tmp_path / "big-00002-of-00002.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf at all")
    (tmp_path / "notes.txt").write_text("x")
    found = list_model_files([tmp_path, tmp_path / "missing"])
    assert found["dirs"] == [
        {"path": str(tmp_path), "exists": True},
        {"path": str(tmp_path / "missing"), "exists": False},
    ]
    by_name = {f["name"]: f for f in found["files"]}
    assert sorted(by_name) == ["big-00001-of-00002.gguf", "broken.gguf", "small.gguf"]
    small = by_name["small.gguf"]
    assert small["path"] == str(tmp_path / "sub" / "small.gguf")
    assert small["size_bytes"] == bundled.stat().st_size and small["architecture"] == "llama"
    assert by_name["broken.gguf"]["architecture"] is None and by_name["broken.gguf"]["error"]
    assert found["bundled"]["path"] == str(bundled)
    assert found["bundled"]["architecture"] == "llama" and not found["truncated"]


def test_a_directory_listed_twice_lists_its_files_once(tmp_path: Path):
    (tmp_path / "a").mkdir()
    os.symlink(servers.find_bundled_model(), tmp_path / "a" / "m.gguf")
    found = list_model_files([tmp_path / "a", tmp_path / "a", tmp_path])
    assert [f["name"] for f in found["files"]].count("m.gguf") == 1
