"""The PLAID search path of a `PlaidIndex` past its exact threshold (a base class of it)."""

from __future__ import annotations

import numpy as np

from codesearch.indexes.plaid.codec import ResidualCodec
from codesearch.indexes.plaid.maxsim import (
    _EMPTY_IDS,
    _EMPTY_SCORES,
    _best,
    _segment_starts,
    _token_index,
    _top_k,
    exact_maxsim,
)

__all__ = ["PlaidSearch"]


class PlaidSearch:
    """PLAID's three search stages over the compressed tokens; `PlaidIndex` fills the
    arrays below."""

    ndocs: int | None
    _codec: ResidualCodec | None
    _codes: np.ndarray | None  # (tokens,) centroid ids
    _residuals: np.ndarray | None  # (tokens, packed_dim) uint8
    _ids: np.ndarray
    _doclens: np.ndarray
    _starts: np.ndarray
    _alive: np.ndarray
    _ivf: tuple[np.ndarray, np.ndarray] | None

    def _plaid_search(self, q: np.ndarray, k: int, nprobe: int, ndocs: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of one query by PLAID's three stages (candidates from probed centroids,
        centroid interaction, exact MaxSim of the survivors)."""
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
        scores = exact_maxsim(self._starts, self._doclens, candidates, [q], self._decompressed)[:, 0]
        return _top_k(self._ids[candidates], scores, k)


    def _inverted_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """Centroid -> positions of the documents with a token there, CSR, built on first use
        (kept until the documents change)."""
        if self._ivf is None:
            n_docs = len(self._ids)
            doc_of_token = np.repeat(np.arange(n_docs, dtype=np.int64), self._doclens)
            # Sorted, then the repeats dropped: not `np.unique`, whose hash path (NumPy >= 2.3)
            # took 1.9 CPU-s for the 2M tokens of 1,000 files (this 0.03 s), on the first
            # query of every process.
            pairs = np.sort(self._codes.astype(np.int64) * n_docs + doc_of_token)
            if len(pairs):
                pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
            centroid, docs = np.divmod(pairs, n_docs)
            counts = np.bincount(centroid, minlength=len(self._codec.centroids))
            offsets = np.concatenate([[0], np.cumsum(counts)])
            self._ivf = (offsets, docs)
        return self._ivf

    def _decompressed(self, tokens: np.ndarray) -> np.ndarray:
        return self._codec.decompress(self._codes[tokens], self._residuals[tokens])
