"""In-memory inverted index that narrows ``recall_search`` candidates.

Why a word index is enough for substring semantics: a keyword is made only of word code
points (``a``–``z``, ``0``–``9``, U+00E0–U+00FF). Any occurrence of it inside a lower-cased
text is therefore a run of word code points, so it lies inside one maximal word of that text
(the same split as the keywords'), and that word is at least as long as the keyword (2+). So
"the lower-cased text contains keyword k" holds exactly when some word of the text contains k
as a substring. The index keeps, per distinct word, the blocks whose content (and, separately,
whose label) holds it; a keyword is looked up by scanning the vocabulary (not the blocks) for
words containing it.

The index returns, per block, an upper bound of its score; :class:`loki_recall.archive.Archive`
still checks each block it returns with the exact rule, so the index may only narrow the
candidates, never change an answer.

Layout (all numpy, nothing of the texts kept):

- the vocabulary: word → id (dict) and the words in id order, scanned by 8192-word segments
  joined into one string each (``str.find``);
- postings as (word id, block position) pairs: recent blocks in a flat "tail" (two
  ``array('I')``), frozen every :data:`FREEZE_AT` blocks into a part grouped by word id
  (sorted unique ids, start, length, positions); parts are merged when more than
  :data:`MAX_PARTS`. A block costs 8 bytes per distinct word while in the tail, 4 after.
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

import numpy as np

from .text import index_words

SEGMENT_WORDS = 8192
FREEZE_AT = 2048
MAX_PARTS = 8
MATCH_CACHE = 4096
DENSE_MIN = 64
DENSE_FRACTION = 32


class _Part:
    """Frozen postings: for each word id in ``tids`` (sorted), ``pos[start:start+len]``.

    Words held by many blocks (at least :data:`DENSE_MIN` and 1/:data:`DENSE_FRACTION` of the
    part's position range) also get a bitmap row (``bits``, packed), so a keyword matching
    thousands of common words ORs rows instead of scattering millions of positions.
    """

    __slots__ = ("tids", "starts", "lens", "pos", "dense_row", "bits", "width")

    def __init__(
        self, tids: np.ndarray, starts: np.ndarray, lens: np.ndarray, pos: np.ndarray
    ) -> None:
        self.tids, self.starts, self.lens, self.pos = tids, starts, lens, pos
        self.width = int(pos.max()) + 1 if len(pos) else 0
        dense = np.flatnonzero(lens >= max(DENSE_MIN, self.width // DENSE_FRACTION))
        self.dense_row = np.full(len(tids), -1, dtype=np.int64)
        self.dense_row[dense] = np.arange(len(dense))
        self.bits = np.zeros((len(dense), (self.width + 7) // 8), dtype=np.uint8)
        row = np.zeros(self.width, dtype=np.bool_)
        for r, loc in enumerate(dense):
            row[:] = False
            row[pos[starts[loc] : starts[loc] + lens[loc]]] = True
            self.bits[r] = np.packbits(row)

    @classmethod
    def from_pairs(cls, tids: np.ndarray, pos: np.ndarray) -> _Part:
        """Group (word id, position) pairs by word id (positions keep their order)."""
        order = np.argsort(tids, kind="stable")
        uniq, starts, lens = np.unique(tids[order], return_index=True, return_counts=True)
        return cls(
            uniq.astype(np.uint32), starts.astype(np.int64), lens.astype(np.int64), pos[order]
        )

    def nbytes(self) -> int:
        return (
            self.tids.nbytes
            + self.starts.nbytes
            + self.lens.nbytes
            + self.pos.nbytes
            + self.dense_row.nbytes
            + self.bits.nbytes
        )

    def mark_into(self, q: np.ndarray, mark: np.ndarray) -> bool:
        """Set ``mark[p]`` for every block p holding one of the word ids ``q`` (sorted
        uint32); whether any was set."""
        loc = np.searchsorted(self.tids, q)
        ok = loc < len(self.tids)
        loc, qq = loc[ok], q[ok]
        loc = loc[self.tids[loc] == qq]
        if not len(loc):
            return False
        rows = self.dense_row[loc]
        dense = rows >= 0
        if dense.any():
            union = np.bitwise_or.reduce(self.bits[rows[dense]], axis=0)
            mark[: self.width] |= np.unpackbits(union, count=self.width).view(np.bool_)
            loc = loc[~dense]
        if len(loc):
            starts, lens = self.starts[loc], self.lens[loc]
            total = int(lens.sum())
            offs = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)
            mark[self.pos[offs]] = True
        return True


def _merge(parts: list[_Part], chunk: int = 1 << 20) -> _Part:
    """One part holding every posting of ``parts`` (in order), by counting and scattering:
    no global sort, temporaries bounded by ``chunk`` postings."""
    parts = [p for p in parts if len(p.pos)]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return _Part(np.zeros(0, np.uint32), empty, empty, np.zeros(0, np.uint32))
    size = max(int(p.tids[-1]) for p in parts) + 1
    counts = np.zeros(size, dtype=np.int64)
    for p in parts:
        counts[p.tids] += p.lens
    cursor = np.cumsum(counts) - counts
    out = np.empty(int(counts.sum()), dtype=np.uint32)
    for p in parts:
        base = cursor[p.tids]  # where this part's group of each word starts in ``out``
        for a in range(0, len(p.pos), chunk):
            idx = np.arange(a, min(a + chunk, len(p.pos)))
            grp = np.searchsorted(p.starts, idx, side="right") - 1
            out[base[grp] + (idx - p.starts[grp])] = p.pos[a : a + len(idx)]
        cursor[p.tids] += p.lens
    nz = np.flatnonzero(counts)
    starts = np.cumsum(counts) - counts
    return _Part(nz.astype(np.uint32), starts[nz], counts[nz], out)


class _Postings:
    """(word id, position) pairs: a growing tail plus frozen parts."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self.tail_t = array("I")
        self.tail_p = array("I")

    def extend(self, tids: list[int], pos: int) -> None:
        try:
            self.tail_t.extend(tids)
            self.tail_p.extend([pos] * len(tids))
        except BufferError:  # a numpy view still exported: copy, keep the pairs aligned
            n = min(len(self.tail_t), len(self.tail_p))
            self.tail_t = array("I", self.tail_t[:n])
            self.tail_p = array("I", self.tail_p[:n])
            self.tail_t.extend(tids)
            self.tail_p.extend([pos] * len(tids))

    def freeze(self) -> None:
        if len(self.tail_t):
            t = np.array(self.tail_t, dtype=np.uint32)
            p = np.array(self.tail_p, dtype=np.uint32)
            self.parts.append(_Part.from_pairs(t, p))
            self.tail_t, self.tail_p = array("I"), array("I")
        if len(self.parts) > MAX_PARTS:
            self.parts = [_merge(self.parts)]

    def compact(self) -> _Part:
        """Freeze the tail and merge everything into one part (returned)."""
        self.freeze()
        if len(self.parts) != 1:
            self.parts = [_merge(self.parts)]
        return self.parts[0]

    def mark(self, q: np.ndarray, n: int) -> np.ndarray | None:
        """Bool array over positions: blocks holding one of the word ids ``q``."""
        marked = np.zeros(n, dtype=np.bool_)
        hit_any = False
        for part in self.parts:
            hit_any |= part.mark_into(q, marked)
        mark = marked if hit_any else None
        if len(self.tail_t):
            t = np.frombuffer(self.tail_t, dtype=np.uint32)
            hit = np.isin(t, q, kind="table") if len(q) else np.zeros(len(t), np.bool_)
            if hit.any():
                if mark is None:
                    mark = np.zeros(n, dtype=np.bool_)
                mark[np.frombuffer(self.tail_p, dtype=np.uint32)[hit]] = True
            del t, hit
        return mark

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts) + 4 * (len(self.tail_t) + len(self.tail_p))


