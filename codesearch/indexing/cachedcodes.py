"""PLAID codes in the user's vector cache: a new copy of a repository takes the
codec and the codes another copy made, instead of k-means and the assignment of every token.

A second worktree found every ColBERT vector in the cache (`codesearch.indexing.reuse`), yet
its PLAID build trained k-means and assigned each of its ~2M tokens to a centroid: 35-65 s
on 2 cores, against ~2 s for everything else. Codes are a function of the vectors and the
codec, so they can be kept as the vectors are:

- **Keep.** Whenever an index compresses texts (a first index that trains its codec, a Ray
  run whose workers coded them, a rebuild after drift), the codec (centroids and residual
  buckets, keyed by its fingerprint, with its build error) and each text's codes under it go
  to the cache, keyed by (model, codec, hash of the float16 array coded). Not by the text:
  codes are a function of the array and the codec alone, and an index store keys a chunk's
  vector by its code without the header, which the encoder also read.
- **Adopt.** A run whose index has no PLAID codec yet looks up which cached codec coded its
  texts. One that coded at least :data:`ADOPT_SHARE` of their tokens was trained on this
  repository's own content in another copy: the index takes it, with the codes, and
  compresses only the rest with it. Below that share the index trains as before (a codec fit
  to other content would serve the texts it never saw worse, and the drift check would
  soon retrain anyway). An index that is PLAID already takes the cached codes made under its
  own codec (a branch switched back).

Codes made under a codec are the ones the index would compute from the stored vectors:
assignment and quantisation are deterministic given the codec (`codesearch.indexes.plaid.coded`).
Nothing depends on the cache: an entry that is missing or damaged is compressed here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from codesearch.indexing.reuse import _CACHE_ERRORS, Reuse
from codesearch.store.cache import UserCache
from codesearch.store.files import hash_bytes
from codesearch.store.vectors import encode_array

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid import PlaidIndex
    from codesearch.indexes.plaid.codec import DocCodes, ResidualCodec
    from codesearch.indexes.plaid.coded import CodeBook

__all__ = ["ADOPT_SHARE", "FLUSH_BYTES", "CodeKeeper", "adopt_codes", "array_key", "book_for", "pack_codes",
           "unpack_codes"]

log = logging.getLogger(__name__)

#: Codes a `CodeKeeper` gathers before it writes them to the cache (on the writer's thread).
FLUSH_BYTES = 64 << 20

#: Share of an index's tokens a cached codec must have coded for a new index to adopt it:
#: then it was trained on this content (another copy of the repository), and the few texts it
#: did not see are a branch's edits. A rule, not a tuned weight: a codec from another
#: repository codes none of these texts, and one from an older commit of this one most.
ADOPT_SHARE = 0.9


def pack_codes(codes: np.ndarray, packed: np.ndarray) -> bytes:
    """A document's centroid ids then its packed residuals, as the cache keeps them."""
    return np.ascontiguousarray(codes).tobytes() + np.ascontiguousarray(packed, np.uint8).tobytes()


def unpack_codes(codec: ResidualCodec, n: int, error: float, data: bytes) -> DocCodes | None:
    """`pack_codes` read back under ``codec``; None when the bytes do not fit it (a miss)."""
    from codesearch.indexes.plaid.codec import DocCodes

    dtype = codec.code_dtype
    if n < 0 or len(data) != n * (dtype.itemsize + codec.packed_dim):
        return None
    codes = np.frombuffer(data, dtype, count=n)
    if n and int(codes.max()) >= len(codec.centroids):
        return None
    packed = np.frombuffer(data, np.uint8, offset=n * dtype.itemsize).reshape(n, codec.packed_dim)
    return DocCodes(codes, packed, float(error))


def _codec_of(found: tuple) -> tuple[ResidualCodec, float]:
    from codesearch.indexes.plaid.codec import ResidualCodec

    nbits, centroids, cutoffs, weights, error = found
    return ResidualCodec(centroids, cutoffs, weights, nbits), error


def array_key(array: np.ndarray) -> str:
    """The cache key of an array's codes: the hash of its float16 bytes as stored."""
    return hash_bytes(encode_array(array)[2])


def adopt_codes(
    cache: UserCache, model: str, arrays: dict[str, int], total: int, *,
    codec: tuple[ResidualCodec, float] | None = None, nbits: int = 4, dim: int | None = None,
) -> tuple[ResidualCodec, float, dict[str, DocCodes]] | None:
    """The codec for an index of ``total`` tokens, and the cached codes under it of the
    ``arrays`` (`array_key` -> tokens) the run took from the cache.

    ``codec``: the index's own (and its build error), when it is PLAID already: only its codes
    are taken. Otherwise the cached codec (of ``nbits``, ``dim``) that coded the most of
    them, when that is at least :data:`ADOPT_SHARE` of ``total``; else None (the index
    trains its own). Errors of the cache propagate (the caller stops using it).
    """
    keys = list(arrays)
    if not keys:
        return None
    if codec is None:
        coverage = cache.code_coverage(model, keys)
        for fingerprint, (_, covered) in sorted(coverage.items(), key=lambda kv: -kv[1][1]):
            if covered < ADOPT_SHARE * total:
                break
            found = cache.get_codec(model, fingerprint)
            if found is None:
                continue
            candidate = _codec_of(found)
            if candidate[0].nbits != nbits or (dim is not None and candidate[0].dim != dim):
                continue
            if candidate[0].fingerprint != fingerprint:  # bytes that pass the CRC but are not that codec
                continue
            codec = candidate
            break
        if codec is None:
            return None
    docs: dict[str, DocCodes] = {}
    for key, (n, error, data) in cache.get_codes(model, codec[0].fingerprint, keys).items():
        doc = unpack_codes(codec[0], n, error, data)
        if doc is not None and n == arrays[key]:
            docs[key] = doc
    return codec[0], codec[1], docs


