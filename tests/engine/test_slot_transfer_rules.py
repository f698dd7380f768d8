"""Slot transfer's decisions without an engine (llama.cpp's slot API answered by an
in-process transport that writes and reads the files as llama-server does): when nothing is
saved, which file is restored, how a save racing a grant ends, and the pool's directory
rules (:func:`~loki_supervisor.slot_files.pool_stale_files`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import httpx
import pytest

from loki_supervisor import slot_files, slot_transfer
from loki_supervisor.slot_files import SlotFile, pool_stale_files
from loki_supervisor.slot_transfer import (
    EngineRef,
    GrantFacts,
    Occupant,
    SlotTransfer,
    TransferOutcome,
)

ENGINE = EngineRef("A", "http://a.test", "key-a", "/models/m.gguf", 2048)
OTHER = EngineRef("B", "http://b.test", None, "/models/m.gguf", 2048)
FPS = tuple(f"{i:02x}" * 16 for i in range(1, 7))  # six cumulative fingerprints


class SlotApi:
    """``POST /slots/{id}?action=save|restore``: a save writes the named file (``n_saved``
    100); a restore of a missing file is a 400. ``gate``: saves wait for it."""

    def __init__(self, slot_dir: Path) -> None:
        self.slot_dir = slot_dir
        self.calls: list[tuple[str, str, str, str | None]] = []
        self.gate: asyncio.Event | None = None
        self.saving = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        action = request.url.params["action"]
        filename = json.loads(request.content)["filename"]
        auth = request.headers.get("authorization")
        self.calls.append((action, request.url.host, filename, auth))
        path = self.slot_dir / filename
        if action == "save":
            self.saving.set()
            if self.gate is not None:
                await self.gate.wait()
            path.write_bytes(b"state" * 10)
            return httpx.Response(200, json={"id_slot": 0, "n_saved": 100, "n_written": 50})
        if not path.exists():
            return httpx.Response(400, json={"error": {"message": "Unable to restore slot"}})
        return httpx.Response(200, json={"id_slot": 0, "n_restored": 321, "n_read": 50})

    def actions(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def api(tmp_path: Path) -> SlotApi:
    return SlotApi(tmp_path)


@pytest.fixture
async def transfer(tmp_path: Path, api: SlotApi):
    t = SlotTransfer(tmp_path, httpx.AsyncClient(transport=httpx.MockTransport(api)))
    yield t
    await t.close()


def name(engine: EngineRef, conversation: str, fp: str, n_ctx: int | None = None) -> str:
    return slot_files.SlotKey(
        engine.file_model,
        engine.n_ctx if n_ctx is None else n_ctx,
        slot_files.conversation_key(conversation),
        slot_files.fingerprint_key(fp),
    ).filename


def grant(**kw) -> GrantFacts:
    base = {
        "engine": ENGINE,
        "id_slot": 1,
        "kind": "main",
        "conversation": "conv-x",
        "fingerprints": FPS,
        "prefix": 0,
        "occupant": None,
        "moved_from": None,
    }
    base.update(kw)
    return GrantFacts(**base)


async def test_off_without_a_slot_dir(api: SlotApi):
    t = SlotTransfer(None, httpx.AsyncClient(transport=httpx.MockTransport(api)))
    assert not t.enabled
    occupant = Occupant("conv-y", FPS[:2], saved=False)
    out = await t.before_grant(grant(occupant=occupant, moved_from="B"))
    assert out == TransferOutcome()
    t.after_release(ENGINE, 1, "conv-x", FPS, lambda: True, lambda fp: None)
    await t.close()
    assert api.calls == []


async def test_evict_save_writes_a_temporary_name_then_renames(transfer, api, tmp_path):
    occupant = Occupant("conv-y", FPS[:3], saved=False)
    out = await transfer.before_grant(grant(conversation="conv-z", occupant=occupant))
    assert out == TransferOutcome(saved_occupant=True)
    final = name(ENGINE, "conv-y", FPS[2])
    ((action, host, filename, auth),) = api.calls
    assert (action, host, auth) == ("save", "a.test", "Bearer key-a")
    assert filename.startswith(slot_files.PART_PREFIX) and filename.endswith(final)
    assert sorted(os.listdir(tmp_path)) == [final]
    assert transfer.last["file"] == final and transfer.counts["saves"] == 1


@pytest.mark.parametrize(
    "occupant",
    [
        Occupant("conv-y", FPS[:3], saved=True),  # already on disk
        Occupant("conv-x", FPS[:3], saved=False),  # the same conversation goes on
        Occupant("conv-y", (), saved=False),  # nothing to name the file by
    ],
)
async def test_no_evict_save(transfer, api, occupant):
    out = await transfer.before_grant(grant(kind="verify", occupant=occupant))
    assert out == TransferOutcome() and api.calls == []


async def test_the_file_at_the_greatest_index_is_restored(transfer, api, tmp_path):
    for fp in (FPS[1], FPS[3]):
        (tmp_path / name(ENGINE, "conv-x", fp)).write_bytes(b"s")
    # not restorable here: another conversation, another n_ctx, another model, not a prefix
    (tmp_path / name(ENGINE, "conv-y", FPS[5])).write_bytes(b"s")
    (tmp_path / name(ENGINE, "conv-x", FPS[5], n_ctx=4096)).write_bytes(b"s")
    other_model = EngineRef("C", "http://c.test", None, "/models/other.gguf", 2048)
    (tmp_path / name(other_model, "conv-x", FPS[4])).write_bytes(b"s")
    (tmp_path / name(ENGINE, "conv-x", "ff" * 16)).write_bytes(b"s")

    best = name(ENGINE, "conv-x", FPS[3])
    assert transfer.best_file(grant()) == (best, 4)
    out = await transfer.before_grant(grant(moved_from="B"))
    assert out == TransferOutcome(transfer="restored", restored_tokens=321, file=best)
    assert api.calls == [("restore", "a.test", best, "Bearer key-a")]
    # the slot already shares 4 messages: nothing to gain, nothing restored
    api.calls.clear()
    assert await transfer.before_grant(grant(prefix=4)) == TransferOutcome()
    # a plain compaction, a subagent: side kinds never restore
    assert await transfer.before_grant(grant(kind="subagent")) == TransferOutcome()
    assert api.calls == []


async def test_a_file_of_an_engine_with_another_slot_count_is_never_restored(
    transfer, api, tmp_path
):
    # llama-server refuses a file saved with another number of slots (400, and the slot is
    # left empty) even at the same per-slot n_ctx: such a file is not this engine's
    four = EngineRef("A", "http://a.test", "key-a", "/models/m.gguf", 2048, total_slots=4)
    two = EngineRef("A", "http://a.test", "key-a", "/models/m.gguf", 2048, total_slots=2)
    assert four.file_model != two.file_model
    (tmp_path / name(four, "conv-x", FPS[3])).write_bytes(b"s")
    assert transfer.best_file(grant(engine=two)) is None
    out = await transfer.before_grant(grant(engine=two, moved_from="B"))
    assert out == TransferOutcome(transfer="recomputed") and api.calls == []
    # the same layout restores
    assert transfer.best_file(grant(engine=four)) == (name(four, "conv-x", FPS[3]), 4)


@pytest.mark.parametrize("moved_from", ["B", None])
async def test_a_failed_restore_is_an_error_not_an_exception(transfer, api, moved_from):
    transfer.best_file = lambda facts: ("loki-slot-gone.bin", 3)  # deleted meanwhile
    out = await transfer.before_grant(grant(moved_from=moved_from))
    assert out.error is not None and "400" in out.error, out
    assert out.transfer == ("recomputed" if moved_from else None)
    assert out.file is None and transfer.counts["failures"] == 1


async def test_a_grant_waits_for_a_running_idle_save_and_does_not_save_again(
    transfer, api, tmp_path, monkeypatch
):
    monkeypatch.setattr(slot_transfer, "IDLE_S", 0.0)
    api.gate = asyncio.Event()
    saved: list[str] = []
    transfer.after_release(ENGINE, 1, "conv-y", FPS[:3], lambda: True, saved.append)
    await asyncio.wait_for(api.saving.wait(), 10)  # the idle-save is at the engine now
    occupant = Occupant("conv-y", FPS[:3], saved=False)  # the book does not know yet
    pending = asyncio.create_task(transfer.before_grant(grant(occupant=occupant)))
    await asyncio.sleep(0)
    assert not pending.done()
    api.gate.set()
    out = await asyncio.wait_for(pending, 10)
    assert out.saved_occupant and out.error is None
    assert api.actions() == ["save"] and saved == [FPS[2]]
    assert sorted(os.listdir(tmp_path)) == [name(ENGINE, "conv-y", FPS[2])]


async def test_idle_save_skipped_when_the_slot_is_no_longer_idle(transfer, api, monkeypatch):
    monkeypatch.setattr(slot_transfer, "IDLE_S", 0.0)
    asked = asyncio.Event()

    def still_idle() -> bool:
        asked.set()
        return False

    saved: list[str] = []
    transfer.after_release(ENGINE, 1, "conv-y", FPS, still_idle, saved.append)
    await asyncio.wait_for(asked.wait(), 10)
    await transfer.close()
    assert api.calls == [] and saved == []
    # no conversation or no fingerprints: nothing scheduled at all
    transfer.after_release(ENGINE, 1, "", FPS, lambda: True, saved.append)
    transfer.after_release(ENGINE, 1, "conv-y", (), lambda: True, saved.append)
    await transfer.close()
    assert api.calls == [] and saved == []


async def test_on_saved_failing_is_logged(transfer, api, monkeypatch, caplog):
    monkeypatch.setattr(slot_transfer, "IDLE_S", 0.0)
    called = asyncio.Event()

    def on_saved(fp: str) -> None:
        called.set()
        raise RuntimeError("book gone")

    with caplog.at_level(logging.ERROR, logger="loki_supervisor.slot_transfer"):
        transfer.after_release(ENGINE, 1, "conv-y", FPS, lambda: True, on_saved)
        await asyncio.wait_for(called.wait(), 10)
        await transfer.close()
    assert "on_saved of slot A/1 failed" in caplog.text
    assert api.actions() == ["save"]


NOW = 1_000_000.0


def f(n: str, size: int = 10, age: float = 0.0) -> SlotFile:
    return SlotFile(n, size, NOW - age)


def key(conversation: str, fp: str = "a" * 16, model: str = "b" * 12, n_ctx: int = 2048) -> str:
    return slot_files.SlotKey(model, n_ctx, conversation, fp).filename


@pytest.mark.parametrize(
    ("files", "max_bytes", "doomed"),
    [
        # other models and n_ctx stay (pooled engines differ); foreign names stay
        (
            [f(key("c" * 12, model="d" * 12)), f(key("e" * 12, n_ctx=4096)), f("notes.txt")],
            100,
            {},
        ),
        # an unfinished save goes once it is old; a young one may still be written
        (
            [f("part-x-a.bin", age=90000), f("part-y-b.bin", age=5)],
            100,
            {"part-x-a.bin": "unfinished save"},
        ),
        # one file per conversation, the newest
        (
            [f(key("c" * 12, "1" * 16), age=5), f(key("c" * 12, "2" * 16), age=1)],
            100,
            {key("c" * 12, "1" * 16): "superseded"},
        ),
        # too old
        ([f(key("c" * 12), age=90000)], 100, {key("c" * 12): "older than a day"}),
        # over the bound: the oldest go first
        (
            [f(key("c" * 12), age=3), f(key("d" * 12), age=2), f(key("e" * 12), age=1)],
            20,
            {key("c" * 12): "over max_bytes"},
        ),
    ],
)
def test_pool_stale_files(files, max_bytes, doomed):
    assert pool_stale_files(files, NOW, max_bytes) == doomed


def test_pool_stale_files_keeps_a_file_being_restored():
    files = [f(key("c" * 12), age=3), f(key("d" * 12), age=1)]
    assert pool_stale_files(files, NOW, 10, keep={key("c" * 12)}) == {}
