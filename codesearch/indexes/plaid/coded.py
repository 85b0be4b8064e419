"""PLAID codes made away from the index: by the workers that encode the documents, under a
codec trained early on a sample of the run's texts, so the driver of a large first index
only writes them.

A worker compresses the token vectors as the store will hold them (rounded to float16), so
its codes are those the index would compute from the stored vectors: assignment is
deterministic given the centroids. Codes are used only under the codec that made them
(:attr:`ResidualCodec.fingerprint`); a document without them is compressed by the index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from codesearch.indexes.plaid.codec import DocCodes, ResidualCodec, compress_documents

__all__ = ["CodeBook", "Coded", "DocCodes", "compress_documents", "fit_on_sample", "held_out_error", "train_on_sample"]


@dataclass(frozen=True, eq=False)
class Coded:
    """Codes for the documents of one :meth:`PlaidIndex.add` call (None: none for that one).

    ``error`` is the codec's mean reconstruction error on tokens it was not trained on: the
    build error of an index built with it (:attr:`PlaidIndex.build_error`).
    """

    codec: ResidualCodec
    error: float
    docs: Sequence[DocCodes | None]


def train_on_sample(
    docs: Sequence[np.ndarray], *, nbits: int, n_centroids: int, niter: int = 4, seed: int = 0
) -> tuple[ResidualCodec, float]:
    """A codec trained on the token vectors of ``docs`` (a uniform sample of the texts), and
    its mean reconstruction error on a fifth of the documents, which k-means does not see:
    the baseline against which the index later judges drift (:attr:`PlaidIndex.needs_rebuild`).

    Whole documents are held out, not tokens: a document's tokens share its topics, so tokens
    held out of trained documents fit as well as the trained ones (an error of 0.11 where the
    collection's was 0.17, `benchmarks/plaid_bench.py --sample`), and the drift check would
    trust a sample that did not stand for the collection.
    """
    codec, held = fit_on_sample(docs, nbits=nbits, n_centroids=n_centroids, niter=niter, seed=seed)
    return codec, held_out_error(compress_documents(codec, docs), held)


def fit_on_sample(
    docs: Sequence[np.ndarray], *, nbits: int, n_centroids: int, niter: int = 4, seed: int = 0
) -> tuple[ResidualCodec, np.ndarray]:
    """The first half of :func:`train_on_sample`: the codec, and which of ``docs`` it was not
    trained on (a bool per document). A run's workers need only the codec, so they wait
    for this half alone; the sample's own codes, which give the held-out error
    (:func:`held_out_error`), are made while they encode.
    """
    whole = [i for i, d in enumerate(docs) if len(d)]
    order = np.random.default_rng(seed).permutation(len(whole))
    n_out = len(whole) // 5 if len(whole) >= 5 else 0
    train = order[n_out:]
    codec, _, _ = ResidualCodec.train(
        np.concatenate([_as_stored(docs[whole[i]]) for i in np.sort(train)]), nbits=nbits,
        n_centroids=n_centroids, niter=niter, seed=seed, codes=False,
    )
    held = np.zeros(len(docs), dtype=bool)
    held[[whole[i] for i in (order[:n_out] if n_out else train)]] = True
    return codec, held


def held_out_error(codes: Sequence[DocCodes], held: np.ndarray) -> float:
    """Mean reconstruction error per token of the documents ``held`` marks, from their codes."""
    picked = [d for d, h in zip(codes, held) if h]
    tokens = sum(len(d.codes) for d in picked)
    return float(sum(d.error for d in picked) / tokens) if tokens else 0.0


def _as_stored(doc: np.ndarray) -> np.ndarray:
    return np.asarray(doc, np.float32).astype(np.float16).astype(np.float32)


class CodeBook:
    """The codes a run's workers returned, by text hash, under one codec, until a publication
    puts them in the index (:meth:`drop`). Written by the run's writer thread, read by its
    publication thread.

    Parameters
    ----------
    codec : ResidualCodec, optional
        The codec, when known at the start (an index that is PLAID already); else
        :meth:`set_codec` gives it once trained.
    error : float
        Its held-out reconstruction error.
    """

    def __init__(self, codec: ResidualCodec | None = None, error: float = 0.0) -> None:
        self.codec, self.error = codec, float(error)
        self._docs: dict[str, DocCodes] = {}
        self._lock = threading.Lock()
        self.ready = threading.Event()
        if codec is not None:
            self.ready.set()
        # Called by the index registry after each add with (index, ids, hashes, vectors): the
        # user's vector cache keeps the codes the index computed (`codesearch.indexing.cachedcodes`).
        self.keep = None

    def set_codec(self, codec: ResidualCodec, error: float, *, ready: bool = True) -> None:
        """Take ``codec`` (and its held-out error); ``ready`` tells waiting publications."""
        self.codec, self.error = codec, float(error)
        if ready:
            self.ready.set()

    def __len__(self) -> int:
        return len(self._docs)

    def put(self, fingerprint: str | None, items: Iterable[tuple[str, DocCodes]]) -> int:
        """Keep codes made under the codec of ``fingerprint`` (others are ignored); returns how many."""
        codec = self.codec  # (one read: a failed training sets it back to None)
        if codec is None or fingerprint != codec.fingerprint:
            return 0
        items = list(items)
        with self._lock:
            self._docs.update(items)
        return len(items)

    def coded(self, hashes: Sequence[str | None]) -> Coded | None:
        """The codes of the documents of these text hashes, for one ``add`` (None without a codec)."""
        if self.codec is None:
            return None
        with self._lock:
            docs = [None if h is None else self._docs.get(h) for h in hashes]
        return Coded(self.codec, self.error, docs)

    def drop(self, hashes: Iterable[str]) -> None:
        """Forget codes the index now holds."""
        with self._lock:
            for h in hashes:
                self._docs.pop(h, None)
