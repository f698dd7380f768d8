"""Unit tests of the recall rules: ids, keywords, lower-casing, scoring, limits, excerpts,
labels and every tool text (over an in-memory list of blocks)."""

from __future__ import annotations

import sys

import pytest

from loki_recall import tools
from loki_recall.text import (
    excerpt,
    go_lower,
    keywords,
    parse_id,
    parse_limit,
    quote_id,
    score,
    words,
)
from loki_shared.messages.recall import Block
from loki_shared.recall_label import recall_label


def blk(seq: int, label: str, content: str) -> Block:
    return Block(seq=seq, id=f"r{seq}", label=label, role="tool", content=content, created=0.0)


# --- ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "seq"),
    [
        ("r7", 7),
        ("7", 7),
        ("R7", 7),
        ("rR7", 7),
        ("  r7\t", 7),
        ("r 7", 7),
        (" rR 7 ", 7),
        ("r007", 7),
        ("0", 0),
        ("r0", 0),
        ("\u00a0r7\u3000", 7),
        (str(2**64 - 1), 2**64 - 1),
    ],
)
def test_parse_id_accepts(raw: str, seq: int) -> None:
    assert parse_id(raw) == seq


@pytest.mark.parametrize(
    "raw",
    [
        " r R 7",
        "Rr7",
        "rr7",
        "RR7",
        "r-7",
        "-7",
        "+7",
        "r+7",
        "r7x",
        "7r",
        "r 7 8",
        "r",
        "",
        "r٣",
        "r７",
        str(2**64),
        "r1e3",
        "r0x10",
        'r"7"',
        "\x1cr7",
    ],
)
def test_parse_id_refuses(raw: str) -> None:
    assert parse_id(raw) is None


# --- lower-casing and keywords ------------------------------------------------------------
def test_go_lower_is_the_simple_mapping_for_every_code_point() -> None:
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        low = go_lower(ch)
        assert len(low) == 1, (hex(cp), low)
        if cp == 0x130:
            assert low == "i"
        else:
            assert low == ch.lower()


def test_go_lower_sigma_and_dotted_i_in_words() -> None:
    assert go_lower("ΟΔΟΣ ΣΟΦΟΣ") == "οδοσ σοφοσ"  # never ς
    assert go_lower("İSTANBUL") == "istanbul"  # no combining dot
    assert "ς" in "ΟΔΟΣ".lower()  # what Python alone would give


def test_keywords_split_and_set() -> None:
    assert keywords("Hello_World, hello; x ÀÉÎÕÜ çà") == {"hello", "world", "àéîõü", "çà"}
    assert keywords("a b c") == set()
    assert keywords("İzmir") == {"izmir"}
    assert keywords("ΣΟΦΙΑ sofia") == {"sofia"}  # Greek letters split words
    assert keywords("straße") == {"stra"}  # ß (U+00DF) is below à: it splits
    assert keywords("ab÷cd ÿy") == {"ab÷cd", "ÿy"}  # U+00F7 and U+00FF are in the range
    assert keywords("x1 22 café-au-lait") == {"x1", "22", "café", "au", "lait"}
    assert words("aa b cc") == ["aa", "cc"]


def test_score_label_double_and_substrings() -> None:
    assert score({"nginx"}, "tool: nginx.conf", "server nginx") == 3
    assert score({"gin"}, "", "nginx") == 1  # substring, not whole word
    assert score({"nginx", "port"}, "label", "nginx port") == 2
    assert score({"zzz"}, "a", "b") == 0


# --- limits --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "limit"),
    [
        (None, 5),
        (0, 5),
        (-3, 5),
        (1, 1),
        (2.9, 2),
        (-0.5, 5),
        (0.9, 5),
        (20, 20),
        (21, 20),
        (1e300, 20),
        (10**40, 20),
        (float("inf"), 5),
        (float("-inf"), 5),
        (float("nan"), 5),
        ("3", 5),
        (True, 5),
        (False, 5),
        ([3], 5),
        ({"n": 3}, 5),
        (7, 7),
    ],
)
def test_parse_limit(value: object, limit: int) -> None:
    assert parse_limit(value) == limit


