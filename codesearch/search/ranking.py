"""Query time: candidates from every available index, fused, re-ranked for code.

A query is scored against every chunk by a few signals, each normalised to [0, 1]:

- ``lexical``: chunk BM25 (:mod:`codesearch.indexes.lexical`);
- ``file_lexical``: BM25 of the chunk's whole file (chunk term frequencies summed per
  file), so a chunk of the file that is *about* the query outranks a stray mention;
- ``dense``: the chunk's rank among the query's nearest chunk vectors, as
  ``(k + 1) / (k + 1 + rank)`` (a small model's cosines are too bunched to add as scores);
- ``file_dense``: cosine of the query with the file's vector: the long-context whole-file
  vector, or for short-context models the normalised mean of the file's chunk vectors;
- ``colbert``: rank by MaxSim over the multi-vector (PLAID) index;
- ``path``: share of the query's words found in the file's name and folder;
- ``symbol``: the query names the chunk's symbol (``Engine`` -> ``type Engine struct``).

The fused score is a weighted sum, multiplied by a demotion for tests, docs, examples and
benchmarks when the query does not ask for them. Hits are then picked greedily with a
per-file decay (so the top 10 spans several files) and overlapping chunks dropped. Every
weight was chosen on the dev split of the semble benchmark (``benchmarks/quality.py``); see
BENCHMARKS.md "Search quality" for the ablations.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from codesearch.indexes.lexical import (
    BM25Matrix,
    LexicalIndex,
)
from codesearch.search.corpus import Corpus, centrality, invert, lookup, norm_ident
from codesearch.search.query import Query


@dataclass(frozen=True)
class RankingParams:
    """Weights of the ranking signals (defaults chosen on the benchmark's dev split)."""

    w_lexical: float = 1.5  # chunk BM25, max-normalised
    w_file_lexical: float = 0.6  # whole-file BM25, max-normalised
    w_dense: float = 0.75  # chunk vector score (see fusion)
    w_file_dense: float = 0.5  # whole-file cosine (long-context models only, see registry.FILE_VECTOR_MIN_TOKENS)
    w_colbert: float = 1.0  # MaxSim (see fusion)
    w_path: float = 2.0  # share of query words in the file's name / folder
    path_prefix: int = 4  # prefix matching of query words and path words (0: exact only)
    w_symbol: float = 1.0  # the query names the chunk's symbol
    w_stem: float = 0.5  # the query names the file (stem equals an identifier of the query)
    file_b: float = 0.3  # BM25 length normalisation of the whole-file score
    demote: float = 0.3  # multiplier for tests/docs/examples/benchmarks not asked for
    demote_imports: float = 0.3  # multiplier for an import-only chunk (kind "imports") not asked for
    file_decay: float = 0.2  # each further hit from one file is multiplied by this
    # Hard cap on hits from one file (0: none, the default). The decay already puts a
    # file's 4th hit at 0.008x, and a cap left fewer than k hits for a query whose matches
    # sit in few files (a glob naming one file gave 3 hits for k=1000).
    max_per_file: int = 0
    dense_candidates: int = 100  # chunks taken from the dense / colbert indexes
    vector_symbol_scale: float = 0.3  # vector weights on a bare-identifier query
    vector_norm: str = "minmax"  # fusion="score": "minmax" over the candidates, or "z" (z-score / 3, clipped)
    # How vector scores enter the sum: "rank" = (k + 1) / (k + 1 + rank) over the candidates
    # (k = rank_k), "score" = the normalised cosine (vector_norm). Rank-based is steadier:
    # a model's cosines are bunched, so min-max over 100 candidates turns small cosine gaps
    # into large score gaps (hybrid 0.8665 -> 0.8720 on the dev split, both held-out halves up).
    fusion: str = "rank"
    rank_k: float = 60.0
    # Cosine of the query with the normalised mean of the file's chunk vectors (short-context
    # models only; long-context ones have a real file vector, w_file_dense): lets a file whose
    # chunks each say a part of what the query asks for rise as a whole.
    w_file_centroid: float = 0.5
    # Centrality: the fused score times (1 + w * c), c in [0, 1] growing with how many other
    # files use a name the file defines (see centrality). The file a question is about is
    # more often the one the rest of the code leans on (SqlMapper.cs, not SqlMapper.Cache.cs).
    w_central: float = 0.3


@dataclass(frozen=True, slots=True)
class Candidates:
    """What one vector index proposed for a query: corpus rows (-1 for an id the corpus
    lacks), their scores, and the weight of the index's signal in the fused score."""

    rows: np.ndarray
    scores: np.ndarray
    weight: float


def _minmax(x: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Scale the present entries to [0, 1]; absent entries are 0."""
    out = np.zeros_like(x, dtype=np.float32)
    if not present.any():
        return out
    lo, hi = float(x[present].min()), float(x[present].max())
    out[present] = (x[present] - lo) / (hi - lo) if hi > lo else 1.0
    return out


def _normalise(x: np.ndarray, present: np.ndarray, how: str) -> np.ndarray:
    """Vector scores to roughly [0, 1]; "z" keeps a flat (unsure) ranking small."""
    if how == "minmax":
        return _minmax(x, present)
    out = np.zeros_like(x, dtype=np.float32)
    if present.sum() < 2:
        return _minmax(x, present)
    v = x[present]
    sd = float(v.std())
    if sd <= 0:
        return out
    out[present] = np.clip((v - float(v.mean())) / (3.0 * sd), 0.0, 1.0)
    return out


def _impute(norm: np.ndarray, covered: np.ndarray, lexical: np.ndarray | None) -> np.ndarray:
    """A vector signal where some rows have no vector yet (an index run still embedding).

    Such a row can be no vector candidate, so it would lose the vector score every covered
    row may get, and sink below covered rows it outranks lexically. Instead it gets the mean
    score of the covered rows among the lexical candidates (rows with a lexical score): what
    a row like it gets on average. Rows with no lexical score, or every row when the lexical
    index is not used, keep 0. With every row covered this changes nothing.
    """
    if covered.all() or lexical is None:
        return norm
    pool = lexical > 0
    ref = norm[pool & covered]
    fill = float(ref.mean()) if ref.size else 0.0
    return np.where(covered, norm, np.where(pool, fill, 0.0)).astype(np.float32)


def _maxnorm(x: np.ndarray) -> np.ndarray:
    m = float(x.max()) if len(x) else 0.0
    return x / m if m > 0 else x


class Ranker:
    """Fuses the signals over a corpus; shared by :class:`Searcher` and the benchmark."""

    def __init__(self, corpus: Corpus, lexical: LexicalIndex, params: RankingParams | None = None) -> None:
        self.corpus = corpus
        self.lexical = lexical
        self.params = params or RankingParams()
        self._centrality: np.ndarray | None = None
        self.centrality_source: Callable[[], np.ndarray] | None = None  # set by Searcher (a cached copy)
        n, nf = len(corpus), len(corpus.files)
        # Lexical rows -> corpus rows (the corpus is built in lexical order, but a lexical
        # index may hold ids the store no longer has, or miss some).
        self._id_order = np.argsort(corpus.ids, kind="stable")
        self._sorted_ids = corpus.ids[self._id_order]
        lex_rows = self.rows_of(lexical.ids)
        ok = lex_rows >= 0
        self._lex_src = np.flatnonzero(ok)
        self._lex_dst = lex_rows[ok]
        # Whole-file term frequencies = chunk rows summed per file: (files x chunks) @ tf.
        tf = lexical.tf[self._lex_src]
        g = sp.csr_matrix(
            (np.ones(len(self._lex_dst), np.float32), (corpus.file_idx[self._lex_dst], np.arange(len(self._lex_dst)))),
            shape=(nf, len(self._lex_dst)),
        )
        self._file_tf = (g @ tf).tocsc()
        self._file_bm25: BM25Matrix | None = None
        self._n = n
        # Inverted maps, so a query touches only the rows that match instead of looping
        # over every chunk in Python (134k chunks: 50 ms -> a few ms).
        self._by_symbol = invert(corpus.symbols)
        self._by_exact = invert(corpus.exact_symbols)
        self._by_path_token = invert(corpus.path_tokens)
        self._path_words = sorted(self._by_path_token)
        self._by_stem = invert([frozenset((st,)) for st in corpus.stems])
        # Files with chunks that overlap (none from today's chunkers, but an index may hold
        # them): only their chunks need the sequential overlap check in `select`.
        self._overlapping = _overlapping_files(corpus)

    @property
    def centrality(self) -> np.ndarray:
        """Per file, in [0, 1]: see :func:`centrality`. Made on first use by the source the
        searcher gave (its per-generation file), else computed; two threads racing here
        both compute the same array, which is cheaper than a lock held across repos."""
        c = self._centrality
        if c is None:
            c = self._centrality = (self.centrality_source or self.compute_centrality)()
        return c

    def compute_centrality(self) -> np.ndarray:
        return centrality(self.corpus, self._file_tf, self.lexical.vocab)

    @property
    def file_bm25(self) -> BM25Matrix:
        if self._file_bm25 is None or self._file_bm25.b != self.params.file_b:
            self._file_bm25 = BM25Matrix(self._file_tf, k1=self.lexical.k1, b=self.params.file_b)
        return self._file_bm25

    def path_share(self, tokens: list[str], min_prefix: int) -> np.ndarray:
        """Per file, the idf-weighted share of ``tokens`` found in its name and folder.

        idf-weighted so that "json array" in gson names JsonArray.java rather than every
        Json*.java; a word also matches a path word it is a prefix of, or that is a prefix
        of it, when the shorter has ``min_prefix`` letters ("implementations" ~ impls.rs).
        """
        c = self.corpus
        vocab = self.lexical.vocab
        idf = self.file_bm25.idf
        w = {t: float(idf[vocab[t]]) if t in vocab else 0.0 for t in tokens}
        denom = sum(w.values())
        if denom <= 0:
            return np.zeros(len(c.files), dtype=np.float32)
        share = np.zeros(len(c.files), dtype=np.float32)
        for t, wt in w.items():
            if wt <= 0:
                continue
            hits = [self._by_path_token[pt] for pt in self._path_matches(t, min_prefix)]
            if hits:
                share[np.unique(np.concatenate(hits))] += wt
        return share / denom

    def _path_matches(self, t: str, min_prefix: int) -> set[str]:
        """Path words equal to ``t``, or, when the shorter has ``min_prefix`` letters, a
        prefix of it or prefixed by it. Binary search over the sorted path words instead of
        a scan (1.5 ms per query on 10k chunks)."""
        out = {t} if t in self._by_path_token else set()
        if min_prefix:
            words = self._path_words
            if len(t) >= min_prefix:
                i = bisect.bisect_left(words, t)
                while i < len(words) and words[i].startswith(t):
                    out.add(words[i])
                    i += 1
            for n in range(min_prefix, len(t)):
                if t[:n] in self._by_path_token:
                    out.add(t[:n])
        return out

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Corpus rows of chunk ids (-1 for an id the corpus lacks)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(self._sorted_ids):
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted_ids, ids).clip(0, len(self._sorted_ids) - 1)
        return np.where(self._sorted_ids[pos] == ids, self._id_order[pos], -1).astype(np.int64)

    def score(
        self,
        q: Query,
        *,
        use_lexical: bool,
        vectors: Mapping[str, Candidates] | None = None,
        file_dense: tuple[np.ndarray, np.ndarray] | None = None,
        mask: np.ndarray | None = None,
        params: RankingParams | None = None,
        covered: dict[str, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Fused score per corpus row, and the raw per-source scores (for ``sources``).

        ``vectors`` are the candidates of each vector index, by signal name (``dense``,
        ``colbert``: `codesearch.indexes.registry.DERIVED`), fused in their order;
        ``file_dense`` is ``(file indexes, scores)``. ``covered`` (while an index run is still
        embedding) says which rows (by signal) and files (``files``) have a vector yet; see
        `_impute`.
        """
        p = params or self.params
        c = self.corpus
        n = self._n
        total = np.zeros(n, dtype=np.float32)
        sources: dict[str, np.ndarray] = {}
        term_ids = [self.lexical.vocab[t] for t in q.tokens if t in self.lexical.vocab]
        lex = None
        if use_lexical:
            lex = np.zeros(n, dtype=np.float32)
            lex[self._lex_dst] = self.lexical.bm25.scores(term_ids)[self._lex_src]
            sources["lexical"] = lex
            lexn = _maxnorm(lex)
            total += p.w_lexical * lexn
            if p.w_file_lexical:
                flex = _maxnorm(self.file_bm25.scores(term_ids))
                total += p.w_file_lexical * flex[c.file_idx]
            if p.w_path and q.tokens:
                total += p.w_path * self.path_share(q.tokens, p.path_prefix)[c.file_idx]
            if p.w_symbol and q.identifiers:
                idents = set(q.identifiers)
                # Half for a case-insensitive hit on any defined name ("session()" for
                # "Session"), full for the exact name as defined ("class Session").
                sym = np.zeros(n, dtype=np.float32)
                sym[lookup(self._by_symbol, idents)] += 0.5
                sym[lookup(self._by_exact, q.exact)] += 0.5
                total += p.w_symbol * sym
            if p.w_stem and q.identifiers:
                names = {norm_ident(i) for i in q.identifiers}
                names |= {n[:-1] for n in names if n.endswith("s")} | {n + "s" for n in names}
                stem_hit = np.zeros(len(c.files), dtype=np.float32)
                stem_hit[lookup(self._by_stem, names)] = 1.0
                total += p.w_stem * stem_hit[c.file_idx]
        # A bare identifier is a lookup: the exact-name signals know best, vectors blur it.
        vscale = p.vector_symbol_scale if q.is_symbol else 1.0
        for name, cand in (vectors or {}).items():
            w = cand.weight * vscale
            if not len(cand.rows):
                continue
            rows, scores = cand.rows, cand.scores
            keep = rows >= 0
            raw = np.zeros(n, dtype=np.float32)
            present = np.zeros(n, dtype=bool)
            raw[rows[keep]] = scores[keep]
            present[rows[keep]] = True
            sources[name] = np.where(present, raw, 0)
            if p.fusion == "rank":
                norm = np.zeros(n, dtype=np.float32)
                order = rows[keep][np.argsort(-scores[keep], kind="stable")]
                norm[order] = (p.rank_k + 1.0) / (p.rank_k + 1.0 + np.arange(len(order), dtype=np.float32))
            else:
                norm = _normalise(raw, present, p.vector_norm)
            if covered is not None and name in covered:
                norm = _impute(norm, covered[name], lex)
            total += w * norm
        w_fd = p.w_file_centroid or p.w_file_dense
        if file_dense is not None and len(file_dense[0]) and w_fd:
            fidx, scores = file_dense
            keep = fidx >= 0
            raw = np.zeros(len(c.files), dtype=np.float32)
            present = np.zeros(len(c.files), dtype=bool)
            raw[fidx[keep]] = scores[keep]
            present[fidx[keep]] = True
            fnorm = _normalise(raw, present, p.vector_norm)
            if covered is not None and "files" in covered:
                flex = None if lex is None else np.bincount(c.file_idx, weights=lex, minlength=len(c.files))
                fnorm = _impute(fnorm, covered["files"], flex)
            total += w_fd * vscale * fnorm[c.file_idx]
        if p.w_central:
            total *= 1.0 + p.w_central * self.centrality[c.file_idx]
        if p.demote < 1.0:
            factor = np.ones(4, dtype=np.float32)
            factor[1] = 1.0 if q.wants_tests else p.demote
            factor[2] = 1.0 if q.wants_docs else p.demote
            factor[3] = 1.0 if q.wants_bench else p.demote
            row_factor = factor[c.file_kind][c.file_idx]
            if not q.wants_tests:
                # Test code inside a source file (a Rust `#[cfg(test)] mod tests`, Zig `test`
                # blocks) repeats the names of the code it tests, as a test file does, and
                # is demoted the same way (once: a test file's chunks already are).
                row_factor[c.test_code & (c.file_kind[c.file_idx] == 0)] *= p.demote
            if q.is_symbol:
                # A bare name asks for its definition: where every definition of it sits in
                # a test, doc or benchmark file, that is the answer, not something to demote.
                defs = lookup(self._by_exact, q.exact)
                if len(defs) and (row_factor[defs] < 1.0).all():
                    row_factor[defs] = 1.0
            total *= row_factor
        if p.demote_imports < 1.0 and not q.wants_imports:
            # An import block names what a file uses, not what it does: it matches a query
            # through the same names as the code that uses them, which is the better answer.
            total[c.imports] *= p.demote_imports
        if mask is not None:
            total = np.where(mask, total, 0.0).astype(np.float32)
        return total, sources

    def select(
        self, total: np.ndarray, k: int, *, files_only: bool = False, params: RankingParams | None = None
    ) -> list[tuple[int, float]]:
        """The best ``k`` hits, as ``(row, score)``, best first.

        The rule: take chunks by fused score (ties by row); skip one that overlaps a chunk
        already taken from its file, or past the per-file cap (one with ``files_only``);
        the m-th chunk taken from a file scores ``score * file_decay ** (m - 1)``; answer
        the ``k`` best of those.

        Exact whatever ``k``: the answer for ``k`` is the first ``k`` of the answer for any
        larger ``k``, and ``k`` hits come back whenever ``k`` chunks score above 0. Only the
        top of the order is looked at: a pool of the best raw scores, grown until the
        ``k``-th decayed score is at least the best raw score outside it (decay only lowers
        a score, and a chunk never changes what was taken before it).
        """
        p = params or self.params
        pos = np.flatnonzero(total > 0)
        cap = 1 if files_only else p.max_per_file
        pool = max(16 * k, 256)
        while True:
            order = _top_rows(total, pos, pool + 1)  # one more: the best raw score outside
            inside, outside = order[:pool], order[pool:]
            rows, scores = self._taken(inside, total, cap, p.file_decay)
            best = np.argsort(-scores, kind="stable")[:k]  # equal scores: taken first, first
            if not len(outside) or (len(best) == k and scores[best[-1]] >= total[outside[0]]):
                return [(int(rows[i]), float(scores[i])) for i in best]
            pool *= 4

    def _taken(self, order: np.ndarray, total: np.ndarray, cap: int, decay: float) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``order`` (best first) that the rule takes, in that order, and their
        decayed scores (float64)."""
        c = self.corpus
        files = c.file_idx[order]
        keep = np.ones(len(order), dtype=bool)
        if self._overlapping[files].any():  # sequential, for those files' chunks only
            taken: dict[int, list[int]] = {}
            for i in np.flatnonzero(self._overlapping[files]).tolist():
                r = int(order[i])
                prev = taken.setdefault(int(files[i]), [])
                if any(c.start[r] <= c.end[o] and c.start[o] <= c.end[r] for o in prev):
                    keep[i] = False
                else:
                    prev.append(r)
        order, files = order[keep], files[keep]
        # Place of each row among its file's rows taken so far (0 for the first).
        by_file = np.argsort(files, kind="stable")
        sorted_files = files[by_file]
        first = np.searchsorted(sorted_files, sorted_files, side="left")
        place = np.empty(len(order), dtype=np.int64)
        place[by_file] = np.arange(len(order)) - first
        if cap:
            order, place = order[place < cap], place[place < cap]
        return order, total[order].astype(np.float64) * decay**place


def _overlapping_files(corpus: Corpus) -> np.ndarray:
    """Per file: whether two of its chunks share a line."""
    out = np.zeros(len(corpus.files), dtype=bool)
    if len(corpus) < 2:
        return out
    order = np.lexsort((corpus.start, corpus.file_idx))
    files = corpus.file_idx[order].astype(np.int64)
    # Running max of end within each file: offset by file so the max restarts per file.
    span = int(corpus.end.max()) + 2
    ends = np.maximum.accumulate(files * span + corpus.end[order])
    prev_end = np.concatenate([[-1], ends[:-1] - files[1:] * span])
    same = np.concatenate([[False], files[1:] == files[:-1]])
    out[files[same & (corpus.start[order] <= prev_end)]] = True
    return out


def _top_rows(total: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` rows of ``pos`` with the highest ``total``, best first; ties by row, so
    every pool is a prefix of any larger one."""
    if len(pos) > n:
        cut = np.partition(total[pos], len(pos) - n)[len(pos) - n]  # the n-th highest score
        above = pos[total[pos] > cut]
        at = pos[total[pos] == cut]  # pos is sorted: the lowest rows of the tie come first
        pos = np.concatenate([above, at[: n - len(above)]])
    return pos[np.lexsort((pos, -total[pos]))]
