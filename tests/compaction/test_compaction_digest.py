"""COMPACT_TAIL_REUSE's fallback index (:mod:`loki_chat.compaction.digest`): within the
summary's budget, newest messages as lines, older ones as the ids that give them back, and
nothing installed when a part could not be archived."""

from __future__ import annotations

from loki_chat.compaction.digest import INTRO, LINE_CHARS, digest
from loki_shared.messages.chat import ChatMessage, LokiMeta


class Shelf:
    """An archive callback that keeps what it is given (``fail``: answers None)."""

    def __init__(self, fail: bool = False) -> None:
        self.blocks: dict[str, str] = {}
        self.fail = fail

    async def __call__(self, role: str, text: str, tool_name: str | None) -> str | None:
        if self.fail:
            return None
        block = f"r{len(self.blocks) + 1}"
        self.blocks[block] = text
        return block


def exchange(i: int, size: int = 600) -> list[ChatMessage]:
    return [
        ChatMessage(role="user", content=f"Q{i} " + "x" * size),
        ChatMessage(role="assistant", content=f"A{i}."),
    ]


async def test_older_messages_become_ids_and_the_index_stays_in_budget():
    torso = [m for i in range(8) for m in exchange(i)]
    torso.insert(3, ChatMessage(role="user", content="note", loki=LokiMeta(injected="budget")))
    shelf = Shelf()
    made = await digest(torso, {}, 256, shelf)
    assert made is not None
    text, archived = made
    lines = text.split("\n\n")
    assert lines[0] == INTRO and len(text) // 4 <= 256
    assert lines[1].startswith("[") and "earlier messages, archived verbatim: recall:" in lines[1]
    assert lines[-1] == "[assistant]: A7."  # the newest message last, whole
    assert lines[-2].startswith("[user]: Q7 ") and len(lines[-2]) < LINE_CHARS + 40
    # everything cut or left out is on the shelf, verbatim; the reminder is not
    texts = set(shelf.blocks.values())
    assert all(m.content in texts for m in torso if m.role == "user" and m.loki is None)
    assert "note" not in texts and archived == list(shelf.blocks)


async def test_a_big_block_archived_already_keeps_its_id():
    torso = exchange(0, 900)
    ids = {(0, torso[0].content): "r9"}
    shelf = Shelf()
    text, archived = await digest(torso, ids, 256, shelf)
    assert "(recall:r9)" in text and archived == [] and not shelf.blocks


async def test_no_index_when_the_archive_fails():
    assert await digest(exchange(0), {}, 256, Shelf(fail=True)) is None


async def test_without_recall_no_id_is_named():
    torso = [m for i in range(8) for m in exchange(i)]
    text, _ = await digest(torso, {}, 256, Shelf(), cite=False)
    assert "recall:" not in text and "(archived verbatim)" in text
