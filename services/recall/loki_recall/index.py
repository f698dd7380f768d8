"""In-memory inverted index that narrows ``recall_search`` candidates.

Why a word index is enough for substring semantics: a keyword is made only of word code
points (``a``–``z``, ``0``–``9``, U+00E0–U+00FF). Any occurrence of it inside a lower-cased
text is therefore a run of word code points, so it lies inside one maximal word of that text
(the same split as the keywords'), and that word is at least as long as the keyword (2+). So
"the lower-cased text contains keyword k" holds exactly when some word of the text contains k
as a substring. The index keeps, per distinct word, the list of blocks whose content (and,
separately, whose label) holds it; a keyword is looked up by scanning the vocabulary (not the
blocks) for words containing it.

The index returns, per block, an upper bound of its score; :class:`loki_recall.archive.Archive`
still checks each block it returns with the exact rule, so the index may only narrow the
candidates, never change an answer.

Memory: block positions are 32-bit (``array('I')``), so a block costs 4 bytes per distinct
word; the vocabulary is kept once. Nothing of the texts themselves is kept.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from itertools import accumulate

import numpy as np

from .text import words

SEGMENT_WORDS = 8192


class _Segment:
    """A run of vocabulary words (ids ``base .. base+len-1``) searched as one string."""

    __slots__ = ("base", "words", "_text", "_starts")

    def __init__(self, base: int) -> None:
        self.base = base
        self.words: list[str] = []
        self._text: str | None = None
        self._starts: list[int] = []

    def append(self, word: str) -> None:
        self.words.append(word)
        self._text = None

    def find(self, kw: str, out: list[int]) -> None:
        """Append to ``out`` the ids of the words of this segment that contain ``kw``."""
        if self._text is None:
            # "\n" is not a word code point, so a match never spans two words.
            self._text = "\n".join(self.words) + "\n"
            self._starts = [0, *accumulate(len(w) + 1 for w in self.words)]
        text, starts = self._text, self._starts
        pos = text.find(kw)
        while pos >= 0:
            i = bisect_right(starts, pos) - 1
            out.append(self.base + i)
            pos = text.find(kw, starts[i + 1])


def _append(lists: list[array] | dict[int, array], tid: int, pos: int) -> None:
    posting = lists[tid]
    try:
        posting.append(pos)
    except BufferError:  # a numpy view still exported: copy and go on
        posting = lists[tid] = array("I", posting)
        posting.append(pos)


class Index:
    """Word → blocks index over a set of readable blocks.

    Blocks are added with :meth:`add` (never removed: a lock drops a whole index). Positions
    are dense (0, 1, 2, ... in order of addition); ``seq`` of each position is kept.
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._content: list[array] = []
        self._label: dict[int, array] = {}
        self._seqs = array("Q")
        self._segments: list[_Segment] = []
        self.vocab_chars = 0

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def vocabulary(self) -> int:
        """Number of distinct words."""
        return len(self._ids)

    def _word_id(self, word: str) -> int:
        tid = self._ids.get(word)
        if tid is None:
            tid = len(self._ids)
            self._ids[word] = tid
            self._content.append(array("I"))
            if not self._segments or len(self._segments[-1].words) >= SEGMENT_WORDS:
                self._segments.append(_Segment(tid))
            self._segments[-1].append(word)
            self.vocab_chars += len(word)
        return tid

    def add(self, seq: int, lowered_label: str, lowered_content: str) -> None:
        """Index one block from its lower-cased (:func:`loki_recall.text.go_lower`) texts."""
        pos = len(self._seqs)
        try:
            self._seqs.append(seq)
        except BufferError:
            self._seqs = array("Q", self._seqs)
            self._seqs.append(seq)
        word_id = self._word_id
        content = self._content
        for word in set(words(lowered_content)):
            _append(content, word_id(word), pos)
        label = self._label
        for word in set(words(lowered_label)):
            tid = word_id(word)
            if tid not in label:
                label[tid] = array("I")
            _append(label, tid, pos)

    def matching_words(self, kw: str) -> list[int]:
        """Ids of the vocabulary words that contain ``kw`` as a substring."""
        out: list[int] = []
        for segment in self._segments:
            segment.find(kw, out)
        return out

    @staticmethod
    def _mark(lists: list[array] | dict[int, array], tids: list[int], n: int) -> np.ndarray | None:
        empty = ()
        if isinstance(lists, dict):
            found = [lists.get(t, empty) for t in tids]
        else:
            found = [lists[t] for t in tids]
        parts = [np.frombuffer(a, dtype=np.uint32) for a in found if len(a)]
        if not parts:
            return None
        mark = np.zeros(n, dtype=np.bool_)
        mark[parts[0] if len(parts) == 1 else np.concatenate(parts)] = True
        return mark

    def candidates(self, kws: set[str]) -> tuple[np.ndarray, np.ndarray]:
        """Blocks that may score above 0 for ``kws``: ``(bounds, seqs)``, two aligned arrays
        (int32 score bounds, uint64 seqs), in no particular order."""
        n = len(self._seqs)
        bound = np.zeros(n, dtype=np.int32)
        if n == 0:
            return bound, np.zeros(0, dtype=np.uint64)
        for kw in kws:
            tids = self.matching_words(kw)
            if not tids:
                continue
            mark = self._mark(self._content, tids, n)
            if mark is not None:
                bound += mark
            mark = self._mark(self._label, tids, n)
            if mark is not None:
                bound += 2 * mark.astype(np.int32)
        hit = np.flatnonzero(bound)
        seqs = np.frombuffer(self._seqs, dtype=np.uint64)[hit]
        return bound[hit], seqs

    def memory_bytes(self) -> int:
        """Approximate bytes held by the postings and the vocabulary."""
        postings = sum(a.buffer_info()[1] * 4 + 64 for a in self._content)
        postings += sum(a.buffer_info()[1] * 4 + 64 for a in self._label.values())
        return postings + self.vocab_chars + 100 * len(self._ids) + 8 * len(self._seqs)
