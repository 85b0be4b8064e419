"""Multi-vector index: PLAID over ColBERT token vectors, exact MaxSim for small collections.

A document is a variable number of L2-normalised token vectors; its score for a query is
MaxSim: for every query token, the best inner product with any document token, summed.

Small collections (below ``exact_threshold`` tokens) keep the token vectors in float16 and
score every document exactly: that is both the fastest path at that size and the oracle
the PLAID path is tested against. Past the threshold the index becomes PLAID
(Santhanam et al., 2022, on ColBERTv2's residual compression):

- **centroids**: spherical k-means over token vectors, ``2^floor(log2(16 * sqrt(n_tokens)))``
  of them as in ColBERT/PLAID, capped (``max_centroids``);
- **residual compression**: each token stores its centroid id (``codes``) and its
  residual ``v - centroid`` quantised to ``nbits`` (2 or 4) per dimension. Bucket cutoffs
  are quantiles of all residual values, each bucket decodes to the mean residual that fell
  in it; bits are packed ``8 // nbits`` values per byte;
- **candidate generation**: each query token probes its ``nprobe`` nearest centroids; the
  documents with a token in a probed centroid are candidates;
- **centroid interaction**: candidates are ranked by MaxSim computed with centroid scores
  only (no decompression), and the best ``ndocs`` survive;
- **exact re-ranking**: survivors are decompressed (centroid + decoded residual,
  re-normalised) and scored by exact MaxSim.

Adds and removes need no rebuild: new tokens are assigned to the existing centroids and
compressed with the existing buckets; removed documents are dropped lazily (their tokens
are compacted away once they exceed a quarter of the storage). The mean reconstruction
error of added tokens is tracked; when it grows past ``rebuild_ratio`` times the error at
build time the data has drifted from the centroids and :attr:`PlaidIndex.needs_rebuild`
turns true; :meth:`PlaidIndex.rebuild` retrains.

On disk: one ``.npz`` (numpy arrays plus a JSON manifest stored as bytes, loaded with
``allow_pickle=False``), written to a temp name and ``os.replace``d. Zip CRCs catch
damaged bytes, the manifest's shapes catch the rest.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.store import atomic_write

__all__ = ["EXACT_TOKEN_THRESHOLD", "PlaidIndex", "ResidualCodec", "maxsim_search"]

#: Token count below which the index stays exact (float16 vectors, brute-force MaxSim).
#: 2^18 tokens x 128 dims x 2 bytes = 64 MiB, and a full scan stays around 100 ms.
EXACT_TOKEN_THRESHOLD = 2**18

_FORMAT_VERSION = 1
_FILE_NAME = "index.npz"
# Tokens scored per block in exact MaxSim: bounds the (tokens, query tokens) score matrix.
_BLOCK_TOKENS = 1 << 16
_EMPTY_IDS = np.empty(0, dtype=np.int64)
_EMPTY_SCORES = np.empty(0, dtype=np.float32)
#: Tokens per step of the per-token passes (assign, compress, reconstruction error): their
#: float32 temporaries stay ~200 MB at 48 dims, not several copies of every token. A 60k-text
#: index (15M tokens) took 24 GB in one publication before.
_STEP = 1_000_000


def _corrupt(path: Path, why: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"Multi-vector index '{path}' cannot be read ({why}); "
        "run 'codesearch index --rebuild' to recreate it"
    )


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _token_index(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + len)`` for each document, without a Python loop."""
    total = int(lens.sum())
    shift = starts - (np.cumsum(lens) - lens)  # (docs,) start minus position in the output
    return np.repeat(shift, lens) + np.arange(total, dtype=np.int64)


def _segment_starts(lens: np.ndarray) -> np.ndarray:
    return np.cumsum(lens) - lens


