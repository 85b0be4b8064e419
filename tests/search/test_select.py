"""Top-k selection is exact: the answer for k is the first k of the answer for any larger k,
and k hits come back whenever k eligible chunks exist. Checked against a brute-force oracle
(the same greedy over every chunk, no candidate pool) on random corpora, caps and ties."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from fixtures.lexical import chunk, store_of, write_lexical

from codesearch.search.ranking import Ranker, RankingParams, Scored


@dataclass
class Case:
    """Chunks in chunk-id order: their file and lines, and the ranker over their index."""

    ranker: Ranker
    file: list[int]
    start: list[int]
    end: list[int]

    def scored(self, total: np.ndarray) -> Scored:
        """``total`` (one score per chunk, in chunk-id order) as the ranker's candidates."""
        c = self.ranker.corpus
        files = c.live_files()
        rows, owner = c.file_rows(files)
        at = np.searchsorted(rows, self.ranker.rows_of(np.arange(1, len(total) + 1)))
        by_row = np.zeros(len(rows), dtype=np.float32)
        by_row[at] = total
        return Scored(rows, owner, files, by_row)

    def select(self, total: np.ndarray, k: int, **kw) -> list[tuple[int, float]]:
        """`Ranker.select` answered as (chunk index, score)."""
        got = self.ranker.select(self.scored(total), k, **kw)
        ids = self.ranker.corpus.ids(np.array([r for r, _ in got], dtype=np.int64))
        return [(int(i) - 1, s) for i, (_, s) in zip(ids.tolist(), got)]


def _case(tmp_path, spans: dict[str, list[tuple[int, int]]]) -> Case:
    files = {path: [chunk(path, s, e, "x") for s, e in ss] for path, ss in spans.items()}
    store = store_of(files)  # chunk ids 1.. in this order
    ranker = Ranker(write_lexical(store, tmp_path / "lexical"))
    file, start, end = [], [], []
    for f, ss in enumerate(spans.values()):
        for s, e in ss:
            file.append(f)
            start.append(s)
            end.append(e)
    return Case(ranker, file, start, end)


def _random_case(tmp_path, rng: np.random.Generator, overlaps: bool) -> Case:
    """A corpus of a few files of very different sizes (one dominates, as a big file does),
    chunks in line order; with ``overlaps`` some chunks repeat part of the previous one."""
    spans: dict[str, list[tuple[int, int]]] = {}
    n_files = int(rng.integers(1, 7))
    sizes = rng.integers(1, 40, n_files)
    sizes[0] = int(rng.integers(60, 300))  # the large file that used to fill the pool
    for f, size in enumerate(sizes.tolist()):
        line = 1
        for _ in range(size):
            start = line - int(rng.integers(1, 4)) if overlaps and line > 5 and rng.random() < 0.2 else line
            end = start + int(rng.integers(0, 20))
            spans.setdefault(f"f{f}.py", []).append((start, end))
            line = end + 1
    return _case(tmp_path, spans)


def _oracle(case: Case, total: np.ndarray, files_only: bool, params: RankingParams) -> list[tuple[int, float]]:
    """Every positive chunk by (score desc, chunk id asc), accepted greedily, sorted by decayed score."""
    cap = 1 if files_only else (params.max_per_file or len(total))
    taken: dict[int, list[int]] = {}
    chosen: list[tuple[int, float]] = []
    for r in sorted(np.flatnonzero(total > 0).tolist(), key=lambda r: (-total[r], r)):
        prev = taken.setdefault(case.file[r], [])
        if len(prev) >= cap or any(case.start[r] <= case.end[o] and case.start[o] <= case.end[r] for o in prev):
            continue
        prev.append(r)
        chosen.append((r, float(total[r]) * params.file_decay ** (len(prev) - 1)))
    return sorted(chosen, key=lambda t: -t[1])  # stable: equal scores keep acceptance order


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("cap,files_only", [(0, False), (3, False), (1, False), (0, True)])
def test_selection_equals_the_oracle_for_every_k(tmp_path, seed, cap, files_only):
    rng = np.random.default_rng(seed)
    case = _random_case(tmp_path, rng, overlaps=seed % 2 == 1)
    params = RankingParams(max_per_file=cap)
    n = len(case.file)
    # Scores with many ties and many zeros (chunks the query does not match).
    total = np.round(rng.exponential(1.0, n), 1 if seed % 3 == 0 else 4).astype(np.float32)
    total[rng.random(n) < 0.3] = 0.0
    full = _oracle(case, total, files_only, params)
    previous: list[tuple[int, float]] = []
    for k in (1, 2, 3, 5, 7, 10, 20, 50, 200, 1000):
        got = case.select(total, k, files_only=files_only, params=params)
        assert [r for r, _ in got] == [r for r, _ in full[:k]]
        assert [s for _, s in got] == pytest.approx([s for _, s in full[:k]])
        assert len(got) == min(k, len(full))  # k hits whenever k eligible chunks exist
        assert got[: len(previous)] == previous  # a prefix of every larger k
        previous = got


def test_a_large_file_no_longer_keeps_other_files_out(tmp_path):
    """The reported case: one file's chunks fill the candidate pool; k=5 returned 3 hits and
    missed better ones from other files that k=10 found."""
    spans = {"big.rs": [(10 * i + 1, 10 * i + 9) for i in range(200)]}
    spans |= {f"small{j}.rs": [(1, 9)] for j in range(4)}
    case = _case(tmp_path, spans)
    total = np.concatenate([np.linspace(3.0, 2.5, 200), [2.25, 2.24, 1.38, 1.23]]).astype(np.float32)
    five = case.select(total, 5)
    assert len(five) == 5
    assert {list(spans)[case.file[i]] for i, _ in five} == {"big.rs", *(f"small{j}.rs" for j in range(4))}
    assert case.select(total, 10)[:5] == five
