"""Top-k selection is exact: the answer for k is the first k of the answer for any larger k,
and k hits come back whenever k eligible chunks exist. Checked against a brute-force oracle
(the same greedy over every chunk, no candidate pool) on random corpora, caps and ties."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.indexes.lexical import LexicalIndex
from codesearch.search.corpus import Corpus
from codesearch.search.ranking import Ranker, RankingParams


def _random_ranker(rng: np.random.Generator, overlaps: bool) -> Ranker:
    """A corpus of a few files of very different sizes (one dominates, as a big file does),
    chunks in line order; with ``overlaps`` some chunks repeat part of the previous one."""
    rows = []
    cid = 1
    n_files = int(rng.integers(1, 7))
    sizes = rng.integers(1, 40, n_files)
    sizes[0] = int(rng.integers(60, 300))  # the large file that used to fill the pool
    for f, size in enumerate(sizes.tolist()):
        line = 1
        for _ in range(size):
            start = line - int(rng.integers(1, 4)) if overlaps and line > 5 and rng.random() < 0.2 else line
            end = start + int(rng.integers(0, 20))
            rows.append((cid, f + 1, f"f{f}.py", start, end, "python", None, "block"))
            cid += 1
            line = end + 1
    lexical = LexicalIndex()
    lexical.add(np.array([r[0] for r in rows], dtype=np.int64), ["x"] * len(rows))
    return Ranker(Corpus.build(rows), lexical)


def _oracle(ranker: Ranker, total: np.ndarray, files_only: bool, params: RankingParams) -> list[tuple[int, float]]:
    """Every positive chunk by (score desc, row asc), accepted greedily, sorted by decayed score."""
    c = ranker.corpus
    cap = 1 if files_only else (params.max_per_file or len(total))
    taken: dict[int, list[int]] = {}
    chosen: list[tuple[int, float]] = []
    for r in sorted(np.flatnonzero(total > 0).tolist(), key=lambda r: (-total[r], r)):
        prev = taken.setdefault(int(c.file_idx[r]), [])
        if len(prev) >= cap or any(c.start[r] <= c.end[o] and c.start[o] <= c.end[r] for o in prev):
            continue
        prev.append(r)
        chosen.append((r, float(total[r]) * params.file_decay ** (len(prev) - 1)))
    return sorted(chosen, key=lambda t: -t[1])  # stable: equal scores keep acceptance order


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("cap,files_only", [(0, False), (3, False), (1, False), (0, True)])
def test_selection_equals_the_oracle_for_every_k(seed, cap, files_only):
    rng = np.random.default_rng(seed)
    ranker = _random_ranker(rng, overlaps=seed % 2 == 1)
    params = RankingParams(max_per_file=cap)
    n = len(ranker.corpus)
    # Scores with many ties and many zeros (chunks the query does not match).
    total = np.round(rng.exponential(1.0, n), 1 if seed % 3 == 0 else 4).astype(np.float32)
    total[rng.random(n) < 0.3] = 0.0
    full = _oracle(ranker, total, files_only, params)
    previous: list[tuple[int, float]] = []
    for k in (1, 2, 3, 5, 7, 10, 20, 50, 200, 1000):
        got = ranker.select(total, k, files_only=files_only, params=params)
        assert [r for r, _ in got] == [r for r, _ in full[:k]]
        assert [s for _, s in got] == pytest.approx([s for _, s in full[:k]])
        assert len(got) == min(k, len(full))  # k hits whenever k eligible chunks exist
        assert got[: len(previous)] == previous  # a prefix of every larger k
        previous = got


def test_a_large_file_no_longer_keeps_other_files_out():
    """The reported case: one file's chunks fill the candidate pool; k=5 returned 3 hits and
    missed better ones from other files that k=10 found."""
    rows = [(i + 1, 1, "big.rs", 10 * i + 1, 10 * i + 9, "rust", None, "block") for i in range(200)]
    rows += [(1000 + j, 2 + j, f"small{j}.rs", 1, 9, "rust", None, "block") for j in range(4)]
    lexical = LexicalIndex()
    lexical.add(np.array([r[0] for r in rows], dtype=np.int64), ["x"] * len(rows))
    ranker = Ranker(Corpus.build(rows), lexical)
    total = np.concatenate([np.linspace(3.0, 2.5, 200), [2.25, 2.24, 1.38, 1.23]]).astype(np.float32)
    five = ranker.select(total, 5)
    assert len(five) == 5
    assert {ranker.corpus.files[ranker.corpus.file_idx[r]] for r, _ in five} == {
        "big.rs", "small0.rs", "small1.rs", "small2.rs", "small3.rs"
    }
    assert ranker.select(total, 10)[:5] == five
