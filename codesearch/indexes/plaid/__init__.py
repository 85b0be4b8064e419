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
- **candidate generation**: each query token probes its ``nprobe`` nearest centroids (fewer
  past a few million tokens: a query reads at most ``PROBE_BUDGET`` list entries, nearest
  centroids first, as PLAID probes 1-4 cells a token at scale); the documents with a token
  in a probed centroid are candidates;
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

On disk: a folder of ``.npy`` arrays named by a manifest (`codesearch.indexes.folder`),
opened memory-mapped: a query reads the inverted lists it probes and its candidates'
tokens, nothing else. Documents added since the base was written live in a tail that a
save rewrites alone; removed ones are skipped until a fold or compaction drops them.

Codes made elsewhere: an index run's workers may compress the documents they encode under
a codec trained early on a sample (`coded`); ``add(coded=...)`` takes their codes under the
codec that made them, and a build takes that codec instead of training one.

In bounded memory: an index run's writer builds the index into its folder
(`PlaidIndex.fill`, `build`): the codec trained on a sample of the distinct texts, each text
compressed once and a block at a time, its codes written at every chunk of it, the inverted
lists merged from runs on disk; a fold or compaction of such an index copies its base a
block at a time the same way. The in-memory build (`add` past the threshold) held every
token as float32: 5.8 GB at 60k chunks.

Modules: `index` (`PlaidIndex`), `codec` (`ResidualCodec`), `coded` (codes made by the
workers), `build` (a base written into the folder as it is made), `maxsim` (exact MaxSim),
`search` (the PLAID path), `files` (save and load), `tokens` (a per-token array: mapped base
and in-memory tail).
"""

from codesearch.indexes.plaid.codec import ResidualCodec
from codesearch.indexes.plaid.index import EXACT_TOKEN_THRESHOLD, PlaidIndex
from codesearch.indexes.plaid.maxsim import maxsim_search

__all__ = ["EXACT_TOKEN_THRESHOLD", "PlaidIndex", "ResidualCodec", "maxsim_search"]
