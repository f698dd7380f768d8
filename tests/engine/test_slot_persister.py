"""SLOT_PERSIST's decisions (no engine: llama.cpp's slot API answered by an in-process
transport): what is saved when, under which name, what is never saved as the conversation's,
and what is restored."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from loki_shared.messages.engine import LeaseRequest
from loki_supervisor import slot_files, slot_persist
from loki_supervisor.lease_book import LeaseManager
from loki_supervisor.slot_persist import PART_PREFIX, PersistConfig, SlotPersister

FP = "0123456789abcdef0123456789abcdef"


class SlotApi:
    """``POST /slots/0?action=save|restore`` as llama-server answers it: a save writes the
    file under the slot directory; a restore of a missing file is a 400."""

    def __init__(self, slot_dir: Path) -> None:
        self.slot_dir = slot_dir
        self.calls: list[tuple[str, str]] = []
        self.paused_during: list[bool] = []
        self.leases: LeaseManager | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        action = request.url.params["action"]
        filename = json.loads(request.content)["filename"]
        self.calls.append((action, filename))
        if self.leases is not None:
            self.paused_during.append(self.leases._paused > 0)
        path = self.slot_dir / filename
        if action == "save":
            path.write_bytes(b"state" * 10)
            return httpx.Response(200, json={"id_slot": 0, "n_saved": 100, "n_written": 50})
        if not path.exists():
            return httpx.Response(400, json={"error": {"message": "Unable to restore slot"}})
        return httpx.Response(200, json={"id_slot": 0, "n_restored": 100, "n_read": 50})


@pytest.fixture
def setup(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(slot_persist, "IDLE_S", 0.05)
    api = SlotApi(tmp_path)
    leases = LeaseManager(lambda: None)
    api.leases = leases
    persister = SlotPersister(leases, httpx.AsyncClient(transport=httpx.MockTransport(api)))
    persister.configure(PersistConfig(tmp_path, "a" * 12, 10 * 1024 * 1024))
    persister.engine_ready("http://engine", None, 4096)
    return persister, api, tmp_path


async def test_idle_save_names_the_file_and_pauses_leases(setup):
    persister, api, slot_dir = setup
    persister.turn_done("conv-1", FP)
    await asyncio.sleep(0.3)
    key = slot_files.SlotKey("a" * 12, 4096, slot_files.conversation_key("conv-1"), FP[:16])
    # written under the temporary name, then renamed
    assert api.calls == [("save", PART_PREFIX + key.filename)]
    assert api.paused_during == [True]
    assert [p.name for p in slot_dir.iterdir()] == [key.filename]
    assert persister.last["action"] == "save" and persister.last["why"] == "idle"
    # nothing new since: a planned stop saves nothing more
    assert await persister.save("stop") == "already saved"
    await persister.close()


async def test_a_side_job_on_slot_0_is_never_saved_as_the_conversation(setup):
    persister, api, _ = setup
    persister.turn_done("conv-1", FP)
    persister.slot_used()  # a verify job ran on slot 0 before the engine went idle
    await asyncio.sleep(0.3)
    assert api.calls == []
    assert await persister.save("stop") == "slot 0 was used since the turn"
    await persister.close()


async def test_no_save_while_a_request_runs_or_without_a_conversation(setup):
    persister, api, _ = setup
    persister.turn_done(None, FP)
    assert await persister.save("stop") == "no conversation owns slot 0"
    persister.turn_done("conv-1", FP)
    persister.cancel_idle()
    persister.leases.held["x"] = object()  # a lease held: the slot is busy
    assert await persister.save("stop") == "a request is running on the engine"
    persister.leases.held.clear()
    assert await persister.save("stop") is None
    assert [a for a, _ in api.calls] == ["save"]
    persister.engine_ready("", None, 0)
    persister.turn_done("conv-1", "f" * 32)
    persister.cancel_idle()
    assert await persister.save("stop") == "engine not ready"
    await persister.close()


async def test_no_idle_save_while_a_lease_is_waited_for(setup):
    persister, api, _ = setup
    persister.turn_done("conv-1", FP)
    # a request queued for a lease (the engine not ready: it waits), none held
    waiter = asyncio.create_task(persister.leases.acquire(LeaseRequest(kind="main", wait_s=5)))
    await asyncio.sleep(0)
    assert persister.leases.waiting == 1 and persister.leases.in_flight == 0
    await asyncio.sleep(0.3)  # past IDLE_S (0.05 s here)
    assert api.calls == []  # its grant decides again: nothing saved meanwhile
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # the next turn's release saves once nothing is held or waited for
    persister.turn_done("conv-1", FP)
    await asyncio.sleep(0.3)
    assert [a for a, _ in api.calls] == ["save"]
    await persister.close()


async def test_a_cancelled_idle_save_never_runs(setup):
    persister, api, _ = setup
    persister.turn_done("conv-1", FP)
    persister.cancel_idle()  # a lease asked for before the engine went idle
    await asyncio.sleep(0.3)  # past IDLE_S
    assert api.calls == []
    assert await persister.save("stop") is None  # the turn is still saved before a stop
    assert [a for a, _ in api.calls] == ["save"]
    await persister.close()


async def test_an_engine_without_its_window_yet_is_neither_saved_nor_cleaned(setup):
    persister, api, slot_dir = setup
    persister.engine_ready("http://engine", None, 0)  # answering, n_ctx not known yet
    other = slot_files.SlotKey("b" * 12, 4096, "5" * 12, "6" * 16).filename
    (slot_dir / other).write_bytes(b"x")  # stale for any known window: another model
    persister.turn_done("conv-1", FP)
    persister.cancel_idle()
    assert await persister.save("stop") == "engine not ready"
    assert persister.cleanup() == {}
    assert api.calls == [] and [p.name for p in slot_dir.iterdir()] == [other]
    await persister.close()


async def test_the_newest_file_is_restored_and_stale_ones_go(setup):
    persister, api, slot_dir = setup
    old = slot_files.SlotKey("a" * 12, 4096, "1" * 12, "2" * 16).filename
    new = slot_files.SlotKey("a" * 12, 4096, "3" * 12, "4" * 16).filename
    other = slot_files.SlotKey("b" * 12, 4096, "5" * 12, "6" * 16).filename
    for i, name in enumerate((old, new, other)):
        (slot_dir / name).write_bytes(b"x")
        os.utime(slot_dir / name, (1e9 + i, 1e9 + i))
    os.utime(slot_dir / new, None)  # now: the last save
    os.utime(slot_dir / old, (0, 0))  # 1970: older than a day
    assert await persister.restore() is None
    assert api.calls == [("restore", new)]
    assert sorted(p.name for p in slot_dir.iterdir()) == [new]
    assert persister.owner is not None and persister.owner.saved
    assert persister.last["n_restored"] == 100
    await persister.close()


async def test_nothing_to_restore_and_a_failed_restore_are_reported(setup, tmp_path):
    persister, api, slot_dir = setup
    assert await persister.restore() == "no slot file to restore"
    name = slot_files.SlotKey("a" * 12, 4096, "1" * 12, "2" * 16).filename
    (slot_dir / name).write_bytes(b"x")
    api.slot_dir = tmp_path / "elsewhere"  # the engine cannot find it
    api.slot_dir.mkdir()
    why = await persister.restore()
    assert why is not None and why.startswith("restore failed") and "400" in why
    assert persister.last["error"] == why
    await persister.close()


async def test_off_does_nothing(tmp_path: Path):
    persister = SlotPersister(LeaseManager(lambda: None))
    persister.configure(None)
    persister.turn_done("conv-1", FP)
    assert persister._idle is None
    assert await persister.save("stop") == "SLOT_PERSIST off"
    assert await persister.restore() == "SLOT_PERSIST off"
    await persister.close()
