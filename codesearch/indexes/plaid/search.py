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
from codesearch.indexes.plaid.tokens import Tokens

__all__ = ["MIN_PROBE", "PROBE_BUDGET", "PlaidSearch", "inverted_lists"]

#: Inverted-list entries (document, centroid) one query's candidate generation reads at
#: most: each query token keeps its nearest centroids, best first, while the entries of all
#: tokens' probes up to that rank fit (and at least `MIN_PROBE` of them). Stage 1 costs a
#: pass over those entries; past a few million tokens a centroid's list holds thousands of
#: documents, and 32 query tokens x 32 probes read 11M entries a query at 600k chunks
#: (210M tokens, 16k centroids: 0.8 s), where PLAID itself probes 1-4 cells per token.
#: An index of ~1,000 files reads ~0.1M entries a query: untouched.
PROBE_BUDGET = 1 << 20
MIN_PROBE = 4


class PlaidSearch:
    """PLAID's three search stages over the compressed tokens; `PlaidIndex` fills the
    arrays below."""

    ndocs: int | None
    _codec: ResidualCodec | None
    _codes: Tokens | None  # (tokens,) centroid ids
    _residuals: Tokens | None  # (tokens, packed_dim) uint8
    _ids: np.ndarray
    _doclens: np.ndarray
    _starts: np.ndarray
    _alive: np.ndarray
    _base_docs: int
    _ivf: tuple[np.ndarray, np.ndarray] | None
    _tail_ivf: tuple[np.ndarray, np.ndarray] | None
    _ivf_reader: tuple[np.ndarray, Tokens] | None  # the mapped base lists, read with pread (`Tokens`)

    def _plaid_search(self, q: np.ndarray, k: int, nprobe: int, ndocs: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of one query by PLAID's three stages (candidates from probed centroids,
        centroid interaction, exact MaxSim of the survivors)."""
        codec = self._codec
        q_tok = len(q)
        centroid_scores = codec.centroids @ q.T  # (centroids, q_tokens)
        nprobe = min(nprobe, len(codec.centroids))
        probed = np.argpartition(-centroid_scores, nprobe - 1, axis=0)[:nprobe]  # (nprobe, q_tokens)
        probed = self._within_budget(probed, centroid_scores)
        nprobe = len(probed)
        probe_centroid = probed.reshape(-1)
        probe_qtok = np.tile(np.arange(q_tok), nprobe)
        probe_score = centroid_scores[probe_centroid, probe_qtok]

        # Stage 1, candidate generation: the documents in the probed centroids' lists. Each
        # gets, per query token, the best score among the probed centroids it appears in
        # (0 where none): a lower bound on centroid interaction that costs one pass over
        # the probed lists, a few thousand entries, however large the collection.
        found = []
        for ivf_offsets, ivf_docs in self._inverted_lists():
            starts = ivf_offsets[probe_centroid]
            lens = ivf_offsets[probe_centroid + 1] - starts
            found.append((self._list_entries(ivf_docs, starts, lens), np.repeat(probe_qtok, lens),
                          np.repeat(probe_score, lens)))
        docs = np.concatenate([f[0] for f in found]).astype(np.int64, copy=False)
        entry_qtok = np.concatenate([f[1] for f in found])
        entry_score = np.concatenate([f[2] for f in found])
        keep = docs < len(self._alive)  # (a list entry out of range: a damaged file, skipped)
        keep[keep] = self._alive[docs[keep]]
        docs, entry_qtok, entry_score = docs[keep], entry_qtok[keep], entry_score[keep]
        if not len(docs):
            return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
        candidates, slot = _distinct(docs, len(self._alive))
        best = np.zeros(len(candidates) * q_tok, dtype=np.float32)
        np.maximum.at(best, slot * q_tok + entry_qtok, entry_score)
        ndocs = ndocs or self.ndocs or max(512, 8 * k)
        candidates = _best(candidates, best.reshape(-1, q_tok).sum(axis=1), ndocs)

        # Stage 2, centroid interaction: MaxSim with every token of the candidates replaced
        # by its centroid (no decompression); a quarter survive, as in PLAID.
        lens = self._doclens[candidates]
        tokens = _token_index(self._starts[candidates], lens)
        # Query tokens first, so each reduction runs along contiguous memory: 16 ms against
        # 91 ms (token rows) for 800 candidates of 350 tokens and 32 query tokens.
        approx_tok = np.take(np.ascontiguousarray(centroid_scores.T), self._centroid_ids(tokens), axis=1)
        approx = np.maximum.reduceat(approx_tok, _segment_starts(lens), axis=1).sum(axis=0)  # (q_tokens, tokens)
        candidates = _best(candidates, approx, max(k, ndocs // 4))

        # Stage 3: exact MaxSim on decompressed tokens of the survivors.
        scores = exact_maxsim(self._starts, self._doclens, candidates, [q], self._decompressed)[:, 0]
        return _top_k(self._ids[candidates], scores, k)

    def _within_budget(self, probed: np.ndarray, centroid_scores: np.ndarray) -> np.ndarray:
        """``probed`` (nprobe, q_tokens), each column best first, cut to the ranks whose
        list entries fit `PROBE_BUDGET` (at least `MIN_PROBE` ranks)."""
        cols = np.arange(probed.shape[1])
        probed = np.take_along_axis(probed, np.argsort(-centroid_scores[probed, cols], axis=0, kind="stable"), axis=0)
        entries = np.zeros(probed.shape, dtype=np.int64)
        for offsets, _ in self._inverted_lists():
            entries += offsets[probed + 1] - offsets[probed]
        fit = int(np.searchsorted(np.cumsum(entries.sum(axis=1)), PROBE_BUDGET, side="right"))
        return probed[: max(MIN_PROBE, fit)]

    def _list_entries(self, ivf_docs: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """The entries of the probed lists (each ``lens`` long from ``starts``), in order: with
        one ``pread`` a list from a mapped base's file, not through the mapping, where the
        kernel makes whole large folios resident (the daemon of a 600k-chunk index grew by
        530 MB in 50 queries reading its 870 MB of lists so)."""
        reader = self._ivf_reader
        rows = _token_index(starts, lens)
        return reader[1].take(rows) if reader is not None and reader[0] is ivf_docs else ivf_docs[rows]

    def _inverted_lists(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Centroid -> positions of the documents with a token there, CSR: one for the
        base's documents (mapped from disk when loaded, else made on first use) and one for
        the tail's (made on first use, kept until the tail changes)."""
        n_centroids, nb = len(self._codec.centroids), self._base_docs
        if self._ivf is None:
            self._ivf = inverted_lists(self._codes.base, self._doclens[:nb], n_centroids)
        if self._tail_ivf is None:
            offsets, docs = inverted_lists(self._codes.tail, self._doclens[nb:], n_centroids)
            self._tail_ivf = (offsets, docs + nb)
        return [self._ivf, self._tail_ivf] if len(self._tail_ivf[1]) else [self._ivf]

    def _centroid_ids(self, tokens: np.ndarray) -> np.ndarray:
        """The tokens' centroid ids, clipped to the codec's range (a damaged file's codes
        give a wrong score, never an index error)."""
        return np.minimum(self._codes.take(tokens), len(self._codec.centroids) - 1)

    def _decompressed(self, tokens: np.ndarray) -> np.ndarray:
        return self._codec.decompress(self._centroid_ids(tokens), self._residuals.take(tokens))


