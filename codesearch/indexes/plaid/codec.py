"""PLAID's residual codec: spherical k-means centroids, each token's centroid id, and its
residual quantised to 2 or 4 bits per dimension."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DocCodes", "ResidualCodec", "compress_documents"]

#: Tokens per step of the per-token passes (assign, compress, reconstruction error): their
#: float32 temporaries stay ~200 MB at 48 dims, not several copies of every token. A 60k-text
#: index (15M tokens) took 24 GB in one publication before.
_STEP = 1_000_000


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _normalise_in_place(x: np.ndarray) -> np.ndarray:
    """`_normalise` of a float32 array it may overwrite: no temporaries of its size (a
    query's re-ranking decompresses ~70k tokens: 2.5 ms against 6.3)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    x /= np.maximum(norms, 1e-12)[:, None]
    return x


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
    def fingerprint(self) -> str:
        """A digest of the arrays: codes made elsewhere are used only under the codec that made them."""
        fp = self.__dict__.get("_fingerprint")
        if fp is None:
            import hashlib

            h = hashlib.blake2b(digest_size=16)
            for a in (self.centroids, self.cutoffs, self.weights):
                h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
            fp = f"{self.nbits}:{h.hexdigest()}"
            object.__setattr__(self, "_fingerprint", fp)
        return fp

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
        codes: bool = True,
    ) -> tuple[ResidualCodec, np.ndarray | None, np.ndarray]:
        """Fit centroids and buckets on ``vectors``.

        ``codes=False`` when the caller does not want every vector's code (a codec for the
        run's workers, `codesearch.indexes.plaid.coded.fit_on_sample`): the buckets are then
        fitted on the residuals of a uniform sample of whole vectors, which alone are
        assigned. Assigning every vector cost as much as k-means itself (1.26M tokens
        against 4 passes over 524k at 2^14 centroids), and the run's workers wait for it.

        Returns
        -------
        codec : ResidualCodec
        codes : np.ndarray or None
            Nearest centroid of every vector (None with ``codes=False``).
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
        dim = vectors.shape[1]
        if not codes:
            # quantiles of a few million residual values are plenty: whole rows, so that
            # only they are assigned (drawn apart from k-means's points, which `order` put first:
            # reusing it made 39% of them training points, whose residuals are smaller)
            rows = np.sort(np.random.default_rng(seed + 1).permutation(n)[: max(1, 4_000_000 // dim)])
            part = vectors[rows]
            sample = (part - centroids[_assign(centroids, part)]).reshape(-1)
            assigned = None
        elif n * dim > 4_000_000:  # quantiles of a few million residual values are plenty
            assigned = _assign(centroids, vectors)
            at = np.random.default_rng(seed).integers(0, n * dim, 4_000_000)
            rows, cols = np.divmod(at, dim)
            sample = vectors[rows, cols] - centroids[assigned[rows], cols]
        else:
            assigned = _assign(centroids, vectors)
            sample = (vectors - centroids[assigned]).reshape(-1)
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
        return codec, None if assigned is None else assigned.astype(codec.code_dtype), held_out

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

    def compress_documents(self, arrays: Sequence[np.ndarray]) -> list[DocCodes]:
        """Each document's `DocCodes` under this codec: what a worker that encodes documents
        returns with their vectors (`codesearch.indexes.plaid.coded`)."""
        return compress_documents(self, arrays)

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
        # np.take, not fancy indexing: 5.9 ms against 18 ms for 70k tokens' bytes (a
        # query's re-ranking), and the whole decompression 12 ms against 38.
        residuals = np.take(self._lut, packed, axis=0).reshape(len(packed), -1)[:, : self.dim]
        out = np.take(self.centroids, codes, axis=0)
        out += residuals
        return _normalise_in_place(out)

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


#: Fewest query rows per faiss search: below faiss's BLAS threshold (20) it sums the inner
#: products in another order, so a token near a tie between two centroids could get another
#: code in a small batch (a worker's) than in a large one (the driver's). Padded, every
#: search takes the same path, and a token's code does not depend on its batch.
_MIN_ROWS = 32


def _assign(centroids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    nearest = np.empty(len(vectors), np.int64)
    for i in range(0, len(vectors), _STEP):
        part = np.ascontiguousarray(vectors[i : i + _STEP], dtype=np.float32)
        n = len(part)
        if n < _MIN_ROWS:
            part = np.concatenate([part, np.zeros((_MIN_ROWS - n, part.shape[1]), np.float32)])
        _, best = index.search(part, 1)
        nearest[i : i + n] = best[:n, 0]
    return nearest


# -- the index -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DocCodes:
    """One document's codes: centroid ids, packed residuals, and the sum of its tokens'
    reconstruction errors (what the index's drift check adds up)."""

    codes: np.ndarray
    packed: np.ndarray
    error: float


def compress_documents(codec: ResidualCodec, arrays: Sequence[np.ndarray]) -> list[DocCodes]:
    """Each document's codes under ``codec``, from its vectors rounded to float16 (as stored)."""
    lens = [len(a) for a in arrays]
    if not sum(lens):
        empty = np.empty((0, codec.packed_dim), np.uint8)
        return [DocCodes(np.empty(0, codec.code_dtype), empty, 0.0) for _ in arrays]
    flat = np.concatenate([np.asarray(a, np.float32).reshape(len(a), -1) for a in arrays if len(a)])
    flat = flat.astype(np.float16).astype(np.float32)
    codes, packed = codec.compress(flat)
    err = codec.error(flat, codes, packed)
    out, at = [], 0
    for n in lens:
        out.append(DocCodes(codes[at : at + n], packed[at : at + n], float(err[at : at + n].sum(dtype=np.float64))))
        at += n
    return out
