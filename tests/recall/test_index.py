"""The word index gives exactly the rule's score for every block (so narrowing with it can
never drop a hit), on random texts full of the characters the rules treat specially."""

from __future__ import annotations

import random

import pytest

from loki_recall import index as index_module
from loki_recall.index import SEGMENT_WORDS, Index
from loki_recall.text import go_lower, keywords, score

ALPHABET = list("abcaebd09 \n\t_-.") + [
    "É",
    "é",
    "İ",
    "i",
    "Σ",
    "σ",
    "ς",
    "ß",
    "÷",
    "ÿ",
    "Ÿ",
    "ç",
    "K",
    "ǅ",
    "œ",
    "Ω",
    "\u0307",
    "\u00a0",
    "À",
    "×",
]


def rand_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.fixture(autouse=True, params=["dense bitmaps", "postings only"])
def dense_words(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every index test with common words as bitmaps (low threshold) and without."""
    if request.param == "dense bitmaps":
        monkeypatch.setattr(index_module, "DENSE_MIN", 2)
        monkeypatch.setattr(index_module, "DENSE_FRACTION", 8)
    else:
        monkeypatch.setattr(index_module, "DENSE_MIN", 10**9)


def test_index_bound_equals_exact_score() -> None:
    rng = random.Random(1234)
    index = Index()
    index.freeze_at = 7  # many frozen parts, merged, plus a tail
    blocks = []
    for seq in range(1, 301):
        label = rand_text(rng, rng.randint(0, 12))
        content = rand_text(rng, rng.randint(0, 80))
        blocks.append((seq, go_lower(label), go_lower(content)))
        index.add(seq, go_lower(label), go_lower(content))
    checked = 0
    for _ in range(400):
        kws = keywords(rand_text(rng, rng.randint(1, 10)))
        if not kws:
            continue
        bound, seqs = index.candidates(kws)
        got = dict(zip(seqs.tolist(), bound.tolist()))
        want = {seq: s for seq, lab, con in blocks if (s := score(kws, lab, con)) > 0}
        assert got == want, kws
        checked += 1
    assert checked > 200


def test_index_many_segments_and_substrings() -> None:
    index = Index()
    n = SEGMENT_WORDS * 2 + 10
    for seq in range(1, n + 1):
        index.add(seq, "", f"word{seq:06d}x common")
    assert index.vocabulary == n + 1
    bound, seqs = index.candidates({"0000"})  # word000001x .. word000099x... substring
    assert sorted(seqs.tolist()) == [s for s in range(1, n + 1) if "0000" in f"{s:06d}"]
    bound, seqs = index.candidates({"mmo"})
    assert len(seqs) == n and set(bound.tolist()) == {1}
    bound, seqs = index.candidates({"16390x"})
    assert seqs.tolist() == [16390]


def test_merge_and_snapshot_keep_every_answer() -> None:
    rng = random.Random(99)
    index = Index()
    index.freeze_at = 5
    texts = {}
    for seq in range(1, 241):
        label, content = rand_text(rng, 8), rand_text(rng, 60)
        texts[seq] = (go_lower(label), go_lower(content))
        index.add(seq * 3, *texts[seq])  # seqs need not be dense
    queries = [kws for _ in range(150) if (kws := keywords(rand_text(rng, 8)))]

    def answers(ix: Index) -> list[dict[int, int]]:
        out = []
        for kws in queries:
            bound, seqs = ix.candidates(kws)
            out.append(dict(zip(seqs.tolist(), bound.tolist())))
        return out

    before = answers(index)
    for kws, got in zip(queries, before):
        want = {seq * 3: s for seq, (lab, con) in texts.items() if (s := score(kws, lab, con))}
        assert got == want
    copy = Index.from_arrays({k: v.copy() for k, v in index.to_arrays().items()})
    assert answers(index) == before  # compacting changed nothing
    assert answers(copy) == before and copy.vocabulary == index.vocabulary
    copy.add(10_000, "", "brandnewword " + rand_text(rng, 20))
    assert copy.candidates({"brandnew"})[1].tolist() == [10_000]


def test_removed_blocks_leave_answers_postings_and_vocabulary() -> None:
    """Removing blocks (a deleted conversation) drops them from every answer at once; after
    the rewrite (and through a snapshot round trip) every other block keeps its exact score,
    words only they held are gone, and blocks added afterwards are indexed as before."""
    rng = random.Random(28)
    index = Index()
    index.freeze_at = 9
    blocks = {}
    for seq in range(1, 201):
        label, content = go_lower(rand_text(rng, 10)), go_lower(rand_text(rng, 60))
        if seq % 7 == 0:
            content += f" secret{seq:03d}zz"
        blocks[seq] = (label, content)
        index.add(seq, label, content)
    removed = {s for s in blocks if s % 7 == 0 or s % 11 == 0}

    def check(ix: Index) -> None:
        for _ in range(150):
            kws = keywords(rand_text(rng, rng.randint(1, 8))) | {"secret", "zz"}
            bound, seqs = ix.candidates(kws)
            got = dict(zip(seqs.tolist(), bound.tolist()))
            want = {
                s: sc
                for s, (lab, con) in blocks.items()
                if s not in removed and (sc := score(kws, lab, con)) > 0
            }
            assert got == want, kws

    assert index.remove(removed) == len(removed)
    check(index)  # left out at once, before the rewrite
    index.drop_removed()
    check(index)
    assert len(index) == 200 - len(removed)
    assert not any(w.startswith(b"secret") for w in index._ids)
    assert not len(index.matching_words("secret"))
    restored = Index.from_arrays(index.to_arrays())
    check(restored)
    assert set(restored.seqs().tolist()) == set(blocks) - removed
    for ix in (index, restored):
        ix.add(500, "", "secret007zz again")
        assert ix.candidates({"secret007zz"})[1].tolist() == [500]