def _distinct(docs: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(docs, return_inverse=True)`` for values in ``[0, n_docs)``, by marking
    them in an array of ``n_docs`` instead of sorting: 0.31 s against 1.38 s (with the
    `np.maximum.at` after it) for 1.3M probed entries of 600k documents (load 30 on 2 cores)."""
    seen = np.zeros(n_docs, dtype=bool)
    seen[docs] = True
    distinct = np.flatnonzero(seen)
    rank = np.empty(n_docs, dtype=np.int64)
    rank[distinct] = np.arange(len(distinct))
    return distinct, rank[docs]


def inverted_lists(codes: np.ndarray, doclens: np.ndarray, n_centroids: int) -> tuple[np.ndarray, np.ndarray]:
    """Centroid -> positions of the documents (``doclens`` tokens each, their ``codes`` in a
    row) with a token there, as CSR ``(offsets (n_centroids + 1,) int64, docs int32)``, each
    list by position."""
    n_docs = len(doclens)
    doc_of_token = np.repeat(np.arange(n_docs, dtype=np.int64), doclens)
    # Sorted, then the repeats dropped: not `np.unique`, whose hash path (NumPy >= 2.3)
    # took 1.9 CPU-s for the 2M tokens of 1,000 files (this 0.03 s), on the first
    # query of every process.
    pairs = np.sort(np.asarray(codes).astype(np.int64) * max(n_docs, 1) + doc_of_token)
    if len(pairs):
        pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
    centroid, docs = np.divmod(pairs, max(n_docs, 1))
    counts = np.bincount(centroid, minlength=n_centroids)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, docs.astype(np.int32)
