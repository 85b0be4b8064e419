"""Single-vector index: FAISS inner-product search over store ids, with deletes.

One vector per chunk (or per file), keyed by the store's int64 id. Small collections are
searched exactly (``IndexIDMap2(IndexFlatIP)``); past ``exact_threshold`` vectors the index
switches itself to IVF-Flat, and back to exact when deletes shrink it below half the
threshold.

Why IVF-Flat and not HNSW: the pipeline deletes vectors on every run that edits a file.
FAISS's HNSW cannot ``remove_ids``, so it would need a tombstone set, filtered search
(over-fetching to make up for dead hits) and periodic rebuilds. IVF-Flat with a hashtable
direct map removes ids in place, reconstructs any vector by id (so it can be retrained from
itself, no second copy), and keeps full-precision vectors, so its only error is the
probing. Recall is set by ``nprobe`` and measured against exact search in
``tests/indexer/test_dense.py`` and ``benchmarks/dense_bench.py``.

On disk one file holds everything: a magic line, a JSON header (format version, dim,
kind, parameters, CRC-32 of the payload) and the ``faiss.serialize_index`` bytes. It is
written to a temp name and ``os.replace``d, so a reader sees the old index or the new
one, never half of one; no pickle anywhere.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import zlib
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.store import atomic_write

__all__ = ["EXACT_THRESHOLD", "DenseIndex"]

#: Vector count past which the index switches from exact search to IVF-Flat. Exact
#: search over 50k x 768 float32 is ~40M multiply-adds per query (a few ms on 2 cores).
EXACT_THRESHOLD = 50_000

_MAGIC = b"CSDENSE\n"
_FORMAT_VERSION = 1
_EMPTY_IDS = np.empty(0, dtype=np.int64)
_EMPTY_SCORES = np.empty(0, dtype=np.float32)
#: Searches of at most this many queries run on one OpenMP thread. A single query over a
#: flat index is a few hundred microseconds of work; with 2 threads on a busy machine every
#: call waits at an OpenMP barrier for a descheduled thread (p90 5.0 ms against 0.66 ms
#: single-threaded, 10k x 384 vectors, loaded 2-core machine; BENCHMARKS.md).
SMALL_SEARCH_QUERIES = 8

_omp_lock = threading.Lock()
_omp_users = 0
_omp_saved = 1


@contextlib.contextmanager
def _single_omp_thread():
    """FAISS on one OpenMP thread for the body; the setting is process-wide, so overlapping
    users are counted and the last one out restores the previous count."""
    import faiss

    global _omp_users, _omp_saved
    with _omp_lock:
        if _omp_users == 0:
            _omp_saved = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(1)
        _omp_users += 1
    try:
        yield
    finally:
        with _omp_lock:
            _omp_users -= 1
            if _omp_users == 0:
                faiss.omp_set_num_threads(_omp_saved)


def _corrupt(path: Path, why: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"Dense index file '{path}' cannot be read ({why}); "
        "run 'codesearch index --rebuild' to recreate it"
    )


class DenseIndex:
    """FAISS inner-product index over int64 ids, exact when small, IVF-Flat when large.

    Parameters
    ----------
    dim : int
        Vector size. Vectors are expected L2-normalised, so scores are cosine similarities.
    exact_threshold : int
        Above this many vectors the index trains IVF-Flat and searches approximately;
        below ``exact_threshold // 2`` it goes back to exact search (the gap avoids
        flapping when a run deletes and re-adds around the threshold).
    nlist : int or None
        IVF cell count; ``None`` picks ``4 * sqrt(n)`` (FAISS's usual guideline), at
        least 16.
    nprobe : int or None
        Cells visited per query; ``None`` picks ``max(16, nlist // 8)``, which gave
        recall@10 >= 0.95 against exact search on clustered data (see BENCHMARKS.md).
    seed : int
        Seed of the k-means that trains the IVF cells, so builds are reproducible.

    Examples
    --------
    >>> import numpy as np
    >>> index = DenseIndex(4)
    >>> v = np.eye(4, dtype=np.float32)
    >>> index.add(np.array([10, 11, 12, 13]), v)
    >>> ids, scores = index.search(v[:1], k=2)[0]
    >>> int(ids[0]), float(scores[0])
    (10, 1.0)
    """

    def __init__(
        self,
        dim: int,
        *,
        exact_threshold: int = EXACT_THRESHOLD,
        nlist: int | None = None,
        nprobe: int | None = None,
        seed: int = 0,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self._dim = int(dim)
        self.exact_threshold = int(exact_threshold)
        self.nlist = nlist
        self.nprobe = nprobe
        self.seed = int(seed)
        self._index = self._new_exact()
        # Vector count the IVF cells were trained on; retrain when the index outgrows it 4x.
        self._trained_on = 0

    # -- properties ----------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Vector size."""
        return self._dim

    @property
    def kind(self) -> str:
        """``"exact"`` (flat inner product) or ``"ivf"`` (IVF-Flat, approximate)."""
        return "ivf" if self._is_ivf else "exact"

    #: A FAISS index never goes stale: adds and removes keep it exact (`Index.needs_rebuild`).
    needs_rebuild = False

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def ids(self) -> np.ndarray:
        """All ids in the index (int64, no particular order)."""
        import faiss

        if not self._is_ivf:
            return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
        invlists = self._index.invlists
        parts = []
        for cell in range(invlists.nlist):
            size = invlists.list_size(cell)
            if size:
                ptr = invlists.get_ids(cell)
                parts.append(faiss.rev_swig_ptr(ptr, size).copy())
                invlists.release_ids(cell, ptr)
        return np.concatenate(parts).astype(np.int64) if parts else _EMPTY_IDS.copy()

    # -- mutation ------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under ``ids``; an id already present is replaced (upsert).

        Parameters
        ----------
        ids : np.ndarray
            int64 ids, unique within the call.
        vectors : np.ndarray
            float32 ``(len(ids), dim)``, L2-normalised.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self._dim:
            raise ValueError(f"vectors must have shape (n, {self._dim}), got {vectors.shape}")
        if len(ids) != len(vectors):
            raise ValueError(f"got {len(ids)} ids for {len(vectors)} vectors")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids passed to add() must be unique")
        if not len(ids):
            return
        # Upsert: FAISS would happily keep two vectors under one id.
        self._index.remove_ids(ids)
        total = len(self) + len(ids)
        if not self._is_ivf and total > self.exact_threshold:
            self._retrain(extra=(ids, vectors))
        elif self._is_ivf and total > 4 * self._trained_on:
            # The cells were sized for a quarter of the data; lists grow long and probing
            # slows down, so re-cluster at the new size.
            self._retrain(extra=(ids, vectors))
        else:
            self._index.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> None:
        """Remove ``ids``; ids that are not in the index are ignored."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if not len(ids) or not len(self):
            return
        self._index.remove_ids(ids)
        if self._is_ivf and len(self) < self.exact_threshold // 2:
            all_ids, vectors = self._all_vectors()
            self._index = self._new_exact()
            self._trained_on = 0
            if len(all_ids):
                self._index.add_with_ids(vectors, all_ids)

    # -- search --------------------------------------------------------------------------

    def search(self, queries: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` ids and inner-product scores for each query row, best first.

        Returns one ``(ids int64, scores float32)`` pair per query; a pair holds fewer than
        ``k`` entries when the index has fewer vectors (empty for an empty index).
        """
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.shape[1] != self._dim:
            raise ValueError(f"queries must have shape (q, {self._dim}), got {queries.shape}")
        if not len(self):
            return [(_EMPTY_IDS.copy(), _EMPTY_SCORES.copy()) for _ in range(len(queries))]
        k_eff = min(k, len(self))
        if self._is_ivf:
            self._index.nprobe = self._nprobe()
        small = len(queries) <= SMALL_SEARCH_QUERIES
        with _single_omp_thread() if small else contextlib.nullcontext():
            scores, ids = self._index.search(queries, k_eff)
        out = []
        for row_ids, row_scores in zip(ids, scores):
            keep = row_ids >= 0  # IVF returns -1 when the probed cells hold fewer than k
            out.append((row_ids[keep].astype(np.int64), row_scores[keep].astype(np.float32)))
        return out

    # -- persistence ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to ``path`` atomically (temp file + ``os.replace``)."""
        import faiss

        path = Path(path)
        payload = faiss.serialize_index(self._index).tobytes()
        header = {
            "format": _FORMAT_VERSION,
            "dim": self._dim,
            "kind": self.kind,
            "count": len(self),
            "exact_threshold": self.exact_threshold,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "seed": self.seed,
            "trained_on": self._trained_on,
            "payload_bytes": len(payload),
            "crc32": zlib.crc32(payload),
        }
        head = json.dumps(header, sort_keys=True).encode()
        with atomic_write(path) as f:
            f.write(_MAGIC)
            f.write(len(head).to_bytes(4, "little"))
            f.write(head)
            f.write(payload)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DenseIndex:
        """Read an index written by :meth:`save`.

        Raises
        ------
        IndexCorruptError
            When the file is missing, truncated, altered or not a dense index.
        """
        import faiss

        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _corrupt(path, exc.strerror or type(exc).__name__) from exc
        if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
            raise _corrupt(path, "not a codesearch dense index")
        start = len(_MAGIC) + 4
        head_len = int.from_bytes(data[len(_MAGIC) : start], "little")
        try:
            header = json.loads(data[start : start + head_len])
            payload = memoryview(data)[start + head_len :]
            dim = int(header["dim"])
            if header["format"] != _FORMAT_VERSION:
                raise _corrupt(path, f"format {header['format']}, expected {_FORMAT_VERSION}")
            if len(payload) != header["payload_bytes"]:
                raise _corrupt(path, "truncated")
            if zlib.crc32(payload) != header["crc32"]:
                raise _corrupt(path, "checksum mismatch")
            index = faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
            # (the header is outside the CRC: a damaged one is said here, not a traceback)
            self = cls(
                dim,
                exact_threshold=header["exact_threshold"],
                nlist=header["nlist"],
                nprobe=header["nprobe"],
                seed=header["seed"],
            )
            self._trained_on = int(header["trained_on"])
            count = header["count"]
        except IndexCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError, RuntimeError) as exc:
            raise _corrupt(path, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}") from exc
        self._index = index
        if index.d != dim or index.ntotal != count:
            raise _corrupt(path, "header does not match the stored index")
        return self

    # -- internals -----------------------------------------------------------------------

    @property
    def _is_ivf(self) -> bool:
        import faiss

        return isinstance(self._index, faiss.IndexIVF)

    def _new_exact(self):
        import faiss

        return faiss.IndexIDMap2(faiss.IndexFlatIP(self._dim))

    def _nprobe(self) -> int:
        nlist = self._index.nlist
        return min(nlist, self.nprobe or max(16, nlist // 8))

    def _all_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (id, vector) in the index, read back from FAISS (no second copy is kept)."""
        import faiss

        if not len(self):
            return _EMPTY_IDS.copy(), np.empty((0, self._dim), dtype=np.float32)
        if not self._is_ivf:
            ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
            # The inner flat index reconstructs by position, in id_map order.
            return ids, self._index.index.reconstruct_n(0, len(ids))
        ids = self.ids()
        return ids, self._index.reconstruct_batch(ids)

    def _retrain(self, extra: tuple[np.ndarray, np.ndarray]) -> None:
        """Re-cluster everything (current vectors plus ``extra``) into a fresh IVF-Flat."""
        import faiss

        old_ids, old_vectors = self._all_vectors()
        ids = np.concatenate([old_ids, extra[0]])
        vectors = np.concatenate([old_vectors, extra[1]])
        n = len(ids)
        nlist = self.nlist or max(16, int(4 * math.sqrt(n)))
        nlist = min(nlist, max(1, n // 39))  # FAISS wants >= 39 training points per cell
        quantizer = faiss.IndexFlatIP(self._dim)
        index = faiss.IndexIVFFlat(quantizer, self._dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = self.seed
        # Cap the k-means sample: 64 points per cell is plenty for cell boundaries and keeps
        # training at a few seconds for 1M vectors.
        index.cp.max_points_per_centroid = 64
        index.cp.niter = 10  # cell boundaries settle early; FAISS's 25 triples training time
        index.train(vectors)
        # A hashtable direct map lets remove_ids and reconstruct work by id.
        index.set_direct_map_type(faiss.DirectMap.Hashtable)
        index.add_with_ids(vectors, ids)
        quantizer.this.disown()  # the IVF index now owns (and frees) its quantizer
        index.own_fields = True
        self._index = index
        self._trained_on = n
