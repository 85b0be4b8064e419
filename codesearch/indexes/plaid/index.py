"""`PlaidIndex`: multi-vector MaxSim, exact below a token threshold, PLAID above (see the
package's notes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from codesearch.indexes.plaid import build
from codesearch.indexes.plaid.codec import DocCodes, ResidualCodec
from codesearch.indexes.plaid.coded import Coded
from codesearch.indexes.plaid.files import PlaidFiles
from codesearch.indexes.plaid.maxsim import (
    _EMPTY_IDS,
    _EMPTY_SCORES,
    _segment_starts,
    _token_index,
    _top_k,
    exact_maxsim,
)
from codesearch.indexes.plaid.search import PlaidSearch
from codesearch.indexes.plaid.tokens import Tokens
from codesearch.indexes.threads import one_thread

__all__ = ["EXACT_TOKEN_THRESHOLD", "PlaidIndex"]

#: Token count below which the index stays exact (float16 vectors, brute-force MaxSim).
#: 2^18 tokens x 128 dims x 2 bytes = 64 MiB, and a full scan stays around 100 ms.
EXACT_TOKEN_THRESHOLD = 2**18
#: Tokens added since the base was written are folded into it past max(_MIN_TAIL, base / 8):
#: the tail is held in memory and rewritten by every save; the base only by a fold.
_MIN_TAIL = 2**16


class PlaidIndex(PlaidSearch, PlaidFiles):
    """Multi-vector MaxSim index: exact below ``exact_threshold`` tokens, PLAID above.

    Parameters
    ----------
    dim : int or None
        Token vector size; ``None`` takes it from the first :meth:`add`.
    nbits : int
        Residual bits per dimension in PLAID mode, 2 or 4.
    mode : {"auto", "exact", "plaid"}
        ``"auto"`` switches to PLAID when the token count passes ``exact_threshold``;
        ``"exact"`` and ``"plaid"`` force one path at any size.
    exact_threshold : int
        Token count at which ``"auto"`` trains PLAID.
    n_centroids : int or None
        Centroid count; ``None`` uses ``2^floor(log2(16 * sqrt(n_tokens)))`` (ColBERT's
        rule), capped by ``max_centroids`` and by ``n_tokens / 8``.
    max_centroids : int
        Cap on the automatic centroid count (k-means time grows with it).
    nprobe : int
        Centroids probed per query token for candidate generation. Probing is cheap here
        (it reads the probed inverted lists only), so the default is generous: recall on
        clustered data kept rising to 32 (`benchmarks/plaid_bench.py`). Past a few million
        tokens a query probes fewer, nearest first, to read at most
        `codesearch.indexes.plaid.search.PROBE_BUDGET` list entries.
    ndocs : int or None
        Candidates scored by full centroid interaction; a quarter of them (at least ``k``)
        are decompressed and re-ranked exactly. ``None`` uses ``max(512, 8 * k)``
        (PLAID's own defaults run from 25 k at k=10 to 4 k at k=1000).
    kmeans_niter : int
        k-means iterations (ColBERT's default is 4).
    rebuild_ratio : float
        :attr:`needs_rebuild` turns true when the mean reconstruction error of tokens added
        since the build exceeds this multiple of the error at build time.
    seed : int
        k-means seed: builds are reproducible.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> docs = [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(3)]
    >>> docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    >>> index = PlaidIndex(8)
    >>> index.add(np.array([7, 8, 9]), docs)
    >>> ids, scores = index.search([docs[1][:2]], k=1)[0]
    >>> int(ids[0])
    8
    """

    def __init__(
        self,
        dim: int | None = None,
        *,
        nbits: int = 4,
        mode: str = "auto",
        exact_threshold: int = EXACT_TOKEN_THRESHOLD,
        n_centroids: int | None = None,
        max_centroids: int = 2**14,
        nprobe: int = 32,
        ndocs: int | None = None,
        kmeans_niter: int = 4,
        rebuild_ratio: float = 1.5,
        seed: int = 0,
    ) -> None:
        if nbits not in (2, 4):
            raise ValueError(f"nbits must be 2 or 4, got {nbits}")
        if mode not in ("auto", "exact", "plaid"):
            raise ValueError(f"mode must be 'auto', 'exact' or 'plaid', got {mode!r}")
        self._dim = None if dim is None else int(dim)
        self.nbits = nbits
        self.mode = mode
        self.exact_threshold = int(exact_threshold)
        self.n_centroids = n_centroids
        self.max_centroids = int(max_centroids)
        self.nprobe = int(nprobe)
        self.ndocs = ndocs
        self.kmeans_niter = int(kmeans_niter)
        self.rebuild_ratio = float(rebuild_ratio)
        self.seed = int(seed)
        self._reset_docs()
        # Exact mode payload.
        self._vectors: Tokens | None = None  # (tokens, dim) float16
        # PLAID payload.
        self._codec: ResidualCodec | None = None
        self._codes: Tokens | None = None  # (tokens,) centroid ids
        self._residuals: Tokens | None = None  # (tokens, packed_dim) uint8
        self._build_error = 0.0  # mean reconstruction error (L2) of the build's tokens
        self._added_error_sum = 0.0  # ... summed over tokens added since the build
        self._added_tokens = 0
        # Centroid -> doc positions (CSR) of the base's documents (mapped when loaded) and
        # of the tail's (made on first use); see PlaidSearch._inverted_lists.
        self._ivf: tuple[np.ndarray, np.ndarray] | None = None
        self._tail_ivf: tuple[np.ndarray, np.ndarray] | None = None
        self._ivf_reader: tuple[np.ndarray, Tokens] | None = None  # the mapped lists, and a reader of their file
        #: What the index registry knows the store's vectors by when it saved this index
        #: (kept in the manifest; `codesearch.indexes.registry`).
        self.store_mark: str | None = None
        #: The folder a writer saves this index to (the index registry's, holding the index
        #: lock): a `fill` and a fold write their base there as they make it, in bounded
        #: memory (`codesearch.indexes.plaid.build`). None: in memory.
        self.lists_dir: Path | None = None

    def _reset_docs(self) -> None:
        self._ids = np.empty(0, dtype=np.int64)  # (docs,) one per stored document, dead too
        self._doclens = np.empty(0, dtype=np.int64)
        self._starts = np.empty(0, dtype=np.int64)  # first token of each document
        self._alive = np.empty(0, dtype=bool)
        self._pos_map: dict[int, int] | None = None  # id -> position of live documents (see _pos)
        self._dead_tokens = 0
        self._base_docs = 0  # documents [0, _base_docs) have their tokens in the base
        self._written = None  # (folder, manifest entries) where the base is saved already

    @property
    def _pos(self) -> dict[int, int]:
        """Id -> document position, live documents only: made on first use (an add or a
        remove), not when an index is opened for searching (600k entries cost ~0.1 s)."""
        if self._pos_map is None:
            live = np.flatnonzero(self._alive)
            self._pos_map = dict(zip(self._ids[live].tolist(), live.tolist()))
        return self._pos_map

    # -- properties ----------------------------------------------------------------------

    @property
    def dim(self) -> int | None:
        """Token vector size (``None`` until the first add when not given)."""
        return self._dim

    @property
    def kind(self) -> str:
        """``"exact"`` or ``"plaid"``: the path searches take now."""
        return "plaid" if self._codec is not None else "exact"

    def __len__(self) -> int:
        return int(np.count_nonzero(self._alive))

    @property
    def n_tokens(self) -> int:
        """Token vectors of live documents."""
        return int(self._doclens[self._alive].sum())

    def ids(self) -> np.ndarray:
        """Ids of live documents, in insertion order."""
        return self._ids[self._alive].copy()

    @property
    def needs_rebuild(self) -> bool:
        """True when added tokens fit the centroids markedly worse than the build's did."""
        if self._codec is None or self._added_tokens < 64:
            return False
        added = self._added_error_sum / self._added_tokens
        return added > self.rebuild_ratio * self._build_error

    @property
    def codec(self) -> ResidualCodec | None:
        """The residual codec in PLAID mode (None while exact)."""
        return self._codec

    def doc_codes(self, ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Id -> (centroid ids, packed residuals) of the live documents among ``ids``, in
        PLAID mode (empty while exact): what the user's vector cache keeps of them."""
        if self._codec is None:
            return {}
        out = {}
        for doc_id in ids:
            pos = self._pos.get(int(doc_id))
            if pos is not None:
                at = np.arange(int(self._starts[pos]), int(self._starts[pos] + self._doclens[pos]))
                out[int(doc_id)] = (self._codes.take(at), self._residuals.take(at))
        return out

    @property
    def added_error(self) -> float:
        """Mean reconstruction error of tokens added since the last build (0 if none)."""
        return self._added_error_sum / self._added_tokens if self._added_tokens else 0.0

    @property
    def build_error(self) -> float:
        """Mean reconstruction error (L2) at build time, over tokens k-means did not train on."""
        return self._build_error

    def nbytes(self) -> int:
        """Bytes held by the index arrays (payload, codec and document tables)."""
        arrays = [self._ids, self._doclens, self._starts, self._alive]
        if self._codec is not None:
            arrays += [self._codes, self._residuals, self._codec.centroids]
        elif self._vectors is not None:
            arrays.append(self._vectors)
        return int(sum(a.nbytes for a in arrays))

    # -- mutation ------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: Sequence[np.ndarray], *, coded: Coded | None = None) -> None:
        """Add documents; an id already present is replaced (upsert).

        Parameters
        ----------
        ids : np.ndarray
            int64, one per document, unique within the call.
        vectors : sequence of np.ndarray
            One ``(n_tokens_i, dim)`` float array per document, rows L2-normalised.
            A document with no tokens is stored but never returned.
        coded : Coded, optional
            Codes made elsewhere (the run's workers) for some of the documents. Used when
            this index is PLAID under the same codec, or when this add makes it PLAID: it
            then takes that codec instead of training one. Otherwise ignored.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) != len(vectors):
            raise ValueError(f"got {len(ids)} ids for {len(vectors)} documents")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids passed to add() must be unique")
        if not len(ids):
            return
        # (As given, float16 from the store: a float32 copy of every token is made only where
        # the index computes codes, not for the documents the workers coded.)
        docs = [np.asarray(v) for v in vectors]
        docs = [d if d.size else np.empty((0, self._dim or 0), np.float32) for d in docs]
        if self._dim is None:
            self._dim = next((d.shape[1] for d in docs if d.size), None)
            if self._dim is None:
                raise ValueError("cannot infer dim from documents that have no tokens")
        for i, d in enumerate(docs):
            if d.ndim != 2 or (len(d) and d.shape[1] != self._dim):
                raise ValueError(f"document {i} has shape {d.shape}, expected (n_tokens, {self._dim})")
        self.remove(ids)
        lens = np.array([len(d) for d in docs], dtype=np.int64)
        if self._codec is None and self._should_be_plaid(self.n_tokens + int(lens.sum())):
            # Crossing the threshold: train PLAID on everything, the new documents included
            # (before this call makes a flat copy of them: _build makes its own).
            old_ids, old_docs = self._live_documents()
            if coded is not None:
                coded = Coded(coded.codec, coded.error, [None] * len(old_docs) + list(coded.docs))
            self._build(np.concatenate([old_ids, ids]), old_docs + docs, coded)
            return
        base = self._payload_len()
        if self._codec is not None:
            codes, packed, err_sum = self._compress(docs, lens, coded)
            self._added_error_sum += err_sum
            self._added_tokens += int(lens.sum())
            self._codes.append(codes)
            self._residuals.append(packed)
            self._tail_ivf = None
        else:
            new = _flat(docs, self._dim).astype(np.float16)
            if self._vectors is None:
                self._vectors = Tokens(np.empty((0, self._dim), np.float16))
            self._vectors.append(new)
        first = len(self._ids)
        self._ids = np.concatenate([self._ids, ids])
        self._doclens = np.concatenate([self._doclens, lens])
        self._starts = np.concatenate([self._starts, base + _segment_starts(lens)])
        self._alive = np.concatenate([self._alive, np.ones(len(ids), dtype=bool)])
        self._pos.update(zip(ids.tolist(), range(first, first + len(ids))))
        payload = self._codes if self._codec is not None else self._vectors
        if len(payload.tail) > max(_MIN_TAIL, len(payload.base) // 8):
            self._compact()  # fold the tail into a new base

    def fill(
        self, ids: np.ndarray, lens: np.ndarray, keys: Sequence[str],
        fetch: Callable[[np.ndarray], Sequence[np.ndarray]], *, codec: tuple[ResidualCodec, float] | None = None,
        given: Callable[[Sequence[str]], Sequence[DocCodes | None]] | None = None,
        held: Callable[[Sequence[str]], Sequence[DocCodes | None]] | None = None, keep_drift: bool = False,
        wants: Callable[[Sequence[str]], Sequence[bool]] | None = None, keep: Callable | None = None,
    ) -> bool:
        """Replace the contents with the documents ``ids`` (``lens`` tokens each, the vectors
        of their text ``keys``, which ``fetch(ids)`` reads), PLAID, their base written into
        `lists_dir` as it is made: the codec trained on a sample (or ``codec`` taken, with
        the codes ``given`` under it), each distinct text read and compressed once, a block
        at a time (`codesearch.indexes.plaid.build`). ``held``: codes this index holds, by
        text, taken first (a refill under its own codec, with ``keep_drift``: what is coded
        anew counts on in the drift check). ``keep`` is told the codes made (the user's cache
        keeps them); ``wants``: the texts whose arrays it reads.

        Returns False, and leaves the index as it was, where there is no folder to build in,
        the documents stay below the exact threshold, or a read did not match ``lens`` (the
        store changed): the caller then adds them.
        """
        lens = np.asarray(lens, dtype=np.int64)
        folder = self.lists_dir
        if folder is None or Path(folder).is_file() or self._dim is None or not self._should_be_plaid(int(lens.sum())):
            return False
        if codec is not None and (codec[0].nbits != self.nbits or codec[0].dim != self._dim):
            codec, given, held = None, None, None  # (a codec of another shape: trained here instead)
        added = (self._added_error_sum, self._added_tokens) if keep_drift and codec is not None else None
        training = build.Training(self._centroid_count, self.nbits, self.kmeans_niter, self.seed)
        try:
            written = build.fill(Path(folder), ids, lens, keys, fetch, training=training, codec=codec, given=given,
                                 held=held, added=added, wants=wants, keep=keep)
        except build.Changed:
            return False
        self._adopt_base(Path(folder), written)
        return True

    def coded_only(self, ids: np.ndarray, lens: np.ndarray, coded: Coded | None) -> np.ndarray:
        """Which of the documents an :meth:`add` of ``ids`` (``lens`` tokens each) with
        ``coded`` would take from ``coded`` without reading their vectors (a bool each).

        A caller may pass, for those, any array of shape ``(lens[i], dim)`` (the store's
        second copy of a repository reads only the few arrays it has no codes for). Exact:
        the same rule :meth:`add` follows, false wherever it might read the vectors (an
        exact index, a codec that is trained instead of taken).
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        lens = np.asarray(lens, dtype=np.int64).reshape(-1)
        none = np.zeros(len(lens), dtype=bool)
        if coded is None or self._dim is None or len(ids) != len(lens):
            return none
        if self._codec is not None:
            return _taken(self._codec, lens, coded)
        replaced = [self._pos[i] for i in ids.tolist() if i in self._pos]
        after = self.n_tokens - int(self._doclens[replaced].sum()) + int(lens.sum())
        if self._should_be_plaid(after) and self._takes_codec(coded):
            return _taken(coded.codec, lens, coded)  # (the documents already held are exact: read from here)
        return none

    def remove(self, ids: np.ndarray) -> None:
        """Remove documents by id; unknown ids are ignored. Storage is compacted lazily."""
        for doc_id in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            pos = self._pos.pop(doc_id, None)
            if pos is not None:
                self._alive[pos] = False
                self._dead_tokens += int(self._doclens[pos])
        if self._dead_tokens and self._dead_tokens * 4 > self._payload_len():
            self._compact()

    def rebuild(
        self, ids: np.ndarray | None = None, vectors: Sequence[np.ndarray] | None = None
    ) -> None:
        """Retrain from scratch: new centroids, buckets and codes for every live document.

        Parameters
        ----------
        ids, vectors : optional
            Original token vectors for some (or all) documents. Documents not given here
            are rebuilt from their decompressed vectors; given ids that are not in the
            index are added.
        """
        given = {}
        if ids is not None:
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            if vectors is None or len(vectors) != len(ids):
                raise ValueError("rebuild() needs one vectors array per id")
            given = {int(i): np.asarray(v, np.float32) for i, v in zip(ids, vectors)}
        live_ids, live_docs = self._live_documents()
        docs = [given.pop(int(i), d) for i, d in zip(live_ids, live_docs)]
        all_ids = np.concatenate([live_ids, np.array(list(given), dtype=np.int64)])
        docs += list(given.values())
        self._codec = self._codes = self._residuals = self._vectors = None
        self._ivf = self._tail_ivf = None
        self._reset_docs()
        if not len(all_ids):
            return
        if self._dim is None:
            self._dim = next(d.shape[1] for d in docs if len(d))
        if self._should_be_plaid(sum(len(d) for d in docs)):
            self._build(all_ids, docs)
        else:
            self.add(all_ids, docs)

    # -- search --------------------------------------------------------------------------

    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        *,
        nprobe: int | None = None,
        ndocs: int | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` documents by MaxSim for each query, best first.

        Parameters
        ----------
        queries : sequence of np.ndarray
            One ``(q_tokens, dim)`` array per query (a single 2-D array is one query).
        k : int
            Results per query; fewer come back when the index holds fewer documents.
        nprobe, ndocs : int, optional
            Per-call overrides of the constructor's PLAID search parameters.

        Returns
        -------
        list of (np.ndarray, np.ndarray)
            ``(ids int64, scores float32)`` per query.
        """
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if isinstance(queries, np.ndarray) and queries.ndim == 2:
            queries = [queries]
        queries = [np.asarray(q, dtype=np.float32).reshape(len(q), -1) for q in queries]
        for q in queries:
            if self._dim is not None and q.shape[1] != self._dim:
                raise ValueError(f"query has dim {q.shape[1]}, index dim is {self._dim}")
        live = np.flatnonzero(self._alive & (self._doclens > 0))
        if not len(live):
            return [(_EMPTY_IDS.copy(), _EMPTY_SCORES.copy()) for _ in queries]
        with one_thread():
            if self._codec is None:
                scores = exact_maxsim(self._starts, self._doclens, live, queries, self._exact_vectors)
                return [_top_k(self._ids[live], s, k) for s in scores.T]
            return [self._plaid_search(q, k, nprobe or self.nprobe, ndocs) for q in queries]

    def _exact_vectors(self, tokens: np.ndarray) -> np.ndarray:
        return self._vectors.take(tokens).astype(np.float32)


    def outgrows_tail(self, n_tokens: int) -> bool:
        """Whether an add of ``n_tokens`` tokens is alone more than the tail holds before it
        is folded into a new base (so the add would fold it, and fold it again)."""
        payload = self._codes if self._codec is not None else self._vectors
        if payload is None:
            return False
        return int(n_tokens) > max(_MIN_TAIL, len(payload.base) // 8)

    def becomes_plaid(self, n_tokens: int) -> bool:
        """Whether an index of ``n_tokens`` tokens is PLAID (trains a codec), not exact."""
        return self._should_be_plaid(n_tokens)

    # -- internals -----------------------------------------------------------------------

    def _should_be_plaid(self, n_tokens: int) -> bool:
        if self.mode == "auto":
            return n_tokens >= self.exact_threshold
        return self.mode == "plaid" and n_tokens > 0

    def _payload_len(self) -> int:
        if self._codec is not None:
            return len(self._codes)
        return 0 if self._vectors is None else len(self._vectors)

    def _centroid_count(self, n_tokens: int) -> int:
        if self.n_centroids:
            return min(self.n_centroids, n_tokens)
        target = min(16 * math.sqrt(n_tokens), self.max_centroids, max(1, n_tokens / 8))
        return 1 << math.floor(math.log2(max(1.0, target)))

    def _live_documents(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Live ids and their token vectors as float32 (decompressed in PLAID mode)."""
        live = np.flatnonzero(self._alive)
        if not len(live):
            return _EMPTY_IDS.copy(), []
        fetch = self._decompressed if self._codec is not None else self._exact_vectors
        lens = self._doclens[live]
        flat = fetch(_token_index(self._starts[live], lens))
        return self._ids[live], np.split(flat, np.cumsum(lens)[:-1])

    def _build(self, ids: np.ndarray, docs: list[np.ndarray], coded: Coded | None = None) -> None:
        """Train the codec on ``docs`` and store them compressed (replaces the contents);
        with ``coded``, take its codec (trained on a sample, elsewhere) and its codes."""
        lens = np.array([len(d) for d in docs], dtype=np.int64)
        if self._takes_codec(coded):
            self._codec = coded.codec
            codes, packed, _ = self._compress(docs, lens, coded)
            # The codec's error on sampled documents k-means did not see (`train_on_sample`):
            # what the index's drift check compares later additions with.
            build_error = coded.error
        else:
            flat = _flat(docs, self._dim)
            codec, codes, held_out = ResidualCodec.train(
                flat,
                nbits=self.nbits,
                n_centroids=self._centroid_count(len(flat)),
                niter=self.kmeans_niter,
                seed=self.seed,
            )
            codes, packed = codec.compress(flat, codes)
            self._codec = codec
            build_error = float(codec.error(flat, codes, packed)[held_out].mean())
        self._vectors = None
        self._codes, self._residuals = Tokens(codes), Tokens(packed)
        self._build_error = build_error
        self._added_error_sum, self._added_tokens = 0.0, 0
        self._reset_docs()
        self._ids = ids.astype(np.int64)
        self._doclens = lens
        self._starts = _segment_starts(lens)
        self._alive = np.ones(len(ids), dtype=bool)
        self._base_docs = len(ids)
        self._ivf = self._tail_ivf = None

    def _compress(
        self, docs: Sequence[np.ndarray], lens: np.ndarray, coded: Coded | None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Codes, packed residuals and summed reconstruction error of the documents ``docs``
        (``lens`` tokens each), concatenated, under this index's codec: taken from ``coded``
        for the documents it has codes for under that codec, computed here for the rest."""
        codec = self._codec
        taken = _taken(codec, lens, coded)
        given = coded.docs if taken.any() else ()
        missing = np.flatnonzero(~taken).tolist()
        if len(missing) == len(docs):
            flat = _flat(docs, self._dim)
            codes, packed = codec.compress(flat)
            return codes, packed, float(codec.error(flat, codes, packed).sum(dtype=np.float64))
        starts = _segment_starts(lens)
        total = int(lens.sum())
        codes = np.empty(total, codec.code_dtype)
        packed = np.empty((total, codec.packed_dim), np.uint8)
        err_sum = 0.0
        rest = _token_index(starts[missing], lens[missing]) if missing else np.empty(0, np.int64)
        if len(rest):
            flat = _flat([docs[i] for i in missing], self._dim)
            codes[rest], packed[rest] = codec.compress(flat)
            err_sum += float(codec.error(flat, codes[rest], packed[rest]).sum(dtype=np.float64))
        skip = set(missing)
        for i, d in enumerate(given):
            if i not in skip and lens[i]:
                codes[starts[i] : starts[i] + lens[i]] = d.codes
                packed[starts[i] : starts[i] + lens[i]] = d.packed
                err_sum += d.error
        return codes, packed, err_sum

    def _takes_codec(self, coded: Coded | None) -> bool:
        """Whether a build given ``coded`` takes its codec (and codes) instead of training."""
        return coded is not None and coded.codec.nbits == self.nbits and coded.codec.dim == self._dim

    def _compact(self) -> None:
        """A new base of the live documents, base and tail (the tokens of removed documents
        dropped, positions renumbered): written into `lists_dir` a block at a time when
        there is one (PLAID), else in memory, written whole by the next save."""
        if self._codec is not None and self.lists_dir is not None and not Path(self.lists_dir).is_file():
            live = np.flatnonzero(self._alive)
            written = build.compact(Path(self.lists_dir), self._ids[live], self._doclens[live], self._starts[live],
                                    self._codes, self._residuals, self._codec, self._build_error,
                                    (self._added_error_sum, self._added_tokens))
            self._adopt_base(Path(self.lists_dir), written)
            return
        live = np.flatnonzero(self._alive)
        tokens = _token_index(self._starts[live], self._doclens[live])
        if self._codec is not None:
            self._codes = Tokens(self._codes.take(tokens))
            self._residuals = Tokens(self._residuals.take(tokens))
        elif self._vectors is not None:
            self._vectors = Tokens(self._vectors.take(tokens))
        ids, doclens = self._ids[live], self._doclens[live]
        self._reset_docs()
        self._ids, self._doclens = ids, doclens
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(live), dtype=bool)
        self._base_docs = len(live)
        self._ivf = self._tail_ivf = None


    def _adopt_base(self, folder: Path, written: build.Written) -> None:
        """Take the base `build` wrote into ``folder`` as the whole contents: saved with it,
        then opened mapped, as a load opens it."""
        codec, added = written.codec, written.added
        self._codec, self._vectors = codec, None
        self._reset_docs()
        self._ids, self._doclens = written.ids.astype(np.int64), written.lens.astype(np.int64)
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(self._ids), dtype=bool)
        self._base_docs = len(self._ids)
        self._codes = Tokens(np.empty(0, codec.code_dtype))  # (the save keeps the files; the load maps them)
        self._residuals = Tokens(np.empty((0, codec.packed_dim), np.uint8))
        self._ivf = self._tail_ivf = None
        self._build_error = written.build_error
        self._added_error_sum, self._added_tokens = added
        self._written = (folder.resolve(), {name: k.entry for name, k in written.kept.items()})
        self.save(folder)
        opened = type(self).load(folder)
        for name, value in vars(opened).items():
            if name not in ("lists_dir", "store_mark"):
                setattr(self, name, value)


def _taken(codec: ResidualCodec, lens: np.ndarray, coded: Coded | None) -> np.ndarray:
    """Which documents (``lens`` tokens each) take their codes from ``coded`` under ``codec``:
    those it has codes for, made under that codec, of their length."""
    given = coded.docs if coded is not None and coded.codec.fingerprint == codec.fingerprint else ()
    return np.array(
        [i < len(given) and given[i] is not None and len(given[i].codes) == lens[i] for i in range(len(lens))],
        dtype=bool,
    )


def _flat(docs: Sequence[np.ndarray], dim: int) -> np.ndarray:
    """The documents' token vectors, concatenated, as float32."""
    parts = [d for d in docs if len(d)]
    return np.concatenate(parts, dtype=np.float32) if parts else np.empty((0, dim), np.float32)
