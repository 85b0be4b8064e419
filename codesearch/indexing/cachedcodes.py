"""PLAID codes in the user's vector cache (issue 27): a new copy of a repository takes the
codec and the codes another copy made, instead of k-means and the assignment of every token.

A second worktree found every ColBERT vector in the cache (`codesearch.indexing.reuse`), yet
its PLAID build trained k-means and assigned each of its ~2M tokens to a centroid: 35-65 s
on 2 cores, against ~2 s for everything else. Codes are a function of the vectors and the
codec, so they can be kept as the vectors are:

- **Keep.** Whenever an index compresses texts (a first index that trains its codec, a Ray
  run whose workers coded them, a rebuild after drift), the codec (centroids and residual
  buckets, keyed by its fingerprint, with its build error) and each text's codes under it go
  to the cache, keyed by (model, codec, text hash).
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
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from codesearch.indexing.reuse import _CACHE_ERRORS
from codesearch.store.cache import UserCache

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid import PlaidIndex
    from codesearch.indexes.plaid.codec import DocCodes, ResidualCodec
    from codesearch.indexes.plaid.coded import CodeBook

__all__ = ["ADOPT_SHARE", "CodeKeeper", "adopt_codes", "pack_codes", "unpack_codes"]

log = logging.getLogger(__name__)

#: Share of an index's tokens a cached codec must have coded for a new index to adopt it:
#: then it was trained on this content (another copy of the repository), and the few texts it
#: did not see are a branch's edits. A rule, not a tuned weight: a codec from another
#: repository codes none of these texts, and one from an older commit of this one most.
ADOPT_SHARE = 0.9


def pack_codes(doc: DocCodes) -> bytes:
    """A document's centroid ids then its packed residuals, as the cache keeps them."""
    return np.ascontiguousarray(doc.codes).tobytes() + np.ascontiguousarray(doc.packed, np.uint8).tobytes()


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


def adopt_codes(
    cache: UserCache, model: str, tokens: dict[str, int], *, codec: tuple[ResidualCodec, float] | None = None,
    nbits: int = 4, dim: int | None = None,
) -> tuple[ResidualCodec, float, dict[str, DocCodes]] | None:
    """The codec for an index of the texts ``tokens`` (text hash -> tokens) and the cached
    codes of its texts under it.

    ``codec``: the index's own (and its build error), when it is PLAID already: only its codes
    are taken. Otherwise the cached codec (of ``nbits``, ``dim``) that coded the most tokens,
    when that is at least :data:`ADOPT_SHARE` of them; else None (the index trains its own).
    Errors of the cache propagate (the caller stops using it).
    """
    keys = list(tokens)
    if not keys:
        return None
    if codec is None:
        total = sum(tokens.values())
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
        if doc is not None and (tokens[key] <= 0 or n == tokens[key]):
            docs[key] = doc
    return codec[0], codec[1], docs


class CodeKeeper:
    """Puts the codes a PLAID index computed into the user's cache (`CodeBook.keep`).

    Called by the index registry after each add of a PLAID index with the ids it added,
    their text hashes and vectors; keeps the codec and the codes of the texts whose codes
    did not come from the cache. Opens the cache for each call (a publication may run on
    a thread of its own) and never fails the run.

    Parameters
    ----------
    model
        The cache's model key (`cache_model`).
    cached
        Text hashes whose codes the run took from the cache (not kept again).
    """

    def __init__(self, model: str, cached: set[str] | None = None) -> None:
        self.model = model
        self.cached = set(cached or ())
        self.kept = 0  # texts whose codes went to the cache in this run

    def __call__(self, index: PlaidIndex, ids: np.ndarray, hashes: dict[int, str],
                 vectors: Sequence[np.ndarray]) -> None:
        codec = index.codec
        if codec is None:
            return
        fp = codec.fingerprint
        picked = [(hashes[int(i)], np.asarray(v, np.float32)) for i, v in zip(ids.tolist(), vectors)
                  if hashes.get(int(i)) is not None and hashes[int(i)] not in self.cached and len(v)]
        if not picked:
            return
        try:
            cache = UserCache.open()
            if cache is None:
                return
            try:
                cache.put_codec(self.model, fp, codec.nbits, (codec.centroids, codec.cutoffs, codec.weights),
                                index.build_error)
                items = []
                by_id = dict(zip((h for h, _ in picked), range(len(picked))))
                found = index.doc_codes([i for i in ids.tolist() if hashes.get(int(i)) in by_id])
                for doc_id, (codes, packed) in found.items():
                    h = hashes[doc_id]
                    flat = picked[by_id[h]][1]
                    error = float(codec.error(flat, codes, packed).sum(dtype=np.float64))
                    items.append((h, len(codes), error, pack_codes(_Doc(codes, packed))))
                self.kept += cache.put_codes(self.model, fp, items)
                self.cached.update(h for h, *_ in items)
            finally:
                cache.close()
        except _CACHE_ERRORS as exc:
            log.warning("PLAID codes not kept in the vector cache (%s)", exc)


class _Doc:
    __slots__ = ("codes", "packed")

    def __init__(self, codes: np.ndarray, packed: np.ndarray) -> None:
        self.codes, self.packed = codes, packed


def book_for(codec: ResidualCodec | None, error: float, docs: dict[str, DocCodes], keep: CodeKeeper) -> CodeBook:
    """A `CodeBook` holding ``docs`` under ``codec`` (None: the index trains its own), whose
    index keeps what it computes through ``keep``."""
    from codesearch.indexes.plaid.coded import CodeBook

    book = CodeBook(codec, error) if codec is not None else CodeBook()
    if codec is not None and docs:
        book.put(codec.fingerprint, docs.items())
    book.keep = keep
    return book