# --- excerpts and quoting -----------------------------------------------------------------
def test_excerpt_folds_and_cuts() -> None:
    assert excerpt("  a \n\n\t b \u00a0 c  ") == "a b c"
    assert excerpt("x" * 160) == "x" * 160
    assert excerpt("x" * 161) == "x" * 160 + "…"
    assert excerpt("y" * 159 + " z" + "w" * 10) == "y" * 159 + "…"  # trimmed before …
    assert excerpt("é" * 170) == "é" * 160 + "…"  # code points, not bytes
    assert excerpt("") == ""


def test_quote_id_is_json() -> None:
    assert quote_id("r7") == '"r7"'
    assert quote_id('r"7\\') == '"r\\"7\\\\"'
    assert quote_id(" r\t7\n") == '" r\\t7\\n"'
    assert quote_id("ré") == '"ré"'
    assert quote_id("\ud800") == '"\\ud800"'


# --- labels (the chat service builds them with this rule) ---------------------------------
def test_recall_label_rule() -> None:
    assert recall_label("user", "\n  \n  Hello world  \nsecond") == "user: Hello world"
    assert recall_label("tool", "result", tool_name="read_file") == "read_file: result"
    assert recall_label("assistant", "  \n\t\n") == "assistant"
    assert recall_label("tool", "", tool_name="web") == "web"
    long = "é" * 71
    assert recall_label("user", long) == "user: " + "é" * 70 + "…"
    assert recall_label("user", "é" * 70) == "user: " + "é" * 70
    assert recall_label("user", "\r\n line\r\n") == "user: line"


# --- tool texts ------------------------------------------------------------------------------
BLOCKS = [
    blk(1, "read_file: main.py", "import os\nprint('hi')"),
    blk(2, "user: Nginx setup", "server {\n  listen 80;\n}"),
    blk(3, "web: page", ""),
]


async def test_recall_texts() -> None:
    reader = tools.ListReader(BLOCKS)
    need = '[error] recall needs an id such as "r7"'
    for args in [{}, None, "r1", [1], {"id": 1}, {"id": None}, {"id": "  "}, {"id": ""}]:
        assert await tools.recall(args, reader) == need
    assert await tools.recall({"id": "r1"}, reader) == (
        "[r1 · read_file: main.py · verbatim]\nimport os\nprint('hi')"
    )
    assert await tools.recall({"id": " R3 "}, reader) == "[r3 · web: page · verbatim]\n"
    for raw in ["r9", "r0", "x1", "r-1", str(2**64), 'r"1']:
        assert await tools.recall({"id": raw}, reader) == (
            f"[error] no archived block {quote_id(raw)} — check the id, or find it with "
            "recall_search"
        )
    assert await tools.recall({"id": "r9"}, reader) == (
        '[error] no archived block "r9" — check the id, or find it with recall_search'
    )


class CountingReader(tools.ListReader):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__(blocks)
        self.reads = 0

    async def get(self, seq: int) -> Block | None:
        self.reads += 1
        return await super().get(seq)


async def test_malformed_id_never_reads() -> None:
    reader = CountingReader(BLOCKS)
    for raw in ["x1", "r-1", "r1.0", str(2**64), "r0", "0"]:
        await tools.recall({"id": raw}, reader)
    assert reader.reads == 0
    await tools.recall({"id": "r1"}, reader)
    assert reader.reads == 1


async def test_recall_search_texts() -> None:
    reader = tools.ListReader(BLOCKS)
    for args in [{}, None, {"query": 3}, {"query": " \t"}, {"query": ["nginx"]}]:
        assert await tools.recall_search(args, reader) == "[error] recall_search needs a query"
    assert await tools.recall_search({"query": "a b ?"}, reader) == "[no archived block matches]"
    assert await tools.recall_search({"query": "zzz"}, reader) == "[no archived block matches]"
    assert await tools.recall_search({"query": "NGINX listen"}, reader) == (
        "Archived blocks (bring one back with recall(id)):\n"
        "- r2 · user: Nginx setup\n"
        "  server { listen 80; }"
    )
    # "page" scores 2 on r3 (label), "print" 1 on r1: r3 first; limit 1 keeps it alone.
    assert await tools.recall_search({"query": "page print"}, reader) == (
        "Archived blocks (bring one back with recall(id)):\n"
        "- r3 · web: page\n"
        "  \n"
        "- r1 · read_file: main.py\n"
        "  import os print('hi')"
    )
    assert await tools.recall_search({"query": "page print", "limit": 1.7}, reader) == (
        "Archived blocks (bring one back with recall(id)):\n- r3 · web: page\n  "
    )
