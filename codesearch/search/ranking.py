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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from codesearch.indexes.lexical import LexicalIndex, Postings, bm25, idf, length_norm, runs, union
from codesearch.search.corpus import Corpus, norm_ident
from codesearch.search.query import Query

#: How many of the files the whole-file vector signal scores best become candidates.
FILE_SIGNAL_CANDIDATES = 500


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


@dataclass(frozen=True, slots=True)
class Scored:
    """A query's fused scores over its candidates: every row of every file a signal touched
    (rows of no such file score 0, and are not held)."""

    rows: np.ndarray  # global rows, ascending
    owner: np.ndarray  # each row's index into `files`
    files: np.ndarray  # the candidate files, ascending
    total: np.ndarray  # fused score per row (float32)
    sources: dict[str, np.ndarray] = field(default_factory=dict)  # raw score per signal and row (0: not found by it)

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Where each of ``rows`` (all candidates) sits in `rows`."""
        return np.searchsorted(self.rows, rows)


#: A row filter: (candidate rows, candidate files, each row's index into the files) -> keep.
RowFilter = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class Ranker:
    """Fuses the signals over the index's rows; shared by :class:`Searcher` and the benchmark.

    Every signal is computed for what it touches: the rows holding a query term, the files
    of those rows, the files whose path or name the query names, the rows defining a name
    it names, the vector indexes' candidates. The fused score of a row is the same sum the
    module doc describes, float32 operation for operation, so reading only the touched rows
    changes no score.
    """

    def __init__(self, index: LexicalIndex, params: RankingParams | None = None) -> None:
        self.index = index
        self.corpus = Corpus(index)
        self.params = params or RankingParams()

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Global rows of chunk ids (-1 for an id the index lacks)."""
        return self.corpus.rows_of(ids)

    # ---- signals -------------------------------------------------------------------

    def _chunk_bm25(self, posts: list[Postings]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, chunk BM25) of the rows holding a query term."""
        idx = self.index
        if not posts:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        rows = union([pt.rows for pt in posts])
        row_at = _positions(idx.n_rows, rows)
        lengths = np.maximum(idx.row_values("length", rows), 0).astype(np.float32)
        norm = length_norm(lengths, idx.avgdl, idx.k1, idx.b)
        df = np.array([len(pt.rows) for pt in posts], dtype=np.float32)
        weights = idf(max(len(idx), int(df.max())), df)
        out = np.zeros(len(rows), dtype=np.float32)
        for w, pt in zip(weights, posts):
            at = row_at[pt.rows]
            out[at] += bm25(w, pt.tf, norm[at], idx.k1)
        return rows, out

    def _file_bm25(self, posts: list[Postings], b: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(files, whole-file BM25, each term's file-level idf): a file's term counts are its
        chunks' summed, its length their lengths summed."""
        idx = self.index
        if not posts:
            return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32)
        per_term = []
        for pt in posts:
            files, start = runs(pt.files)
            per_term.append((files, np.add.reduceat(pt.tf, start)))
        files = union([f for f, _ in per_term])
        lengths = np.maximum(idx.file_values("file_len", files), 0).astype(np.float32)
        norm = length_norm(lengths, idx.file_avgdl, idx.k1, b)
        df = np.array([len(f) for f, _ in per_term], dtype=np.float32)
        weights = idf(max(idx.manifest.live_files, int(df.max())), df)
        out = np.zeros(len(files), dtype=np.float32)
        for w, (f, tf) in zip(weights, per_term):
            at = np.searchsorted(files, f)
            out[at] += bm25(w, tf, norm[at], idx.k1)
        return files, out, weights

    def path_share(
        self, tokens: list[str], weights: Mapping[str, float], min_prefix: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(files, share): per file, the idf-weighted share of ``tokens`` found in its name
        and folder (files with none left out).

        idf-weighted (``weights``: the file-level idf of each token the index holds) so that
        "json array" in gson names JsonArray.java rather than every Json*.java; a word also
        matches a path word it is a prefix of, or that is a prefix of it, when the shorter
        has ``min_prefix`` letters ("implementations" ~ impls.rs).
        """
        w = {t: float(weights.get(t, 0.0)) for t in tokens}
        denom = sum(w.values())
        if denom <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        found = [(self.corpus.path_files(t, min_prefix), wt) for t, wt in w.items() if wt > 0]
        files = union([f for f, _ in found])
        share = np.zeros(len(files), dtype=np.float32)
        for f, wt in found:
            share[np.searchsorted(files, f)] += wt
        return files, share / denom

    # ---- fusion --------------------------------------------------------------------

    def score(
        self,
        q: Query,
        *,
        use_lexical: bool,
        vectors: Mapping[str, Candidates] | None = None,
        file_dense: tuple[np.ndarray, np.ndarray] | None = None,
        mask: RowFilter | None = None,
        params: RankingParams | None = None,
        covered: dict[str, np.ndarray] | None = None,
        include: np.ndarray | None = None,
        floor: float = 0.0,
    ) -> Scored:
        """Fused score per candidate row, and the raw per-source scores (for ``sources``).

        ``vectors`` are the candidates of each vector index, by signal name (``dense``,
        ``colbert``: `codesearch.indexes.registry.DERIVED`), fused in their order;
        ``file_dense`` is ``(files, scores)``. ``covered`` (while an index run is still
        embedding) says which rows (by signal) and files (``files``) have a vector yet, as
        arrays over every row (file); see `_impute`. ``mask`` keeps rows (the others score
        0); ``include`` rows are candidates whatever their signals, and with ``floor`` every
        row the mask keeps scores at least that (a regex filter's matches).
        """
        p = params or self.params
        c = self.corpus
        idx = self.index
        empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0, np.float32)
        lex_rows, lex = empty_i, empty_f
        flex_files, flex = empty_i, empty_f
        path_files, path = empty_i, empty_f
        sym_rows, exact_rows, stem_files = empty_i, empty_i, empty_i
        posts: dict[str, Postings] = {}
        if use_lexical:
            posts = {t: pt for t in q.tokens if (pt := idx.postings(t)) is not None}
            lex_rows, lex = self._chunk_bm25(list(posts.values()))
            if p.w_file_lexical or (p.w_path and q.tokens):
                flex_files, flex, file_idf = self._file_bm25(list(posts.values()), p.file_b)
            if p.w_path and q.tokens:
                path_files, path = self.path_share(q.tokens, dict(zip(posts, file_idf.tolist())), p.path_prefix)
            if p.w_symbol and q.identifiers:
                sym_rows = c.symbol_rows(q.identifiers)
            if p.w_stem and q.identifiers:
                names = {norm_ident(i) for i in q.identifiers}
                names |= {n[:-1] for n in names if n.endswith("s")} | {n + "s" for n in names}
                stem_files = c.stem_files(names)
        if (use_lexical and p.w_symbol and q.identifiers) or (p.demote < 1.0 and q.is_symbol):
            exact_rows = c.exact_rows(q.exact)
        vector_rows = {
            name: cand.rows[cand.rows >= 0] for name, cand in (vectors or {}).items() if len(cand.rows)
        }
        fd_files, fd_scores = empty_i, empty_f
        w_fd = p.w_file_centroid or p.w_file_dense
        if file_dense is not None and len(file_dense[0]) and w_fd:
            fidx, fscores = (np.asarray(x) for x in file_dense)
            keep = fidx >= 0
            keep[keep] = idx.live[fidx[keep]] != 0  # (a dead file's centroid is no file's score)
            # One score per file, the last one given for it (as an assignment by index keeps).
            fd_files, last = np.unique(fidx[keep][::-1], return_index=True)
            fd_scores = fscores[keep][::-1][last].astype(np.float32)
        # The candidates: every row of every file something above touched.
        touched_rows = [sym_rows, exact_rows, *vector_rows.values()]
        if include is not None:
            touched_rows.append(np.asarray(include, dtype=np.int64))
        extra = np.concatenate(touched_rows)
        lex_files = union([runs(pt.files)[0] for pt in posts.values()]) if use_lexical else empty_i
        # Of the whole-file signal, only its best files: a short-context model scores every
        # file by its centroid, and each file made a candidate costs its rows (all 603,770
        # of a 114k-file monorepo). The others keep their score where something else makes
        # them candidates; the normalisation below is over every file it scored.
        fd_best = fd_files[np.sort(_top(fd_scores, fd_files, FILE_SIGNAL_CANDIDATES))] if len(fd_files) else empty_i
        files = union([lex_files, path_files, stem_files, fd_best, np.sort(c.file_of(extra))])
        rows, owner = c.file_rows(files)
        n = len(rows)
        row_at, file_at = _positions(idx.n_rows, rows), _positions(idx.n_files, files)

        def at_rows(r: np.ndarray, v: np.ndarray) -> np.ndarray:
            out = np.zeros(n, dtype=np.float32)
            out[row_at[r]] = v
            return out

        def at_files(f: np.ndarray, v: np.ndarray) -> np.ndarray:
            out = np.zeros(len(files), dtype=np.float32)
            out[file_at[f]] = v
            return out

        total = np.zeros(n, dtype=np.float32)
        sources: dict[str, np.ndarray] = {}
        lex_c = None
        if use_lexical:
            lex_c = at_rows(lex_rows, lex)
            sources["lexical"] = lex_c
            total += p.w_lexical * _maxnorm(lex_c)
            if p.w_file_lexical:
                total += p.w_file_lexical * _maxnorm(at_files(flex_files, flex))[owner]
            if p.w_path and q.tokens:
                total += p.w_path * at_files(path_files, path)[owner]
            if p.w_symbol and q.identifiers:
                # Half for a case-insensitive hit on any defined name ("session()" for
                # "Session"), full for the exact name as defined ("class Session").
                sym = np.zeros(n, dtype=np.float32)
                sym[row_at[sym_rows]] += 0.5
                sym[row_at[exact_rows]] += 0.5
                total += p.w_symbol * sym
            if p.w_stem and q.identifiers:
                total += p.w_stem * at_files(stem_files, np.ones(len(stem_files), np.float32))[owner]
        # A bare identifier is a lookup: the exact-name signals know best, vectors blur it.
        vscale = p.vector_symbol_scale if q.is_symbol else 1.0
        for name, cand in (vectors or {}).items():
            w = cand.weight * vscale
            if not len(cand.rows):
                continue
            keep = cand.rows >= 0
            at = row_at[cand.rows[keep]]
            raw = np.zeros(n, dtype=np.float32)
            present = np.zeros(n, dtype=bool)
            raw[at] = cand.scores[keep]
            present[at] = True
            sources[name] = np.where(present, raw, 0)
            if p.fusion == "rank":
                norm = np.zeros(n, dtype=np.float32)
                order = at[np.argsort(-cand.scores[keep], kind="stable")]
                norm[order] = (p.rank_k + 1.0) / (p.rank_k + 1.0 + np.arange(len(order), dtype=np.float32))
            else:
                norm = _normalise(raw, present, p.vector_norm)
            if covered is not None and name in covered:
                norm = _impute(norm, covered[name][rows], lex_c)
            total += w * norm
        if len(fd_files):
            scored = _normalise(fd_scores, np.ones(len(fd_files), dtype=bool), p.vector_norm)
            at = np.searchsorted(files, fd_files).clip(0, max(len(files) - 1, 0))
            held = files[at] == fd_files if len(files) else np.zeros(len(fd_files), dtype=bool)
            fnorm = at_files(fd_files[held], scored[held])
            if covered is not None and "files" in covered:
                pooled = None if lex_c is None else np.bincount(owner, weights=lex_c, minlength=len(files))
                fnorm = _impute(fnorm, covered["files"][files], pooled)
            total += w_fd * vscale * fnorm[owner]
        if p.w_central:
            total *= 1.0 + p.w_central * c.centrality(files)[owner]
        if p.demote < 1.0:
            kind = c.file_kind(files)
            factor = np.ones(4, dtype=np.float32)
            factor[1] = 1.0 if q.wants_tests else p.demote
            factor[2] = 1.0 if q.wants_docs else p.demote
            factor[3] = 1.0 if q.wants_bench else p.demote
            row_factor = factor[kind][owner]
            if not q.wants_tests:
                # Test code inside a source file (a Rust `#[cfg(test)] mod tests`, Zig `test`
                # blocks) repeats the names of the code it tests, as a test file does, and
                # is demoted the same way (once: a test file's chunks already are).
                row_factor[c.test_code(rows) & (kind[owner] == 0)] *= p.demote
            if q.is_symbol:
                # A bare name asks for its definition: where every definition of it sits in
                # a test, doc or benchmark file, that is the answer, not something to demote.
                defs = row_at[exact_rows]
                if len(defs) and (row_factor[defs] < 1.0).all():
                    row_factor[defs] = 1.0
            total *= row_factor
        if p.demote_imports < 1.0 and not q.wants_imports:
            # An import block names what a file uses, not what it does: it matches a query
            # through the same names as the code that uses them, which is the better answer.
            total[c.imports(rows)] *= p.demote_imports
        if mask is not None:
            kept = mask(rows, files, owner)
            total = np.where(kept, total, 0.0).astype(np.float32)
            if floor:
                total = np.where(kept, np.maximum(total, floor), 0.0).astype(np.float32)
        return Scored(rows, owner, files, total, sources)

    # ---- selection -----------------------------------------------------------------

    def select(
        self, scored: Scored, k: int, *, files_only: bool = False, params: RankingParams | None = None
    ) -> list[tuple[int, float]]:
        """The best ``k`` hits, as ``(row, score)``, best first.

        The rule: take chunks by fused score (ties by chunk id); skip one that overlaps a
        chunk already taken from its file, or past the per-file cap (one with
        ``files_only``); the m-th chunk taken from a file scores ``score * file_decay ** (m
        - 1)``; answer the ``k`` best of those.

        Exact whatever ``k``: the answer for ``k`` is the first ``k`` of the answer for any
        larger ``k``, and ``k`` hits come back whenever ``k`` chunks score above 0. Only the
        top of the order is looked at: a pool of the best raw scores, grown until the
        ``k``-th decayed score is at least the best raw score outside it (decay only lowers
        a score, and a chunk never changes what was taken before it).
        """
        p = params or self.params
        total = scored.total
        pos = np.flatnonzero(total > 0)
        values = total[pos]
        key = self.corpus.ids(scored.rows[pos])
        cap = 1 if files_only else p.max_per_file
        pool = max(16 * k, 256)
        while True:
            order = _top(values, key, pool + 1)  # one more: the best raw score outside
            inside, outside = pos[order[:pool]], pos[order[pool:]]
            taken, scores = self._taken(scored, inside, cap, p.file_decay)
            best = np.argsort(-scores, kind="stable")[:k]  # equal scores: taken first, first
            if not len(outside) or (len(best) == k and scores[best[-1]] >= total[outside[0]]):
                return [(int(scored.rows[taken[i]]), float(scores[i])) for i in best]
            pool *= 4

    def _taken(self, scored: Scored, order: np.ndarray, cap: int, decay: float) -> tuple[np.ndarray, np.ndarray]:
        """The candidates ``order`` (best first) that the rule takes, in that order, and
        their decayed scores (float64)."""
        files = scored.owner[order]
        keep = np.ones(len(order), dtype=bool)
        seen = np.unique(files)
        overlapping = seen[self.corpus.overlapping(scored.files[seen])]
        check = np.isin(files, overlapping)
        if check.any():  # sequential, for those files' chunks only
            lines = self.corpus.lines(scored.rows[order[check]])
            taken: dict[int, list[tuple[int, int]]] = {}
            for i, (start, end) in zip(np.flatnonzero(check).tolist(), lines.tolist()):
                prev = taken.setdefault(int(files[i]), [])
                if any(start <= e and s <= end for s, e in prev):
                    keep[i] = False
                else:
                    prev.append((start, end))
        order, files = order[keep], files[keep]
        # Place of each row among its file's rows taken so far (0 for the first).
        by_file = np.argsort(files, kind="stable")
        sorted_files = files[by_file]
        first = np.searchsorted(sorted_files, sorted_files, side="left")
        place = np.empty(len(order), dtype=np.int64)
        place[by_file] = np.arange(len(order)) - first
        if cap:
            order, place = order[place < cap], place[place < cap]
        return order, scored.total[order].astype(np.float64) * decay**place


def _positions(size: int, keys: np.ndarray) -> np.ndarray:
    """A map from each of ``keys`` (distinct, in ``[0, size)``) to its index in ``keys``, read
    only at those keys: an uninitialised array over the whole space costs nothing until
    written, and only the pages of ``keys`` are (a search per lookup cost ~40% of a query)."""
    at = np.empty(size, dtype=np.int64)
    at[keys] = np.arange(len(keys))
    return at


def _top(values: np.ndarray, key: np.ndarray, n: int) -> np.ndarray:
    """Indexes of the ``n`` highest ``values``, best first; ties by ``key`` (chunk ids,
    distinct), so every pool is a prefix of any larger one."""
    idx = np.arange(len(values))
    if len(values) > n:
        cut = np.partition(values, len(values) - n)[len(values) - n]  # the n-th highest value
        above = np.flatnonzero(values > cut)
        at = np.flatnonzero(values == cut)
        at = at[np.argsort(key[at], kind="stable")][: n - len(above)]
        idx = np.concatenate([above, at])
    return idx[np.lexsort((key[idx], -values[idx]))]
