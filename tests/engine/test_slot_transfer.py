"""Slot transfer between two real llama-servers sharing one ``--slot-save-path`` (issue 44):
a conversation's slot evict-saved on engine A is restored into a slot of engine B, and B's
next completion reuses it (``timings.cache_n`` covers the restored prompt); without a file
the same move recomputes (``cache_n`` ≈ 0). A file that is not a prefix of the request is
never restored; the directory keeps one file per conversation within ``max_bytes``; an
engine that is down or a broken file gives ``outcome.error``, never an exception."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from loki_shared.fingerprint import fingerprints
from loki_supervisor import slot_files, slot_transfer
from loki_supervisor.slot_transfer import EngineRef, GrantFacts, Occupant, SlotTransfer

pytestmark = pytest.mark.engine

#: Tokens a cache hit may miss at the edge of the restored prompt (the template's tail).
EDGE = 4


@dataclass
class Engine:
    server: servers.RunningServer
    ref: EngineRef


def _props(url: str) -> tuple[str, int]:
    body = httpx.get(f"{url}/props", timeout=30).json()
    return str(body["model_path"]), int(body["default_generation_settings"]["n_ctx"])


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def engines(slot_dir: Path) -> Iterator[tuple[Engine, Engine]]:
    """Engines A and B: the bundled model, 2 slots, one slot directory, no host prompt
    cache (``--cache-ram 0``: a hit can only come from the slot itself)."""
    started: list[servers.RunningServer] = []
    try:
        for _ in range(2):
            started.append(
                servers.start_llama(
                    ctx=4096,
                    parallel=2,
                    extra=["--slot-save-path", str(slot_dir), "--cache-ram", "0"],
                )
            )
        refs = []
        for name, server in zip(("A", "B"), started):
            model, n_ctx = _props(server.url)
            refs.append(Engine(server, EngineRef(name, server.url, None, model, n_ctx)))
        yield refs[0], refs[1]
    finally:
        for server in started:
            server.stop()


@pytest.fixture(autouse=True)
def empty_dir(slot_dir: Path) -> None:
    for f in slot_dir.iterdir():
        f.unlink()


def first_turn(conversation: str) -> list[dict]:
    """A few hundred tokens of messages, different for each conversation from the system
    message's first words on."""
    notes = " ".join(
        f"Item {i} of {conversation}: crate {i * 3} holds {['pears', 'nails', 'rope'][i % 3]}."
        for i in range(40)
    )
    return [
        {"role": "system", "content": f"{conversation} keeps an inventory. Answer briefly."},
        {"role": "user", "content": f"Here is the list. {notes}"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Which crate holds rope first?"},
    ]


async def complete(url: str, messages: list[dict], id_slot: int) -> dict:
    async with httpx.AsyncClient(timeout=300) as client:
        r = await client.post(
            f"{url}/v1/chat/completions",
            json={
                "messages": messages,
                "max_tokens": 4,
                "temperature": 0,
                "cache_prompt": True,
                "id_slot": id_slot,
            },
        )
    r.raise_for_status()
    return r.json()


def facts(
    engine: Engine,
    id_slot: int,
    conversation: str,
    messages: list[dict],
    *,
    kind: str = "main",
    prefix: int = 0,
    occupant: Occupant | None = None,
    moved_from: str | None = None,
) -> GrantFacts:
    return GrantFacts(
        engine=engine.ref,
        id_slot=id_slot,
        kind=kind,
        conversation=conversation,
        fingerprints=tuple(fingerprints(messages)),
        prefix=prefix,
        occupant=occupant,
        moved_from=moved_from,
    )


def file_of(engine: Engine, conversation: str, messages: list[dict]) -> str:
    return slot_files.SlotKey(
        engine.ref.file_model,
        engine.ref.n_ctx,
        slot_files.conversation_key(conversation),
        slot_files.fingerprint_key(fingerprints(messages)[-1]),
    ).filename


async def run_and_evict(
    transfer: SlotTransfer, engine: Engine, id_slot: int, conversation: str, messages: list[dict]
) -> dict:
    """Run ``messages`` on the slot, then grant the slot to another conversation: the
    evict-save writes the conversation's file. Returns the completion."""
    body = await complete(engine.ref.base_url, messages, id_slot)
    occupant = Occupant(conversation, tuple(fingerprints(messages)), saved=False)
    other = first_turn(f"{conversation}-next")
    out = await transfer.before_grant(
        facts(engine, id_slot, f"{conversation}-next", other, occupant=occupant)
    )
    assert out.saved_occupant and out.error is None and out.transfer is None, out
    return body


def names(slot_dir: Path) -> set[str]:
    return {f.name for f in slot_dir.iterdir()}


async def test_evict_save_on_a_then_restore_on_b_reuses_the_prompt(engines, slot_dir: Path):
    a, b = engines
    transfer = SlotTransfer(slot_dir)
    try:
        m1 = first_turn("conv-x")
        body1 = await run_and_evict(transfer, a, 0, "conv-x", m1)
        prompt_n1 = body1["usage"]["prompt_tokens"]
        assert prompt_n1 > 300
        # the file under the conversation's key, and no temporary file left
        assert names(slot_dir) == {file_of(a, "conv-x", m1)}

        reply = body1["choices"][0]["message"]["content"]
        m2 = [*m1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        out = await transfer.before_grant(facts(b, 1, "conv-x", m2, moved_from="A"))
        assert out.error is None, out
        assert out.transfer == "restored"
        assert out.file == file_of(a, "conv-x", m1)
        assert out.restored_tokens is not None and out.restored_tokens >= prompt_n1
        assert transfer.counts["restores"] == 1

        body2 = await complete(b.ref.base_url, m2, 1)
        assert body2["timings"]["cache_n"] >= prompt_n1 - EDGE, body2["timings"]
    finally:
        await transfer.close()


async def test_a_move_without_a_file_recomputes(engines, slot_dir: Path):
    a, b = engines
    transfer = SlotTransfer(slot_dir)
    try:
        await run_and_evict(transfer, a, 1, "conv-other", first_turn("conv-other"))
        m = first_turn("conv-z")
        out = await transfer.before_grant(facts(b, 0, "conv-z", m, moved_from="A"))
        assert out == slot_transfer.TransferOutcome(transfer="recomputed"), out
        body = await complete(b.ref.base_url, m, 0)
        assert body["usage"]["prompt_tokens"] > 300
        assert body["timings"]["cache_n"] <= EDGE, body["timings"]
    finally:
        await transfer.close()


async def test_a_file_that_is_not_a_prefix_is_never_restored(engines, slot_dir: Path):
    a, b = engines
    transfer = SlotTransfer(slot_dir)
    try:
        m1 = first_turn("conv-edit")
        await run_and_evict(transfer, a, 0, "conv-edit", m1)
        # the user edited the list: the history diverges after the system message
        edited = [m1[0], {"role": "user", "content": "A different list: crate 1 holds tea."}]
        f = facts(b, 1, "conv-edit", edited, moved_from="A")
        assert transfer.best_file(f) is None
        out = await transfer.before_grant(f)
        assert out.transfer == "recomputed" and out.file is None and out.error is None, out
        body = await complete(b.ref.base_url, edited, 1)
        assert body["timings"]["cache_n"] <= body["usage"]["prompt_tokens"] // 2

        # a file covering no more than the slot already shares with the request stays put
        m2 = [*m1, {"role": "assistant", "content": "Crate 6."}, {"role": "user", "content": "Ok"}]
        covered = len(m1)
        f2 = facts(b, 0, "conv-edit", m2, prefix=covered)
        assert transfer.best_file(f2) == (file_of(a, "conv-edit", m1), covered)
        out2 = await transfer.before_grant(f2)
        assert out2 == slot_transfer.TransferOutcome(), out2
        # a side kind never restores, even with a file that would help
        out3 = await transfer.before_grant(facts(b, 0, "conv-edit", m2, kind="verify"))
        assert out3 == slot_transfer.TransferOutcome(), out3
        assert transfer.counts["restores"] == 0
    finally:
        await transfer.close()


async def test_one_file_per_conversation_within_max_bytes(engines, slot_dir: Path):
    a, _b = engines
    transfer = SlotTransfer(slot_dir)
    try:
        mp = first_turn("conv-p")
        await run_and_evict(transfer, a, 0, "conv-p", mp)
        size = (slot_dir / file_of(a, "conv-p", mp)).stat().st_size
        assert size > 0
        # room for one file and a half: the second conversation's save pushes out the first
        transfer.max_bytes = size + size // 2
        mq = first_turn("conv-q")
        await run_and_evict(transfer, a, 1, "conv-q", mq)
        assert names(slot_dir) == {file_of(a, "conv-q", mq)}

        # a later save of the same conversation supersedes its older file
        transfer.max_bytes = 100 * size
        mq2 = [*mq, {"role": "assistant", "content": "Crate 6."}, {"role": "user", "content": "Ok"}]
        await run_and_evict(transfer, a, 1, "conv-q", mq2)
        assert names(slot_dir) == {file_of(a, "conv-q", mq2)}
    finally:
        await transfer.close()


async def test_errors_are_returned_never_raised(engines, slot_dir: Path):
    a, b = engines
    transfer = SlotTransfer(slot_dir)
    try:
        down = Engine(
            a.server,
            EngineRef(
                "down", f"http://127.0.0.1:{servers.free_port()}", None, a.ref.model, a.ref.n_ctx
            ),
        )
        m = first_turn("conv-down")
        occupant = Occupant("conv-else", tuple(fingerprints(first_turn("conv-else"))), False)
        out = await transfer.before_grant(facts(down, 0, "conv-down", m, occupant=occupant))
        assert not out.saved_occupant and out.error is not None and "save" in out.error, out

        # a file that would help, but its engine is down / the file is not a slot state
        (slot_dir / file_of(a, "conv-down", m)).write_bytes(b"not a llama.cpp state file")
        out = await transfer.before_grant(facts(down, 0, "conv-down", m, moved_from="A"))
        assert out.transfer == "recomputed" and out.error is not None, out
        assert "restore" in out.error
        out = await transfer.before_grant(facts(b, 0, "conv-down", m, moved_from="A"))
        assert out.transfer == "recomputed" and out.error is not None, out
        assert transfer.counts["failures"] == 3
        # the engine still answers on that slot
        body = await complete(b.ref.base_url, m, 0)
        assert body["usage"]["prompt_tokens"] > 300
    finally:
        await transfer.close()


async def test_idle_save_after_a_turn_and_its_cancellation(
    engines, slot_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    a, _b = engines
    monkeypatch.setattr(slot_transfer, "IDLE_S", 0.2)
    transfer = SlotTransfer(slot_dir)
    try:
        m = first_turn("conv-idle")
        await complete(a.ref.base_url, m, 0)
        fps = tuple(fingerprints(m))
        saved: list[str] = []
        transfer.after_release(a.ref, 0, "conv-idle", fps, lambda: True, saved.append)
        for _ in range(600):
            if saved:
                break
            await asyncio.sleep(0.1)
        assert saved == [fps[-1]]
        assert names(slot_dir) == {file_of(a, "conv-idle", m)}

        # the occupant's state is already on disk: the next grant does not save it again
        saves = transfer.counts["saves"]
        occupant = Occupant("conv-idle", fps, saved=False)
        other = first_turn("conv-after")
        out = await transfer.before_grant(facts(a, 0, "conv-after", other, occupant=occupant))
        assert out.saved_occupant and transfer.counts["saves"] == saves, out

        # a grant on the slot before the idle time is over cancels the save
        await complete(a.ref.base_url, other, 0)
        asked: list[bool] = []

        def still_idle() -> bool:
            asked.append(True)
            return True

        transfer.after_release(
            a.ref, 0, "conv-after", tuple(fingerprints(other)), still_idle, saved.append
        )
        (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "slot-idle-save-A-0"]
        await transfer.before_grant(facts(a, 0, "conv-idle", m))
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and not asked and saved == [fps[-1]]
        assert file_of(a, "conv-after", other) not in names(slot_dir)
    finally:
        await transfer.close()