def _best(items: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` items with the highest scores, in no particular order."""
    if len(items) <= n:
        return items
    return items[np.argpartition(-scores, n - 1)[:n]]


def _top_k(doc_ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if len(scores) > k:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(len(scores))
    order = part[np.lexsort((doc_ids[part], -scores[part]))]  # score desc, then id asc
    return doc_ids[order].astype(np.int64), scores[order].astype(np.float32)


# -- brute force ---------------------------------------------------------------------------


def maxsim_search(
    queries: Sequence[np.ndarray], ids: np.ndarray, docs: Sequence[np.ndarray], k: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact MaxSim top-``k`` over float32 documents: the reference every path is held to.

    Parameters
    ----------
    queries : sequence of np.ndarray
        One ``(q_tokens, dim)`` array per query.
    ids : np.ndarray
        One int64 id per document.
    docs : sequence of np.ndarray
        One ``(n_tokens_i, dim)`` array per document.
    k : int
        Results per query.
    """
    ids = np.asarray(ids, dtype=np.int64)
    keep = np.array([len(d) > 0 for d in docs], dtype=bool)
    if not keep.any():
        return [(_EMPTY_IDS.copy(), _EMPTY_SCORES.copy()) for _ in queries]
    flat = np.concatenate([np.asarray(d, np.float32) for d, kp in zip(docs, keep) if kp])
    lens = np.array([len(d) for d in docs], dtype=np.int64)[keep]
    out = []
    for q in queries:
        sims = flat @ np.asarray(q, np.float32).T  # (tokens, q_tokens)
        scores = np.maximum.reduceat(sims, _segment_starts(lens), axis=0).sum(axis=1)
        out.append(_top_k(ids[keep], scores, k))
    return out


# -- residual codec ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ResidualCodec:
    """Centroids plus the ``nbits`` residual quantiser of ColBERTv2.

    Attributes
    ----------
    centroids : np.ndarray
        ``(n_centroids, dim)`` float32, unit norm.
    cutoffs : np.ndarray
        ``(2**nbits - 1,)`` bucket boundaries on residual values (shared by all dims).
    weights : np.ndarray
        ``(2**nbits,)`` value each bucket decodes to: the mean residual that fell in it.
    nbits : int
        Bits per dimension, 2 or 4.
    """

    centroids: np.ndarray
    cutoffs: np.ndarray
    weights: np.ndarray
    nbits: int

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def packed_dim(self) -> int:
        """Bytes per token of packed residual."""
        per_byte = 8 // self.nbits
        return -(-self.dim // per_byte)

    @property
    def code_dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if len(self.centroids) <= 2**16 else np.int32)

    @classmethod
    def train(
        cls,
        vectors: np.ndarray,
        *,
        nbits: int,
        n_centroids: int,
        niter: int = 4,
        seed: int = 0,
    ) -> tuple[ResidualCodec, np.ndarray, np.ndarray]:
        """Fit centroids and buckets on ``vectors``.

        Returns
        -------
        codec : ResidualCodec
        codes : np.ndarray
            Nearest centroid of every vector.
        held_out : np.ndarray
            Positions of vectors k-means did not train on: their reconstruction error is
            the honest baseline for later additions (training points fit their centroids
            better than any new point will).
        """
        import faiss

        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        # 32 points per centroid pin the centroids down well enough and keep training to
        # seconds at a million tokens on a laptop (ColBERT samples documents for the same
        # reason); at least a tenth is always held out.
        n = len(vectors)
        n_train = max(min(32 * n_centroids, int(0.9 * n)), min(n, n_centroids))
        order = np.random.default_rng(seed).permutation(n)
        kmeans = faiss.Kmeans(
            vectors.shape[1],
            n_centroids,
            niter=niter,
            seed=seed,
            spherical=True,
            max_points_per_centroid=32,
            # 32 per centroid is the design (above); faiss's default minimum of 39 printed a
            # "please provide at least ... training points" warning on every large index run
            min_points_per_centroid=1,
            verbose=False,
        )
        kmeans.train(vectors[np.sort(order[:n_train])])
        centroids = _normalise(kmeans.centroids.astype(np.float32))
        codes = _assign(centroids, vectors)
        dim = vectors.shape[1]
        if n * dim > 4_000_000:  # quantiles of a few million residual values are plenty
            at = np.random.default_rng(seed).integers(0, n * dim, 4_000_000)
            rows, cols = np.divmod(at, dim)
            sample = vectors[rows, cols] - centroids[codes[rows], cols]
        else:
            sample = (vectors - centroids[codes]).reshape(-1)
        n_buckets = 1 << nbits
        cutoffs = np.quantile(sample, np.arange(1, n_buckets) / n_buckets).astype(np.float32)
        buckets = np.searchsorted(cutoffs, sample, side="right")
        counts = np.bincount(buckets, minlength=n_buckets)
        sums = np.bincount(buckets, weights=sample, minlength=n_buckets)
        # An empty bucket (all-equal residuals) decodes to its cutoff rather than 0/0.
        edges = np.concatenate([cutoffs[:1], cutoffs])
        weights = np.where(counts > 0, sums / np.maximum(counts, 1), edges).astype(np.float32)
        codec = cls(centroids, cutoffs, weights, nbits)
        held_out = np.sort(order[n_train:]) if n_train < n else np.arange(n)
        return codec, codes.astype(codec.code_dtype), held_out

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """Nearest centroid (by inner product) of each vector."""
        return _assign(self.centroids, vectors).astype(self.code_dtype)

    def compress(self, vectors: np.ndarray, codes: np.ndarray | None = None):
        """``(codes, packed residuals)`` of ``vectors`` under this codec (in steps of
        :data:`_STEP` tokens, so the temporaries stay small)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if codes is None:
            codes = self.assign(vectors)
        if len(vectors) > _STEP:
            parts = [self._compress(vectors[i : i + _STEP], codes[i : i + _STEP])[1]
                     for i in range(0, len(vectors), _STEP)]
            return codes, np.concatenate(parts)
        return self._compress(vectors, codes)

    def error(self, vectors: np.ndarray, codes: np.ndarray, packed: np.ndarray) -> np.ndarray:
        """Each vector's distance to its reconstruction, in steps of :data:`_STEP` tokens."""
        out = np.empty(len(vectors), np.float32)
        for i in range(0, len(vectors), _STEP):
            part = slice(i, i + _STEP)
            out[part] = np.linalg.norm(vectors[part] - self.decompress(codes[part], packed[part]), axis=1)
        return out

    def _compress(self, vectors: np.ndarray, codes: np.ndarray):
        residuals = vectors - self.centroids[codes]
        buckets = np.searchsorted(self.cutoffs, residuals, side="right").astype(np.uint8)
        per_byte = 8 // self.nbits
        pad = self.packed_dim * per_byte - self.dim
        if pad:
            buckets = np.pad(buckets, ((0, 0), (0, pad)))
        buckets = buckets.reshape(len(vectors), self.packed_dim, per_byte)
        packed = np.zeros((len(vectors), self.packed_dim), dtype=np.uint8)
        for j in range(per_byte):  # first value in the high bits
            packed |= buckets[:, :, j] << np.uint8(8 - self.nbits * (j + 1))
        return codes, packed

    def decompress(self, codes: np.ndarray, packed: np.ndarray) -> np.ndarray:
        """Unit-norm float32 reconstruction ``normalise(centroid + decoded residual)``."""
        if not len(packed):
            return np.empty((0, self.dim), np.float32)
        residuals = self._lut[packed].reshape(len(packed), -1)[:, : self.dim]
        return _normalise(self.centroids[codes] + residuals)

    @property
    def _lut(self) -> np.ndarray:
        # (256, 8 // nbits): every byte value decoded to its residual values at once.
        lut = self.__dict__.get("_lut_cache")
        if lut is None:
            per_byte = 8 // self.nbits
            byte = np.arange(256, dtype=np.uint8)[:, None]
            shifts = np.array([8 - self.nbits * (j + 1) for j in range(per_byte)], np.uint8)
            lut = self.weights[(byte >> shifts) & np.uint8((1 << self.nbits) - 1)]
            object.__setattr__(self, "_lut_cache", lut)
        return lut


def _assign(centroids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    nearest = np.empty(len(vectors), np.int64)
    for i in range(0, len(vectors), _STEP):
        _, best = index.search(np.ascontiguousarray(vectors[i : i + _STEP], dtype=np.float32), 1)
        nearest[i : i + len(best)] = best[:, 0]
    return nearest


# -- the index -----------------------------------------------------------------------------


class PlaidIndex:
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
        clustered data kept rising to 32 (BENCHMARKS.md).
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
        self._vectors: np.ndarray | None = None  # (tokens, dim) float16
        # PLAID payload.
        self._codec: ResidualCodec | None = None
        self._codes: np.ndarray | None = None  # (tokens,) centroid ids
        self._residuals: np.ndarray | None = None  # (tokens, packed_dim) uint8
        self._build_error = 0.0  # mean reconstruction error (L2) of the build's tokens
        self._added_error_sum = 0.0  # ... summed over tokens added since the build
        self._added_tokens = 0
        self._ivf: tuple[np.ndarray, np.ndarray] | None = None  # centroid -> doc positions

    def _reset_docs(self) -> None:
        self._ids = np.empty(0, dtype=np.int64)  # (docs,) one per stored document, dead too
        self._doclens = np.empty(0, dtype=np.int64)
        self._starts = np.empty(0, dtype=np.int64)  # first token of each document
        self._alive = np.empty(0, dtype=bool)
        self._pos: dict[int, int] = {}  # id -> document position, live documents only
        self._dead_tokens = 0

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
        return len(self._pos)

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

    def add(self, ids: np.ndarray, vectors: Sequence[np.ndarray]) -> None:
        """Add documents; an id already present is replaced (upsert).

        Parameters
        ----------
        ids : np.ndarray
            int64, one per document, unique within the call.
        vectors : sequence of np.ndarray
            One ``(n_tokens_i, dim)`` float array per document, rows L2-normalised.
            A document with no tokens is stored but never returned.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) != len(vectors):
            raise ValueError(f"got {len(ids)} ids for {len(vectors)} documents")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids passed to add() must be unique")
        if not len(ids):
            return
        docs = [np.asarray(v, dtype=np.float32) for v in vectors]
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
            self._build(np.concatenate([old_ids, ids]), old_docs + docs)
            return
        flat = (
            np.concatenate([d for d in docs if len(d)])
            if lens.sum()
            else np.empty((0, self._dim), np.float32)
        )

        base = len(self._codes) if self._codec is not None else self._payload_len()
        if self._codec is not None:
            codes, packed = self._codec.compress(flat)
            err = self._codec.error(flat, codes, packed)
            self._added_error_sum += float(err.sum())
            self._added_tokens += len(flat)
            self._codes = np.concatenate([self._codes, codes])
            self._residuals = np.concatenate([self._residuals, packed])
            self._ivf = None
        else:
            new = flat.astype(np.float16)
            self._vectors = new if self._vectors is None else np.concatenate([self._vectors, new])
        first = len(self._ids)
        self._ids = np.concatenate([self._ids, ids])
        self._doclens = np.concatenate([self._doclens, lens])
        self._starts = np.concatenate([self._starts, base + _segment_starts(lens)])
        self._alive = np.concatenate([self._alive, np.ones(len(ids), dtype=bool)])
        self._pos.update(zip(ids.tolist(), range(first, first + len(ids))))

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
        self._ivf = None
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
        if self._codec is None:
            scores = self._maxsim(live, queries, self._exact_vectors)
            return [_top_k(self._ids[live], s, k) for s in scores.T]
        return [self._plaid_search(q, k, nprobe or self.nprobe, ndocs) for q in queries]

    def _plaid_search(self, q: np.ndarray, k: int, nprobe: int, ndocs: int | None):
        codec = self._codec
        q_tok = len(q)
        centroid_scores = codec.centroids @ q.T  # (centroids, q_tokens)
        nprobe = min(nprobe, len(codec.centroids))
        probed = np.argpartition(-centroid_scores, nprobe - 1, axis=0)[:nprobe]  # (nprobe, q_tokens)
        probe_centroid = probed.reshape(-1)
        probe_qtok = np.tile(np.arange(q_tok), nprobe)
        probe_score = centroid_scores[probe_centroid, probe_qtok]

        # Stage 1, candidate generation: the documents in the probed centroids' lists. Each
        # gets, per query token, the best score among the probed centroids it appears in
        # (0 where none): a lower bound on centroid interaction that costs one pass over
        # the probed lists, a few thousand entries, however large the collection.
        ivf_offsets, ivf_docs = self._inverted_lists()
        starts = ivf_offsets[probe_centroid]
        lens = ivf_offsets[probe_centroid + 1] - starts
        docs = ivf_docs[_token_index(starts, lens)]
        entry_qtok = np.repeat(probe_qtok, lens)
        entry_score = np.repeat(probe_score, lens)
        alive = self._alive[docs]
        docs, entry_qtok, entry_score = docs[alive], entry_qtok[alive], entry_score[alive]
        if not len(docs):
            return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
        candidates, slot = np.unique(docs, return_inverse=True)
        best = np.zeros(len(candidates) * q_tok, dtype=np.float32)
        np.maximum.at(best, slot * q_tok + entry_qtok, entry_score)
        ndocs = ndocs or self.ndocs or max(512, 8 * k)
        candidates = _best(candidates, best.reshape(-1, q_tok).sum(axis=1), ndocs)

        # Stage 2, centroid interaction: MaxSim with every token of the candidates replaced
        # by its centroid (no decompression); a quarter survive, as in PLAID.
        lens = self._doclens[candidates]
        tokens = _token_index(self._starts[candidates], lens)
        approx_tok = centroid_scores[self._codes[tokens]]  # (tokens, q_tokens)
        approx = np.maximum.reduceat(approx_tok, _segment_starts(lens), axis=0).sum(axis=1)
        candidates = _best(candidates, approx, max(k, ndocs // 4))

        # Stage 3: exact MaxSim on decompressed tokens of the survivors.
        scores = self._maxsim(candidates, [q], self._decompressed)[:, 0]
        return _top_k(self._ids[candidates], scores, k)

    def _maxsim(
        self,
        docs: np.ndarray,
        queries: list[np.ndarray],
        fetch: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """Exact MaxSim of document positions ``docs`` for all queries: ``(docs, queries)``."""
        q_all = np.concatenate(queries)  # (sum of q_tokens, dim): one matmul serves all
        q_lens = np.array([len(q) for q in queries], dtype=np.int64)
        out = np.empty((len(docs), len(queries)), dtype=np.float32)
        lens = self._doclens[docs]
        ends = np.cumsum(lens)
        first = 0
        while first < len(docs):
            # Blocks of whole documents holding about _BLOCK_TOKENS tokens.
            base = ends[first - 1] if first else 0
            last = max(first + 1, int(np.searchsorted(ends, base + _BLOCK_TOKENS, "right")))
            block = slice(first, last)
            tokens = _token_index(self._starts[docs[block]], lens[block])
            sims = fetch(tokens) @ q_all.T  # (tokens, sum of q_tokens)
            per_doc = np.maximum.reduceat(sims, _segment_starts(lens[block]), axis=0)
            out[block] = np.add.reduceat(per_doc, _segment_starts(q_lens), axis=1)
            first = last
        return out

    def _exact_vectors(self, tokens: np.ndarray) -> np.ndarray:
        return self._vectors[tokens].astype(np.float32)

    def _decompressed(self, tokens: np.ndarray) -> np.ndarray:
        return self._codec.decompress(self._codes[tokens], self._residuals[tokens])

    # -- persistence ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the index atomically.

        ``path`` is a directory (the index goes to ``path/index.npz``) or a file name
        ending in ``.npz``.
        """
        file = _index_file(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        if self._dead_tokens:
            self._compact()
        arrays = {"ids": self._ids, "doclens": self._doclens}
        if self._codec is not None:
            arrays |= {
                "codes": self._codes,
                "residuals": self._residuals,
                "centroids": self._codec.centroids,
                "cutoffs": self._codec.cutoffs,
                "weights": self._codec.weights,
            }
        elif self._vectors is not None:
            arrays["vectors"] = self._vectors
        manifest = {
            "format": _FORMAT_VERSION,
            "kind": self.kind,
            "dim": self._dim,
            "n_docs": len(self._ids),
            "n_tokens": int(self._doclens.sum()),
            "shapes": {name: list(a.shape) for name, a in arrays.items()},
            "params": self._params(),
            "build_error": self._build_error,
            "added_error_sum": self._added_error_sum,
            "added_tokens": self._added_tokens,
        }
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
        with atomic_write(file) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PlaidIndex:
        """Read an index written by :meth:`save` (same ``path`` convention).

        Raises
        ------
        IndexCorruptError
            When the file is missing, truncated, altered or inconsistent.
        """
        file = _index_file(path)
        try:
            with np.load(file, allow_pickle=False) as npz:
                # Reading every member now makes zipfile check every CRC now.
                arrays = {name: npz[name] for name in npz.files}
            manifest = json.loads(arrays.pop("manifest").tobytes())
            if manifest.get("format") != _FORMAT_VERSION:
                raise _corrupt(file, f"format {manifest.get('format')}, expected {_FORMAT_VERSION}")
            shapes = {name: list(a.shape) for name, a in arrays.items()}
            if shapes != manifest["shapes"]:
                raise _corrupt(file, "array shapes do not match the manifest")
            self = cls(manifest["dim"], **manifest["params"])
            self._ids = arrays["ids"].astype(np.int64)
            self._doclens = arrays["doclens"].astype(np.int64)
            if int(self._doclens.sum()) != manifest["n_tokens"] or len(self._ids) != manifest["n_docs"]:
                raise _corrupt(file, "document table does not match the manifest")
            if manifest["kind"] == "plaid":
                self._codec = ResidualCodec(
                    arrays["centroids"], arrays["cutoffs"], arrays["weights"], self.nbits
                )
                self._codes = arrays["codes"]
                self._residuals = arrays["residuals"]
                payload = len(self._codes)
                if self._codes.size and int(self._codes.max()) >= len(self._codec.centroids):
                    raise _corrupt(file, "centroid id out of range")
            else:
                self._vectors = arrays.get("vectors")
                payload = 0 if self._vectors is None else len(self._vectors)
            if payload != manifest["n_tokens"]:
                raise _corrupt(file, "token payload does not match the manifest")
        except IndexCorruptError:
            raise
        except FileNotFoundError as exc:
            raise _corrupt(file, "file not found") from exc
        except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise _corrupt(file, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}") from exc
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(self._ids), dtype=bool)
        self._pos = {int(i): p for p, i in enumerate(self._ids.tolist())}
        self._build_error = float(manifest["build_error"])
        self._added_error_sum = float(manifest["added_error_sum"])
        self._added_tokens = int(manifest["added_tokens"])
        return self

    # -- internals -----------------------------------------------------------------------

    def _params(self) -> dict:
        return {
            "nbits": self.nbits,
            "mode": self.mode,
            "exact_threshold": self.exact_threshold,
            "n_centroids": self.n_centroids,
            "max_centroids": self.max_centroids,
            "nprobe": self.nprobe,
            "ndocs": self.ndocs,
            "kmeans_niter": self.kmeans_niter,
            "rebuild_ratio": self.rebuild_ratio,
            "seed": self.seed,
        }

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

    def _build(self, ids: np.ndarray, docs: list[np.ndarray]) -> None:
        """Train the codec on ``docs`` and store them compressed (replaces the contents)."""
        lens = np.array([len(d) for d in docs], dtype=np.int64)
        flat = np.concatenate([d for d in docs if len(d)], dtype=np.float32)
        codec, codes, held_out = ResidualCodec.train(
            flat,
            nbits=self.nbits,
            n_centroids=self._centroid_count(len(flat)),
            niter=self.kmeans_niter,
            seed=self.seed,
        )
        codes, packed = codec.compress(flat, codes)
        err = codec.error(flat, codes, packed)
        self._vectors = None
        self._codec, self._codes, self._residuals = codec, codes, packed
        self._build_error = float(err[held_out].mean())
        self._added_error_sum, self._added_tokens = 0.0, 0
        self._ivf = None
        self._ids = ids.astype(np.int64)
        self._doclens = lens
        self._starts = _segment_starts(lens)
        self._alive = np.ones(len(ids), dtype=bool)
        self._pos = {int(i): p for p, i in enumerate(self._ids.tolist())}
        self._dead_tokens = 0

    def _compact(self) -> None:
        """Drop the tokens of removed documents and renumber positions."""
        live = np.flatnonzero(self._alive)
        tokens = _token_index(self._starts[live], self._doclens[live])
        if self._codec is not None:
            self._codes = self._codes[tokens]
            self._residuals = self._residuals[tokens]
        elif self._vectors is not None:
            self._vectors = self._vectors[tokens]
        self._ids = self._ids[live]
        self._doclens = self._doclens[live]
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(live), dtype=bool)
        self._pos = {int(i): p for p, i in enumerate(self._ids.tolist())}
        self._dead_tokens = 0
        self._ivf = None

    def _inverted_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """Centroid -> positions of the documents with a token there, CSR, built lazily."""
        if self._ivf is None:
            n_docs = len(self._ids)
            doc_of_token = np.repeat(np.arange(n_docs, dtype=np.int64), self._doclens)
            pairs = np.unique(self._codes.astype(np.int64) * n_docs + doc_of_token)
            centroid, docs = np.divmod(pairs, n_docs)
            counts = np.bincount(centroid, minlength=len(self._codec.centroids))
            offsets = np.concatenate([[0], np.cumsum(counts)])
            self._ivf = (offsets, docs)
        return self._ivf


def _index_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path if path.suffix == ".npz" else path / _FILE_NAME