class Index:
    """Word → blocks index over a set of readable blocks.

    Blocks are added with :meth:`add` and removed with :meth:`remove` (a deleted conversation
    or project; a lock drops a whole index instead). Positions are dense (0, 1, 2, ... in
    order of addition); the ``seq`` of each position is kept. A removed block is left out of
    every answer at once; :meth:`drop_removed` then rewrites the postings and the vocabulary
    without it (no posting, and no word only it held, remains).
    """

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self._words: list[bytes] = []  # Latin-1 bytes (every word code point is Latin-1)
        self._texts: list[tuple[bytes, np.ndarray] | None] = []  # joined segment, word starts
        self._content = _Postings()
        self._label = _Postings()
        self._seqs = array("Q")
        self._tail_blocks = 0
        self.freeze_at = FREEZE_AT
        self._match: dict[str, tuple[np.ndarray, int]] = {}
        self.vocab_chars = 0
        self._removed: set[int] = set()  # positions

    def __len__(self) -> int:
        return len(self._seqs) - len(self._removed)

    @property
    def vocabulary(self) -> int:
        """Number of distinct words."""
        return len(self._ids)

    def _tids(self, found: set[bytes]) -> list[int]:
        ids = self._ids
        out = list(map(ids.get, found))
        if None in out:
            for i, word in enumerate(found):
                if out[i] is not None:
                    continue
                tid = ids[word] = len(self._words)
                self._words.append(word)
                self.vocab_chars += len(word)
                seg = tid // SEGMENT_WORDS
                if seg < len(self._texts):
                    self._texts[seg] = None
                else:
                    self._texts.append(None)
                out[i] = tid
        return out  # type: ignore[return-value]  # every None was replaced above

    def add(self, seq: int, lowered_label: str, lowered_content: str) -> None:
        """Index one block from its lower-cased (:func:`loki_recall.text.go_lower`) texts."""
        pos = len(self._seqs)
        try:
            self._seqs.append(seq)
        except BufferError:
            self._seqs = array("Q", self._seqs)
            self._seqs.append(seq)
        self._content.extend(self._tids(index_words(lowered_content)), pos)
        if lowered_label:
            self._label.extend(self._tids(index_words(lowered_label)), pos)
        self._tail_blocks += 1
        if self._tail_blocks >= self.freeze_at:
            self.freeze()

    def freeze(self) -> None:
        """Move the tail's postings into a frozen part (done every ``freeze_at`` blocks)."""
        self._content.freeze()
        self._label.freeze()
        self._tail_blocks = 0

    def remove(self, seqs: set[int]) -> int:
        """Leave the blocks ``seqs`` out of every later answer; the number found here."""
        if not seqs or not len(self._seqs):
            return 0
        held = np.array(self._seqs, dtype=np.uint64)
        want = np.fromiter(seqs, dtype=np.uint64, count=len(seqs))
        hit = np.flatnonzero(np.isin(held, want))
        before = len(self._removed)
        self._removed.update(hit.tolist())
        return len(self._removed) - before

    def drop_removed(self) -> None:
        """Rewrite the index without the removed blocks: their postings go, positions are
        renumbered, and a word no remaining block holds leaves the vocabulary (its slot
        becomes an empty word, which no keyword matches; word ids are kept)."""
        if not self._removed:
            return
        n = len(self._seqs)
        alive = np.ones(n, dtype=np.bool_)
        alive[np.fromiter(self._removed, dtype=np.int64, count=len(self._removed))] = False
        new_pos = (np.cumsum(alive) - 1).astype(np.uint32)
        used = np.zeros(len(self._words), dtype=np.bool_)
        for postings in (self._content, self._label):
            part = postings.compact()
            keep = alive[part.pos]
            # Still grouped by word id after filtering: the part is rebuilt without a sort.
            tids = np.repeat(part.tids, part.lens)[keep]
            pos = new_pos[part.pos[keep]]
            used[tids] = True
            if not len(tids):
                postings.parts = []
                continue
            starts = np.concatenate(([0], np.flatnonzero(np.diff(tids)) + 1)).astype(np.int64)
            lens = np.diff(np.append(starts, len(tids))).astype(np.int64)
            postings.parts = [_Part(tids[starts], starts, lens, pos)]
        for tid in np.flatnonzero(~used).tolist():
            word = self._words[tid]
            if word:
                del self._ids[word]
                self._words[tid] = b""
                self.vocab_chars -= len(word)
                self._texts[tid // SEGMENT_WORDS] = None
        self._match = {}
        self._seqs = array("Q", np.array(self._seqs, dtype=np.uint64)[alive].tobytes())
        self._removed = set()
        self._tail_blocks = 0

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The whole index as arrays (after merging everything into one part per field and
        dropping removed blocks): the snapshot the archive stores so a restart need not read
        every block again."""
        self.drop_removed()
        self.freeze()
        out: dict[str, np.ndarray] = {
            "words": np.frombuffer(b"\n".join(self._words), dtype=np.uint8),
            "seqs": np.array(self._seqs, dtype=np.uint64),
        }
        for name, postings in (("c", self._content), ("l", self._label)):
            part = postings.compact()
            out.update(
                {
                    f"{name}_tids": part.tids,
                    f"{name}_starts": part.starts,
                    f"{name}_lens": part.lens,
                    f"{name}_pos": part.pos,
                }
            )
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Index:
        """Rebuild an index saved by :meth:`to_arrays`.

        Raises:
            KeyError, ValueError: the arrays are not a snapshot of this layout.
        """
        index = cls()
        text = arrays["words"].tobytes()
        index._words = text.split(b"\n") if text else []
        # An empty word is the slot of a word whose blocks were all deleted.
        index._ids = {w: i for i, w in enumerate(index._words) if w}
        if len(index._ids) != sum(1 for w in index._words if w):
            raise ValueError("snapshot vocabulary has duplicates")
        index.vocab_chars = sum(map(len, index._words))
        index._texts = [None] * -(-len(index._words) // SEGMENT_WORDS)
        index._seqs = array("Q", arrays["seqs"].astype(np.uint64).tobytes())
        for name, postings in (("c", index._content), ("l", index._label)):
            part = _Part(
                arrays[f"{name}_tids"].astype(np.uint32),
                arrays[f"{name}_starts"].astype(np.int64),
                arrays[f"{name}_lens"].astype(np.int64),
                arrays[f"{name}_pos"].astype(np.uint32),
            )
            if len(part.pos) and int(part.pos.max()) >= len(index._seqs):
                raise ValueError("snapshot postings point past its blocks")
            if len(part.tids) and int(part.tids.max()) >= len(index._words):
                raise ValueError("snapshot postings name unknown words")
            postings.parts = [part] if len(part.pos) else []
        return index

    def seqs(self) -> np.ndarray:
        """The seq of every indexed block not removed (a copy)."""
        held = np.array(self._seqs, dtype=np.uint64)
        if self._removed:
            held = np.delete(held, sorted(self._removed))
        return held

    def _segment(self, seg: int) -> tuple[bytes, np.ndarray]:
        cached = self._texts[seg]
        if cached is None:
            chunk = self._words[seg * SEGMENT_WORDS : (seg + 1) * SEGMENT_WORDS]
            # "\n" is not a word code point, so a match never spans two words.
            starts = np.fromiter(
                accumulate((len(w) + 1 for w in chunk), initial=0),
                dtype=np.int64,
                count=len(chunk) + 1,
            )
            cached = (b"\n".join(chunk) + b"\n", starts)
            self._texts[seg] = cached
        return cached

    def _scan(self, kw: str, first: int) -> np.ndarray:
        """Ids >= ``first`` of the words containing ``kw`` (sorted, unique)."""
        pattern = re.compile(re.escape(kw.encode("latin-1")))
        found = []
        for seg in range(first // SEGMENT_WORDS, len(self._texts)):
            text, starts = self._segment(seg)
            base = seg * SEGMENT_WORDS
            origin = int(starts[first - base]) if first > base else 0
            # Non-overlapping matches still find every word holding kw at least once
            # (a match ends inside its word).
            pos = np.fromiter((m.start() for m in pattern.finditer(text, origin)), dtype=np.int64)
            if len(pos):
                found.append(base + np.searchsorted(starts, pos, side="right") - 1)
        if not found:
            return np.zeros(0, dtype=np.uint32)
        return np.unique(np.concatenate(found)).astype(np.uint32)

    def matching_words(self, kw: str) -> np.ndarray:
        """Ids of the vocabulary words that contain ``kw`` as a substring (sorted uint32;
        remembered per keyword, a later call only scans the words added since)."""
        n = len(self._words)
        cached = self._match.get(kw)
        if cached is not None and cached[1] == n:
            return cached[0]
        if cached is not None:
            tids = np.concatenate([cached[0], self._scan(kw, cached[1])])
        else:
            tids = self._scan(kw, 0)
        if len(self._match) >= MATCH_CACHE:
            self._match.clear()
        self._match[kw] = (tids, n)
        return tids

    def candidates(self, kws: set[str]) -> tuple[np.ndarray, np.ndarray]:
        """Blocks that may score above 0 for ``kws``: ``(bounds, seqs)``, two aligned arrays
        (int32 score bounds, uint64 seqs), in no particular order."""
        n = len(self._seqs)
        bound = np.zeros(n, dtype=np.int32)
        if n == 0:
            return bound, np.zeros(0, dtype=np.uint64)
        for kw in kws:
            q = self.matching_words(kw)
            if not len(q):
                continue
            mark = self._content.mark(q, n)
            if mark is not None:
                bound += mark
            mark = self._label.mark(q, n)
            if mark is not None:
                bound += 2 * mark.astype(np.int32)
        if self._removed:
            bound[np.fromiter(self._removed, dtype=np.int64, count=len(self._removed))] = 0
        hit = np.flatnonzero(bound)
        seqs = np.frombuffer(self._seqs, dtype=np.uint64)[hit]
        return bound[hit], seqs

    def memory_bytes(self) -> int:
        """Approximate bytes held by the postings and the vocabulary."""
        return (
            self._content.nbytes()
            + self._label.nbytes()
            + self.vocab_chars
            + 100 * len(self._words)
            + 8 * len(self._seqs)
        )
