"""The query side's entry point: a `Searcher` opens one index folder at its store's generation
and answers queries from every index it holds (signals and fusion: :mod:`codesearch.search.ranking`).

Example
-------
>>> from codesearch.search.searcher import Searcher
>>> s = Searcher("repo/.codesearch")                         # doctest: +SKIP
>>> s.search("parse the config file", k=5).hits[0].path      # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from codesearch.encoder.base import Encoders
from codesearch.errors import CodeSearchError, IndexCorruptError, NotIndexedError, QueryError
from codesearch.globs import GlobFilter
from codesearch.indexes.dense import CentroidIndex
from codesearch.indexes.registry import (
    DERIVED,
    FILE_VECTOR_MIN_TOKENS,
    IndexSpec,
    load_derived,
    rebuild_index,
    rebuild_lexical,
)
from codesearch.search.phrase import CANDIDATES, exact_first, pasted_phrase
from codesearch.search.query import Query, analyse
from codesearch.search.ranking import Candidates, Ranker, RankingParams, RowFilter, Scored
from codesearch.store import IndexLock, Store
from codesearch.store.schema import DISABLED_KEY
from codesearch.textregex import compile_regex
from codesearch.types import STORE_FILE, Mode, SearchHit, SearchRequest, SearchResult


def _chunk_vectors() -> list[IndexSpec]:
    """The indexes of chunk vectors in the registry, in the order their signals are fused."""
    return [spec for spec in DERIVED.values() if spec.kind is not None and not spec.per_file]


def _file_vectors() -> tuple[IndexSpec, IndexSpec]:
    """The index of whole-file vectors, and the chunk index of the same model (its chunk
    vectors make the files' centroids for a short-context model)."""
    files = next(spec for spec in DERIVED.values() if spec.per_file and not spec.chunk_mean)
    return files, next(spec for spec in _chunk_vectors() if spec.role() == files.role())


def _file_centroid_index() -> IndexSpec:
    """The index of per-file means of the chunk vectors of `_file_vectors`' chunk index."""
    _, chunks = _file_vectors()
    return next(spec for spec in DERIVED.values() if spec.chunk_mean and spec.kind == chunks.kind)

#: Why a mode that names a vector index cannot search it: (built, no encoder), (not built).
_UNSEARCHABLE = {
    "dense": (
        "dense search needs the index's model to encode the query and it is not loaded (make the "
        "model available again, or re-embed with 'codesearch index --rebuild --model PATH_OR_ID')",
        "this index has no dense vectors (index with a model: 'codesearch index --model PATH_OR_ID')",
    ),
    "colbert": (
        "colbert search needs the index's ColBERT model to encode the query and it is not loaded "
        "(make it available again, or re-embed with 'codesearch index --rebuild --multi-model PATH_OR_ID')",
        "this index has no multi-vector index (index with a ColBERT model: 'codesearch index --multi-model ID')",
    ),
}


#: How to add vectors to an index that has none, which works offline too: a plain
#: 'codesearch index' downloads the default model, or fails to (offline) and stays lexical.
ADD_VECTORS = ("online, 'codesearch index' adds them; offline, 'codesearch index --model PATH' does, PATH a "
               "local model folder (--multi-model PATH for a ColBERT one)")


def _unsearchable(spec: IndexSpec, built: bool) -> str:
    loaded, absent = _UNSEARCHABLE.get(spec.signal, (
        f"{spec.signal} search needs the index's {spec.role()} model to encode the query and it is not loaded "
        "(make it available again, or re-embed with 'codesearch index --rebuild')",
        f"this index has no {spec.signal} vectors (index with a {spec.role()} model)",
    ))
    return loaded if built else absent


def _weight(params: RankingParams, spec: IndexSpec) -> float:
    """The fused score's weight of ``spec``'s candidates: the `RankingParams` field it names."""
    assert spec.weight is not None, spec  # every index of chunk vectors names its weight
    return float(getattr(params, spec.weight))


class Searcher:
    """Searches one index folder; safe to share between threads.

    Parameters
    ----------
    index_dir : path
        The ``.codesearch`` folder (``store.sqlite`` and the derived index files).
    encoders : codesearch.encoder.base.Encoders, optional
        Query encoders for the dense and multi-vector indexes; without them only the
        lexical index is searched (the result's ``notices`` say so).

    Examples
    --------
    >>> s = Searcher("repo/.codesearch")                       # doctest: +SKIP
    >>> for hit in s.search("parse the config file", k=5).hits:  # doctest: +SKIP
    ...     print(hit.path, hit.start_line, round(hit.score, 3))
    """

    def __init__(
        self, index_dir: str | Path, *, encoders: Encoders | None = None, params: RankingParams | None = None
    ) -> None:
        self.index_dir = Path(index_dir)
        store_path = self.index_dir / STORE_FILE
        if not store_path.is_file():
            raise NotIndexedError(f"no index in {str(self.index_dir)!r} (run 'codesearch index' first)")
        self._lock = threading.RLock()
        # Which file this searcher reads, taken before opening it: a store replaced in
        # between is then seen as replaced once more (one extra reopen), never missed.
        self._store_id = _file_id(store_path)
        self._store = Store(store_path, readonly=True)
        if self._store.generation == 0 and IndexLock.writer_active(self.index_dir):
            self._store.close()
            raise NotIndexedError(
                f"the first index run of {str(self.index_dir)!r} is still reading the files and nothing is "
                "searchable yet (try again in a few seconds)"
            )
        self._indexes = load_derived(self.index_dir, self._store)
        self._encoders = encoders
        # What ranking needs of every chunk and file is in the lexical index, computed when
        # it was written and read in place: opening it maps arrays, and a query reads the
        # rows it touches (chunk text is fetched for the returned hits only, see _hits).
        lexical = self._indexes["lexical"]
        self._ranker = Ranker(lexical, params)
        self._notices = list(lexical.notices)  # said once, on the next answer
        self._generation = self._store.generation
        self._covered = self._coverage()
        # A run told '--multi-model none' (the vector model of every device): lexical-only
        # was asked for, so a hybrid query that finds no vectors is no surprise to say.
        self._chose_lexical = "colbert" in (self._store.get_meta(DISABLED_KEY) or "")
        self._centroids: tuple[CentroidIndex, np.ndarray] | None = None  # see _file_centroids

    # -- public ----------------------------------------------------------------------------

    def search(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | Sequence[str] | None = None,
        glob: str | Sequence[str] | None = None,
        files_only: bool = False,
        path_rules: Sequence[str] | None = None,
    ) -> SearchResult:
        """Rank the index's chunks for ``query``.

        Parameters
        ----------
        query : str or SearchRequest
            Words, an identifier, or a piece of code; or a whole `SearchRequest` (checked
            when it was made, not again here; the other arguments are then not used, and
            its output controls are the caller's to apply).
        k : int
            Number of hits.
        mode : {"hybrid", "lexical", "dense", "colbert"}
            ``hybrid`` fuses every index the folder has; the others use one index (plus
            the code-aware signals), and fail when that index was not built.
        language : str or sequence of str, optional
            Keep only chunks in (any of) these languages.
        glob : str or sequence of str, optional
            Keep only chunks whose path passes these ripgrep-style rules (gitignore
            globs, ``!`` excludes, ``{a,b}``; see :mod:`codesearch.globs`).
        files_only : bool
            At most one hit per file.
        path_rules : sequence of str, optional
            Glob rules to apply instead of the request's: made by the caller from them
            (the server's, scoped to a folder), so not held to a request's limits.

        Raises
        ------
        QueryError
            Empty query, unknown mode, ``k < 1``, or a mode whose index is missing.
        """
        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=language, glob=glob, files_only=files_only
        )
        rules = request.globs if path_rules is None else tuple(path_rules)
        return self._search(request, rules)

    def _search(self, request: SearchRequest, rules: tuple[str, ...]) -> SearchResult:
        query, mode = request.query, request.mode.value
        notices: list[str] = []
        q = analyse(query)
        encoders = self._encoders.by_role() if self._encoders is not None else {}
        # The vector indexes this query searches: in hybrid mode each one built and with its
        # query encoder; a mode named after one of them searches that one, or says why not.
        searched: list[IndexSpec] = []
        built_any = False
        for spec in _chunk_vectors():
            index = self._indexes.get(spec.name)
            built = index is not None and len(index) > 0
            built_any = built_any or built
            ready = built and spec.role() in encoders
            if mode == spec.signal and not ready:
                raise QueryError(_unsearchable(spec, built))
            if ready and mode in (Mode.hybrid.value, spec.signal):
                searched.append(spec)
        use_lex = mode in ("hybrid", "lexical")
        if mode == "hybrid" and not searched and self._covered and not built_any:
            notices.append(f"semantic vectors for 0% of chunks so far ({self._still_embedding()}); lexical for all")
        elif mode == "hybrid" and not built_any and not self._covered and not self._chose_lexical:
            # Lexical-only without being asked (the default model was not cached, or a query
            # built the index): the answer is not the hybrid one the query asked for.
            notices.append(
                "lexical index only: this index has no semantic vectors, so BM25 alone ranked this hybrid query "
                f"({ADD_VECTORS}; --mode lexical asks for BM25 without this notice)"
            )
        elif mode == "hybrid" and not searched and built_any:
            # Said only when this query lost vectors the index has: an index built lexical-only
            # says so once, at index time, and indexes_used shows it on every answer.
            notices.append(
                "lexical index only: this index's model is not loaded, so its vectors were not searched "
                "(make the model available again, or 'codesearch index --rebuild --model PATH_OR_ID')"
            )
        try:
            return self._ranked(request, rules, q, searched, encoders, use_lex, notices)
        except IndexCorruptError:
            # A lexical index file found damaged by this query (files are checked where they
            # are read): rebuilt from the store, and the query asked again, once.
            self._reopen_lexical()
            return self._ranked(request, rules, q, searched, encoders, use_lex, notices)

    def _ranked(self, request: SearchRequest, rules: tuple[str, ...], q: Query, searched: list[IndexSpec],
                encoders: dict, use_lex: bool, notices: list[str]) -> SearchResult:
        query, k, mode = request.query, request.k, request.mode.value
        notices = list(notices)
        mask = self._mask(request.languages, rules)
        include = None
        if request.regex is not None:
            include, mask = self._regex_mask(request.regex, mask)
        p = self._ranker.params
        n_cand = max(p.dense_candidates, 4 * k)
        vectors: dict[str, Candidates] = {}
        file_dense = None
        _, file_chunks = _file_vectors()
        used: list[str] = ["lexical"] if use_lex else []
        for spec in searched:
            encoded = encoders[spec.role()].encode([query], kind="query")
            queries = [encoded[0]] if spec.multi else np.asarray(encoded, dtype=np.float32)
            ids, scores = self._indexes[spec.name].search(queries, n_cand)[0]
            vectors[spec.signal] = Candidates(self._ranker.rows_of(ids), scores, _weight(p, spec))
            used.append(spec.signal)
            if spec is file_chunks:
                # The whole-file signal reads the same query vector.
                file_dense = self._file_scores(queries, encoders[spec.role()].max_length, k, used)
        live = max(1, len(self._ranker.corpus))
        shares = [
            f"{int(100 * self._covered[name].sum() / live)}% of chunks" for name in vectors if name in self._covered
        ]
        if shares:
            notices.append(
                f"semantic vectors for {' and '.join(shares)} so far ({self._still_embedding()}); lexical for all"
            )
        covered = dict(self._covered)
        if "file_vectors" in covered and file_dense is not None and file_dense[2]:
            covered["files"] = covered["file_vectors"]
        scored = self._ranker.score(
            q,
            use_lexical=use_lex,
            vectors=vectors,
            file_dense=None if file_dense is None else file_dense[:2],
            mask=mask,
            covered=covered or None,
            # Every chunk the regex keeps can be ranked, the ones no signal scores last (by
            # chunk id): a regex match is itself a reason to show it, as grep would.
            include=include,
            floor=_MATCHED_FLOOR if include is not None else 0.0,
        )
        # A pasted piece of code finds the chunks that hold it first (codesearch.search.phrase).
        phrase = pasted_phrase(query) if use_lex else None
        picked = self._ranker.select(scored, max(k, CANDIDATES) if phrase else k, files_only=request.files_only)
        if phrase is not None:
            picked = exact_first(picked, phrase, self._chunk_texts)[:k]
        hits = self._hits(picked, scored)
        with self._lock:
            said, self._notices = self._notices, []
        return SearchResult(query=query, mode=mode, hits=hits, indexes_used=tuple(used), notices=[*said, *notices])

    def set_encoders(self, encoders: Encoders | None) -> None:
        """Use these query encoders from the next search on (``None``: lexical only)."""
        with self._lock:
            self._encoders = encoders

    @property
    def generation(self) -> int:
        """The store generation this searcher opened (and, pinned, holds)."""
        return self._generation

    def is_current(self) -> bool:
        """Whether the store is still at the generation this searcher opened (one meta read;
        always true for a pinned searcher, whose read transaction keeps its snapshot) and
        still the file at the index's path (see `is_replaced`)."""
        if self.is_replaced():
            return False
        with self._lock:
            try:
                return self._store.generation == self._generation
            except CodeSearchError:
                return True  # a store being rewritten: keep answering from this one

    def is_replaced(self) -> bool:
        """Whether another store file now sits at this searcher's path (one ``stat``).

        Why: ``codesearch import --force`` (or any rename of a new ``.codesearch`` into
        place) leaves this searcher reading the old, unlinked file, whose generation says
        nothing about the new one (both may be 1). A path with no store at all (mid-rename,
        or deleted) is not a replacement: the open one goes on answering.
        """
        now = _file_id(self.index_dir / STORE_FILE)
        return now is not None and now != self._store_id

    def pin(self) -> bool:
        """Hold a read transaction open on the store until `close`; False when too late.

        Why: the ranking indexes live in memory, but each hit's record (path, lines, text)
        is read from SQLite when a search answers. Without a pin, a searcher kept open
        while another run commits would rank with generation N and print records of N+1.
        In WAL mode an open read transaction keeps the snapshot of its first read, so a
        pinned searcher stays wholly on its generation. Returns False (and pins nothing)
        when a run committed between this searcher's opening and the pin: open a new one.
        """
        with self._lock:
            conn = self._store.conn
            if conn.in_transaction:
                return True
            self._store.begin_read()
            if self._store.generation == self._generation:  # the snapshot starts at this read
                return True
            conn.execute("ROLLBACK")
            return False

    def close(self) -> None:
        """Release the store connection (idempotent)."""
        with self._lock:
            self._store.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _file_scores(
        self, query: np.ndarray, max_length: int, k: int, used: list[str]
    ) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """(file rows, scores, from the files' own vectors?) of the whole-file signal: the
        files' own vectors for a long-context model, else the mean of their chunk vectors;
        None when there is neither."""
        long_context = int(max_length) >= FILE_VECTOR_MIN_TOKENS
        file_vectors, _ = _file_vectors()
        index = self._indexes.get(file_vectors.name)
        if self._ranker.params.w_file_centroid and not long_context:
            index, rows = self._file_centroids()
            _, scores = index.scores(query)
            used.append(file_vectors.signal)
            return rows, scores, False
        if long_context and index is not None and len(index):
            fids, fscores = index.search(query, max(50, k * 5))[0]
            used.append(file_vectors.signal)
            return self._ranker.corpus.files_of(np.asarray(fids, dtype=np.int64)), fscores, True
        return None

    def _still_embedding(self) -> str:
        if IndexLock.writer_active(self.index_dir):
            return "an index run is still embedding"
        return "run 'codesearch index' to embed the rest"

    def _coverage(self) -> dict[str, np.ndarray]:
        """Which rows (and files) have a vector yet, for each vector index that lacks some:
        empty when every vector is in (the usual case), so ranking is then untouched."""
        c = self._ranker.corpus
        n = len(c)
        out: dict[str, np.ndarray] = {}
        for spec in _chunk_vectors():
            index = self._indexes.get(spec.name)
            if index is None or len(index) >= n:
                continue
            cov = np.zeros(c.n_rows, dtype=bool)
            rows = self._ranker.rows_of(index.ids())
            cov[rows[rows >= 0]] = True
            out[spec.signal] = cov
        file_vectors, file_chunks = _file_vectors()
        chunk_signal = file_chunks.signal
        if chunk_signal in out:
            # Files: by chunk centroids (short-context models), covered when any chunk is;
            # by their own vectors (long-context models), covered when they have one.
            files = np.zeros(c.n_files, dtype=bool)
            files[c.file_of(np.flatnonzero(out[chunk_signal]))] = True
            out["files"] = files
            vectors = np.zeros(c.n_files, dtype=bool)
            index = self._indexes.get(file_vectors.name)
            if index is not None and len(index):
                fr = c.files_of(np.asarray(index.ids(), dtype=np.int64))
                vectors[fr[fr >= 0]] = True
            out["file_vectors"] = vectors
        return out

    def _file_centroids(self) -> tuple[CentroidIndex, np.ndarray]:
        """The index of each file's mean chunk vector, and the corpus file row of each of its
        vectors in the order `CentroidIndex.scores` gives them (-1: a file the corpus lacks).

        Made when the index is written (`registry.DERIVED["file_centroids"]`), for a model
        recorded as short-context; an index from before that record (or whose model's length
        is not known yet) gets it made here from the store, once per searcher.
        """
        with self._lock:
            if self._centroids is None:
                spec = _file_centroid_index()
                index = self._indexes.get(spec.name)
                if not isinstance(index, CentroidIndex):
                    index = rebuild_index(spec.name, self._store)
                ids, _ = index.scores(np.zeros((1, index.dim), dtype=np.float32))
                self._centroids = (index, self._ranker.corpus.files_of(np.asarray(ids, dtype=np.int64)))
        return self._centroids

    def _mask(self, languages: tuple[str, ...], globs: tuple[str, ...]) -> RowFilter | None:
        """The language and path filters, for the rows a query scores (None: every row). Both
        are checked already: a language is canonical, a glob parses. Paths are matched for
        the candidate files only, not for every file of the index."""
        if not languages and not globs:
            return None
        c = self._ranker.corpus
        spec = GlobFilter.of(globs) if globs else None

        def keep(rows: np.ndarray, files: np.ndarray, owner: np.ndarray) -> np.ndarray:
            # A language this index lacks keeps nothing.
            out = c.in_languages(rows, languages) if languages else np.ones(len(rows), dtype=bool)
            if spec is not None:
                fmask = np.fromiter(spec.matches(c.paths(files)), dtype=bool, count=len(files))
                out &= fmask[owner]
            return out

        return keep

    def _regex_mask(self, pattern: str, mask: RowFilter | None) -> tuple[np.ndarray, RowFilter]:
        """The rows whose chunk text matches ``pattern`` (checked when the request was made)
        among those ``mask`` keeps, and the filter that keeps just them.

        Why in batches: the texts are most of an index's bytes. They are read from the store
        `_TEXT_BATCH` chunks at a time, only for rows the other filters keep, and each batch
        is matched and dropped before the next is read; the store's lock is held per read,
        so the other searches of this searcher go on between batches. A pinned searcher
        reads every batch from its one generation.
        """
        c = self._ranker.corpus
        regex = compile_regex(pattern)
        files = c.live_files()
        rows, owner = c.file_rows(files)
        if mask is not None:
            rows = rows[mask(rows, files, owner)]
        ids = c.ids(rows)
        order = np.argsort(ids, kind="stable")  # by id: each batch is one stretch of the table
        rows, ids = rows[order], ids[order]
        keep = np.zeros(len(rows), dtype=bool)
        for start in range(0, len(rows), _TEXT_BATCH):
            part = ids[start : start + _TEXT_BATCH]
            with self._lock:
                batch = self._store.chunk_texts(part.tolist())  # by id, a subset of part
            found = np.fromiter((i for i, _ in batch), dtype=ids.dtype, count=len(batch))
            hits = np.fromiter(regex.matches(text for _, text in batch), dtype=bool, count=len(batch))
            keep[start + np.searchsorted(part, found[hits])] = True
            del batch
        matched = np.sort(rows[keep])

        def kept(rows: np.ndarray, files: np.ndarray, owner: np.ndarray) -> np.ndarray:
            at = np.searchsorted(matched, rows).clip(0, max(len(matched) - 1, 0))
            return matched[at] == rows if len(matched) else np.zeros(len(rows), dtype=bool)

        return matched, kept

    def _chunk_texts(self, rows: list[int]) -> list[tuple[str, str]]:
        """(path, code) of the chunks at ``rows`` of the ranker's corpus, in order."""
        ids = self._ranker.corpus.ids(np.array(rows, dtype=np.int64)).tolist()
        with self._lock:
            stored = {r.id: (r.chunk.path, r.chunk.text) for r in self._store.chunk_records(ids)}
        return [stored.get(i, ("", "")) for i in ids]

    def _hits(self, picked: list[tuple[int, float]], scored: Scored) -> list[SearchHit]:
        rows = np.array([r for r, _ in picked], dtype=np.int64)
        ids = self._ranker.corpus.ids(rows).tolist()
        with self._lock:
            stored = {r.id: r for r in self._store.chunk_records(ids)}
        hits = []
        for (_, s), cid, i in zip(picked, ids, scored.positions(rows).tolist()):
            rec = stored.get(cid)
            if rec is None:
                continue
            src = tuple(name for name, v in scored.sources.items() if v[i] > 0)
            hits.append(SearchHit.of(rec.chunk, chunk_id=rec.id, score=float(s), sources=src))
        return hits

    def _reopen_lexical(self) -> None:
        """Rebuild the lexical index from the store (a query found a file of it damaged)."""
        with self._lock:
            index = rebuild_lexical(self.index_dir, self._store)
            self._indexes["lexical"] = index
            self._ranker = Ranker(index, self._ranker.params)
            self._covered = self._coverage()
            self._centroids = None


#: The least score of a chunk the regex keeps: above 0, so that one no signal scores can be
#: ranked (after every scored one, by row); far below the scores signals give.
_MATCHED_FLOOR = 1e-6
#: Chunk texts read from the store per lock, by the regex filter.
_TEXT_BATCH = 2000


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``; None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
