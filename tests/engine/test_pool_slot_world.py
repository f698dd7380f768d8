"""Slot transfer of the engine pool (issue 44) in situations met in practice: a slot that
holds nothing when the book says it holds a conversation (the engine restarted between two
``/health`` probes, or the granted turn never reached the engine). Each test failed before
the fix it guards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from loki_supervisor import slot_files
from loki_supervisor.slot_transfer import EngineRef, GrantFacts, Occupant, SlotTransfer

ENGINE = EngineRef("A", "http://a.test", None, "/models/m.gguf", 2048)
FPS = tuple(f"{i:02x}" * 16 for i in range(1, 7))


class EmptySlots:
    """``POST /slots/{id}?action=save|restore`` of an engine whose slots are empty (it just
    restarted): a save writes a file of no token (``n_saved`` 0, as llama-server answers);
    a restore of a file reads it and restores ``n_restored`` of what was saved."""

    def __init__(self, slot_dir: Path) -> None:
        self.slot_dir = slot_dir
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        action = request.url.params["action"]
        filename = json.loads(request.content)["filename"]
        self.calls.append((action, filename))
        path = self.slot_dir / filename
        if action == "save":
            path.write_bytes(b"")
            return httpx.Response(200, json={"id_slot": 1, "n_saved": 0, "n_written": 0})
        if not path.exists():
            return httpx.Response(400, json={"error": {"message": "Unable to restore slot"}})
        n = 0 if path.stat().st_size == 0 else 500
        return httpx.Response(200, json={"id_slot": 1, "n_restored": n, "n_read": n})


def file_name(conversation: str, fp: str) -> str:
    return slot_files.SlotKey(
        ENGINE.file_model,
        ENGINE.n_ctx,
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


@pytest.fixture
async def transfer(tmp_path: Path):
    api = EmptySlots(tmp_path)
    t = SlotTransfer(tmp_path, httpx.AsyncClient(transport=httpx.MockTransport(api)))
    t.api = api  # type: ignore[attr-defined]
    yield t
    await t.close()


async def test_an_empty_slot_never_replaces_the_conversations_good_file(transfer, tmp_path):
    """Before: the evict-save of an emptied slot wrote an empty file under conv-y's name,
    replacing the good one saved before the engine restarted."""
    good = file_name("conv-y", FPS[2])
    (tmp_path / good).write_bytes(b"kv" * 100)
    occupant = Occupant("conv-y", FPS[:3], saved=False)
    out = await transfer.before_grant(grant(conversation="conv-z", occupant=occupant))
    assert not out.saved_occupant
    assert transfer.api.calls[0][0] == "save"
    assert os.listdir(tmp_path) == [good] and (tmp_path / good).stat().st_size == 200
    assert transfer.counts["saves"] == 0


async def test_an_empty_file_is_not_said_restored(transfer, tmp_path):
    """Before: a file of no token (left by an older supervisor) was "restored": the
    placement said ``restored`` while the engine recomputed the whole prompt."""
    empty = file_name("conv-x", FPS[2])
    (tmp_path / empty).write_bytes(b"")
    out = await transfer.before_grant(grant(moved_from="B"))
    assert [a for a, _ in transfer.api.calls] == ["restore"]
    assert out.transfer == "recomputed" and out.restored_tokens is None
    assert not (tmp_path / empty).exists()  # never tried again


async def test_a_restarted_real_engine_keeps_the_conversations_file(tmp_path):
    """A real llama-server, fresh (as after a restart between two probes): the book still
    says its slot holds conv-y's prompt, a grant for conv-z evict-saves it. llama-server
    answers ``n_saved`` 0 for the empty slot; conv-y's file saved before stays whole."""
    from loki_shared import servers

    server = servers.start_llama(
        ctx=2048, parallel=1, threads=1, extra=["--slot-save-path", str(tmp_path)]
    )
    try:
        body = httpx.get(f"{server.url}/props", timeout=30).json()
        engine = EngineRef(
            "A",
            server.url,
            None,
            str(body["model_path"]),
            int(body["default_generation_settings"]["n_ctx"]),
        )
        good = slot_files.SlotKey(
            engine.file_model,
            engine.n_ctx,
            slot_files.conversation_key("conv-y"),
            slot_files.fingerprint_key(FPS[2]),
        ).filename
        (tmp_path / good).write_bytes(b"kv" * 100)
        transfer = SlotTransfer(tmp_path)
        try:
            out = await transfer.before_grant(
                grant(
                    engine=engine,
                    id_slot=0,
                    conversation="conv-z",
                    occupant=Occupant("conv-y", FPS[:3], saved=False),
                )
            )
        finally:
            await transfer.close()
        assert not out.saved_occupant
        assert os.listdir(tmp_path) == [good] and (tmp_path / good).stat().st_size == 200
    finally:
        server.stop()


class ElsewhereSlots:
    """An engine whose ``--slot-save-path`` is not the supervisor's directory: saves answer
    200 and write their file somewhere else (here: nowhere the supervisor sees)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.url.params["action"])
        return httpx.Response(200, json={"id_slot": 1, "n_saved": 100, "n_written": 5000})


async def test_a_slot_dir_the_engine_does_not_share_turns_the_transfer_off(tmp_path):
    """Before: every evict-save and idle-save of every grant made the engine write a file
    the supervisor never saw (a failed rename each time): the engine's disk filled with
    unfinished saves no one deletes, and each grant waited for a save for nothing."""
    api = ElsewhereSlots()
    transfer = SlotTransfer(
        tmp_path / "not-mounted", httpx.AsyncClient(transport=httpx.MockTransport(api))
    )
    try:
        occupant = Occupant("conv-y", FPS[:3], saved=False)
        out = await transfer.before_grant(grant(conversation="conv-z", occupant=occupant))
        assert not out.saved_occupant and "--slot-save-path" in (out.error or "")
        assert not transfer.enabled and "LOKI_ENGINE_SLOT_DIR" in (transfer.off_reason or "")
        out = await transfer.before_grant(grant(conversation="conv-w", occupant=occupant))
        transfer.after_release(ENGINE, 1, "conv-w", FPS, lambda: True, lambda fp: None)
        assert api.calls == ["save"] and out == type(out)()
    finally:
        await transfer.close()
