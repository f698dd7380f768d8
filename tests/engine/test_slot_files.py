"""SLOT_PERSIST's file rules (pure): names keyed by model file, n_ctx, conversation and
prompt fingerprint; which files are stale; which one the slot's last owner left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loki_supervisor import slot_files
from loki_supervisor.engine_process import prepare_slot_dir
from loki_supervisor.slot_files import (
    MAX_AGE_S,
    NO_FINGERPRINT,
    SlotFile,
    SlotKey,
    conversation_key,
    fingerprint_key,
    model_key,
    owner_file,
    parse,
    stale_files,
)

MB = 1024 * 1024
NOW = 1_000_000.0
MODEL = "a" * 12
OTHER_MODEL = "b" * 12


def name(conv: str, fp: str = "f" * 16, model: str = MODEL, n_ctx: int = 4096) -> str:
    return SlotKey(model, n_ctx, conversation_key(conv), fp).filename


def test_name_round_trip_and_llama_cpp_filename_rules():
    key = SlotKey(MODEL, 8192, conversation_key("conv/with spaces é"), "0123456789abcdef")
    assert parse(key.filename) == key
    # llama.cpp's --slot-save-path takes a plain name: no separator, no space, no leading dot
    assert "/" not in key.filename and " " not in key.filename
    assert not key.filename.startswith(".")
    assert parse("part-" + key.filename) is None and parse("stale.bin") is None


def test_model_key_changes_with_the_file(tmp_path: Path):
    a = tmp_path / "m.gguf"
    a.write_bytes(b"GGUF one")
    first = model_key(a)
    assert first == model_key(tmp_path / "." / "m.gguf")  # the resolved path
    a.write_bytes(b"GGUF two, longer")
    assert model_key(a) != first  # size (and mtime) changed: another model
    b = tmp_path / "n.gguf"
    b.write_bytes(b"GGUF one")
    os.utime(b, ns=(a.stat().st_mtime_ns, a.stat().st_mtime_ns))
    assert model_key(b) != model_key(a)  # another path
    with pytest.raises(OSError):
        model_key(tmp_path / "missing.gguf")


@pytest.mark.parametrize(
    "given, expected",
    [
        ("0123456789ABCDEF0123456789abcdef", "0123456789abcdef"),
        ("0123456789abcdef", "0123456789abcdef"),
        (None, NO_FINGERPRINT),
        ("", NO_FINGERPRINT),
        ("not-hex-at-all-xx", NO_FINGERPRINT),
        ("abc", NO_FINGERPRINT),
    ],
)
def test_fingerprint_key(given, expected):
    assert fingerprint_key(given) == expected


def test_conversation_key_is_stable_and_distinct():
    assert conversation_key("c1") == conversation_key("c1")
    assert conversation_key("c1") != conversation_key("c2")
    assert len(conversation_key("c1")) == 12


# name, size MiB, age s, expected reason (None: kept)
CASES = [
    (name("c1"), 10, 10, None),
    ("stale.bin", 1, 10, "foreign file"),
    ("part-" + name("c9"), 1, 10, "foreign file"),
    (name("c2", model=OTHER_MODEL), 1, 10, "other model"),
    (name("c3", n_ctx=2048), 1, 10, "other n_ctx"),
    (name("c4"), 1, MAX_AGE_S + 1, "older than a day"),
    (name("c1", fp="e" * 16), 1, 20, "superseded"),  # c1's older prompt
]


def test_stale_files_rules():
    files = [SlotFile(n, s * MB, NOW - age) for n, s, age, _ in CASES]
    doomed = stale_files(files, MODEL, 4096, NOW, max_bytes=100 * MB)
    assert doomed == {n: why for n, _, _, why in CASES if why is not None}


def test_stale_files_size_limit_drops_the_oldest_first():
    files = [
        SlotFile(name("new"), 40 * MB, NOW - 1),
        SlotFile(name("mid"), 40 * MB, NOW - 2),
        SlotFile(name("old"), 40 * MB, NOW - 3),
    ]
    assert stale_files(files, MODEL, 4096, NOW, max_bytes=100 * MB) == {
        name("old"): "over LOKI_SLOT_PERSIST_MAX_MB"
    }
    assert set(stale_files(files, MODEL, 4096, NOW, max_bytes=50 * MB)) == {
        name("old"),
        name("mid"),
    }
    # a single file above the limit goes too
    assert set(stale_files(files[:1], MODEL, 4096, NOW, max_bytes=10 * MB)) == {name("new")}
    assert stale_files(files, MODEL, 4096, NOW, max_bytes=120 * MB) == {}


def test_owner_file_is_the_newest_of_this_model_and_window():
    files = [
        SlotFile(name("c1"), 1, NOW - 30),
        SlotFile(name("c2"), 1, NOW - 10),
        SlotFile(name("c3", model=OTHER_MODEL), 1, NOW),
        SlotFile(name("c4", n_ctx=2048), 1, NOW),
        SlotFile("stale.bin", 1, NOW),
    ]
    found = owner_file(files, MODEL, 4096)
    assert found is not None and found.name == name("c2")
    assert owner_file(files, MODEL, 1024) is None
    assert owner_file([], MODEL, 4096) is None


def test_prepare_slot_dir_keeps_only_slot_files_when_asked(tmp_path: Path):
    slots = tmp_path / "slots"
    slots.mkdir()
    keep = slots / name("c1")
    keep.write_bytes(b"state")
    (slots / "stale.bin").write_bytes(b"x")
    (slots / "part-x.bin").write_bytes(b"x")
    (slots / "sub").mkdir()
    prepare_slot_dir(slots, slot_files.is_slot_file)
    assert [p.name for p in slots.iterdir()] == [keep.name]
    assert slots.stat().st_mode & 0o777 == 0o700
    prepare_slot_dir(slots)  # SLOT_PERSIST off: emptied, as before the key
    assert list(slots.iterdir()) == []


def test_a_shared_slot_dir_keeps_the_mode_its_operator_gave_it(tmp_path: Path):
    """Issue 44: the pool's LOKI_ENGINE_SLOT_DIR is read and written by every engine (other
    users, other machines): a launch leaves its mode alone and keeps its files; a missing
    one is made 0700 like Loki's own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    other = shared / "engine-b-slot.bin"
    other.write_bytes(b"state")
    prepare_slot_dir(shared, lambda _name: True, shared=True)
    assert shared.stat().st_mode & 0o7777 == 0o2775 and other.exists()
    fresh = tmp_path / "fresh"
    prepare_slot_dir(fresh, lambda _name: True, shared=True)
    assert fresh.stat().st_mode & 0o777 == 0o700


def test_list_dir(tmp_path: Path):
    (tmp_path / "a.bin").write_bytes(b"12345")
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a.bin")
    listed = slot_files.list_dir(tmp_path)
    assert [(f.name, f.size) for f in listed] == [("a.bin", 5)]
    assert slot_files.list_dir(tmp_path / "missing") == []