class CodeKeeper:
    """Gathers the codes a PLAID index computed for the user's cache (`CodeBook.keep`).

    The index registry calls it after each add of a PLAID index with the ids it added,
    their text hashes and vectors; it keeps the codec and the codes of the texts whose codes
    did not come from the cache. A publication may run on a thread of its own, so the codes
    wait here until the run's writer thread calls :meth:`flush`, which writes them through
    the run's one connection to the cache (a second connection to the same file in one
    process is unsafe: opening it reads the file's header, and closing that read drops
    every POSIX lock the process holds on the file, the first connection's included).

    Parameters
    ----------
    model
        The cache's model key (`cache_model`).
    reuse
        The run's cache.
    cached
        `array_key` of the arrays whose codes the run took from the cache (not kept again).
    """

    def __init__(self, model: str, reuse: Reuse, cached: set[str] | None = None) -> None:
        self.model, self.reuse = model, reuse
        self.cached = set(cached or ())
        self.taken: set[str] = set()  # the store's text hashes of those codes
        self.kept = 0  # texts whose codes went to the cache in this run
        self._lock = threading.Lock()
        self._pending: list[tuple[tuple, list[tuple[str, int, float, bytes]]]] = []
        self._pending_bytes = 0
        self._writer = threading.get_ident()  # made on the run's writer thread, which alone writes the cache

    def __call__(self, index: PlaidIndex, ids: np.ndarray, hashes: dict[int, str],
                 vectors: Sequence[np.ndarray]) -> None:
        codec = index.codec
        if codec is None or not self.reuse.enabled:
            return
        # (texts whose codes came from the cache are not hashed again: a second copy's whole index)
        keys = {int(i): array_key(v) for i, v in zip(ids.tolist(), vectors)
                if len(v) and hashes.get(int(i)) not in self.taken}
        with self._lock:
            fresh = {int(i): np.asarray(v, np.float32) for i, v in zip(ids.tolist(), vectors)
                     if int(i) in keys and keys[int(i)] not in self.cached}
        if not fresh:
            return
        items = []
        for doc_id, (codes, packed) in index.doc_codes(list(fresh)).items():
            error = float(codec.error(fresh[doc_id], codes, packed).sum(dtype=np.float64))
            items.append((keys[doc_id], len(codes), error, pack_codes(codes, packed)))
        head = (codec.fingerprint, codec.nbits, (codec.centroids, codec.cutoffs, codec.weights), index.build_error)
        with self._lock:
            self.cached.update(h for h, *_ in items)
            self._pending.append((head, items))
            self._pending_bytes += sum(len(item[3]) for item in items)
            full = self._pending_bytes > FLUSH_BYTES
        if full and threading.get_ident() == self._writer:
            # Not held until the publication ends: a first index of 600k chunks coded 20M
            # tokens in one (520 MB of codes). Off the writer's thread, its next poll flushes.
            self.flush()

    @property
    def pending_bytes(self) -> int:
        """Bytes of codes gathered and not yet written to the cache."""
        return self._pending_bytes

    def wants(self, hashes: Sequence[str | None]) -> list[bool]:
        """Which texts (by the store's hash) this keeper reads the vectors of when called:
        those whose codes did not come from the cache (it hashes and measures them)."""
        return [h not in self.taken for h in hashes]

    def flush(self) -> None:
        """Write what was gathered (on the run's writer thread); never fails the run."""
        with self._lock:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
        cache = self.reuse.cache
        if cache is None:
            return
        try:
            for (fp, nbits, arrays, error), items in pending:
                cache.put_codec(self.model, fp, nbits, arrays, error)
                self.kept += cache.put_codes(self.model, fp, items)
        except _CACHE_ERRORS as exc:
            self.reuse._give_up(exc)


def book_for(codec: ResidualCodec | None, error: float, docs: dict[str, DocCodes], keep: CodeKeeper) -> CodeBook:
    """A `CodeBook` holding ``docs`` (by the store's text hash) under ``codec`` (None: the
    index trains its own), whose index keeps what it computes through ``keep``."""
    from codesearch.indexes.plaid.coded import CodeBook

    book = CodeBook(codec, error) if codec is not None else CodeBook()
    if codec is not None and docs:
        book.put(codec.fingerprint, docs.items())
    book.keep = keep
    return book
