"""A PLAID base written into its index folder as it is made, in bounded memory: what an index
run's writer builds (`PlaidIndex.lists_dir`), where the in-memory build held every token.

The in-memory build (`PlaidIndex.add` past the threshold) takes every document's token
vectors as one float32 array, then keeps every code, and a fold copies the base and the tail
into a new base: 5.8 GB at 60k chunks (21M tokens of 48 dims), so a 114k-file monorepo (600k
chunks, 210M tokens) did not fit in 24 GB. Here:

- **Codec.** Trained on the token vectors of a seeded sample of the distinct texts, about
  `SAMPLE_TOKENS_PER_CENTROID` tokens a centroid (`coded.train_on_sample`, as the workers'
  codec is), or taken as given (the workers', the user's cache).
- **Codes.** A chunk's vectors are those of its text (the store keys them by its hash), so
  each distinct text is read once and compressed once, `BLOCK_TOKENS` tokens at a time, and
  its codes are written at the token rows of every chunk of it (`folder.ArrayFile`, with
  ``pwrite``). Ten copies of a repository cost one compression, not ten.
- **Inverted lists.** The codes are read back `IVF_BLOCK_TOKENS` at a time; each block's
  (centroid, document) pairs, sorted, go to a runs file with their count per centroid; then
  the lists are merged from the runs, `MERGE_ENTRIES` entries at a time, centroids in order:
  the same arrays `search.inverted_lists` makes in memory.
- **Folds.** A fold (`PlaidIndex._compact`, `compact`) copies the live documents' codes
  from the old base's files and the tail into a new base the same way, a block at a time.

The base's files are then named by a manifest (a save) and opened mapped, as a load does:
the index holds its document tables, the codec and the tail, and what a query reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codesearch.indexes.folder import ArrayFile, Kept, pwrite_all
from codesearch.indexes.plaid.codec import DocCodes, ResidualCodec, compress_documents
from codesearch.indexes.plaid.coded import train_on_sample
from codesearch.indexes.plaid.maxsim import _segment_starts, _token_index
from codesearch.indexes.plaid.search import inverted_lists
from codesearch.indexes.plaid.tokens import Tokens

__all__ = ["BLOCK_TOKENS", "IVF_BLOCK_TOKENS", "MERGE_ENTRIES", "SAMPLE_TOKENS_PER_CENTROID", "Training", "Written",
           "compact", "fill", "write_base"]

#: Tokens read, compressed or copied at a time: 2^18 tokens x 48 dims are 50 MB as float32.
BLOCK_TOKENS = 1 << 18
#: Codes read back at a time to make the inverted lists' runs (their pairs: 32 MB of int64).
IVF_BLOCK_TOKENS = 1 << 22
#: Inverted-list entries merged from the runs at a time (their labels and order: 128 MB).
MERGE_ENTRIES = 1 << 23
#: Sample tokens a centroid for the codec: k-means sees 32 a centroid of the four fifths of
#: the sampled texts it trains on (`coded.fit_on_sample`), the rest measure its error.
SAMPLE_TOKENS_PER_CENTROID = 40

#: ``fetch(ids)``: the token arrays of the documents ``ids`` (any float dtype), in that order.
Fetch = Callable[[np.ndarray], Sequence[np.ndarray]]
#: ``given(keys)``: codes made elsewhere under the codec, by text key (None where none).
Given = Callable[[Sequence[str]], Sequence[DocCodes | None]]


class Changed(Exception):
    """The documents read do not have the token counts the build was given: the store changed
    between its reads (the caller falls back to adding what it reads)."""


@dataclass(frozen=True)
class Training:
    """How a codec is trained (the index's parameters): its centroid count for a number of
    distinct tokens, residual bits, k-means iterations and seed."""

    n_centroids: Callable[[int], int]
    nbits: int
    niter: int
    seed: int


@dataclass(frozen=True, eq=False)
class Written:
    """A base written into an index folder: its documents, codec, files (with the manifest
    entries a save names them by) and drift count; what `PlaidIndex` then takes as its own."""

    ids: np.ndarray
    lens: np.ndarray
    codec: ResidualCodec
    build_error: float
    kept: dict[str, Kept]
    added: tuple[float, int]


class Made:
    """What a `CodeKeeper` reads of an index after an add (its codec, build error and the
    codes of the documents added), for the texts one block of a build compressed."""

    def __init__(self, codec: ResidualCodec, build_error: float, ids: np.ndarray, docs: Sequence[DocCodes]) -> None:
        self.codec, self.build_error = codec, build_error
        self._codes = {int(i): (d.codes, d.packed) for i, d in zip(ids.tolist(), docs)}

    def doc_codes(self, ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return {int(i): self._codes[int(i)] for i in ids if int(i) in self._codes}


def fill(
    folder: Path, ids: np.ndarray, lens: np.ndarray, keys: Sequence[str], fetch: Fetch, *, training: Training,
    codec: tuple[ResidualCodec, float] | None = None, given: Given | None = None, held: Given | None = None,
    added: tuple[float, int] | None = None, wants: Callable[[Sequence[str]], Sequence[bool]] | None = None,
    keep: Callable[[Made, np.ndarray, dict[int, str], list[np.ndarray]], None] | None = None,
) -> Written:
    """A PLAID base in ``folder`` of the documents ``ids`` of ``lens`` tokens, whose vectors
    are those of their text ``keys`` (str, or ASCII bytes, which take a quarter of the
    memory; documents of one key have the same vectors); see the module's notes.

    ``codec``: the codec to take and its held-out error (else one is trained on a sample as
    ``training`` says).
    ``held``, then ``given``: codes made under it, by key (the index's own, then the
    workers' or the cache's); a text without them (or of another length) is compressed here.
    ``added``: the index's drift count so far (summed error, tokens), which the documents not
    ``held`` add to (a refill of a PLAID index under its codec); else it starts at zero.
    ``keep`` is told each block's newly compressed texts (the user's cache keeps them), with
    the arrays of those ``wants`` asks for even where codes were given.

    Raises `Changed` when a read does not match ``lens`` (nothing is left behind).
    """
    ids = np.asarray(ids, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    key_array = np.asarray(keys)  # (bytes keys: 32 a hash at 600k chunks, where str takes 128)
    uniq, first, inverse = np.unique(key_array if key_array.dtype.kind in "SU" else key_array.astype(str),
                                     return_index=True, return_inverse=True)
    decode = uniq.dtype.kind == "S"
    text_lens = lens[first]
    if codec is None:
        codec = _train(training, ids[first], text_lens, fetch)
    codec_, error = codec
    starts = _segment_starts(lens)
    by_text = np.argsort(inverse, kind="stable")  # documents grouped by text, each group by position
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(uniq)))])
    drift = [float(added[0]), int(added[1])] if added is not None else None

    def codes_of(source: Given | None, texts: list[str], at: int) -> list[DocCodes | None]:
        found = list(source(texts)) if source is not None else [None] * len(texts)
        return [d if d is not None and len(d.codes) == text_lens[at + i] and np.shape(d.packed) == (
            text_lens[at + i], codec_.packed_dim) else None for i, d in enumerate(found)]

    def write_tokens(codes: ArrayFile, residuals: ArrayFile) -> None:
        for a, b in _blocks(text_lens, BLOCK_TOKENS):
            texts = [t.decode() for t in uniq[a:b].tolist()] if decode else uniq[a:b].tolist()
            own = codes_of(held, texts, a)
            have = [o or g for o, g in zip(own, codes_of(given, texts, a))]
            asked = list(wants(texts)) if wants is not None and keep is not None else [False] * len(texts)
            # (a text the index holds is not the keeper's: it was kept when it was coded)
            need = np.array([h is None or (w and o is None) for h, w, o in zip(have, asked, own)], dtype=bool)
            rep = ids[first[a:b]]
            arrays = [np.asarray(x) for x in fetch(rep[need])] if need.any() else []
            if len(arrays) != int(need.sum()) or any(
                    len(x) != n for x, n in zip(arrays, text_lens[a:b][need].tolist())):
                raise Changed
            slot = np.cumsum(need) - 1  # text i's array: arrays[slot[i]], where need[i]
            fresh = [i for i in np.flatnonzero(need).tolist() if have[i] is None]
            made = compress_documents(codec_, [arrays[slot[i]] for i in fresh]) if fresh else []
            for i, d in zip(fresh, made):
                have[i] = d
            if keep is not None and need.any():
                picked = np.flatnonzero(need)
                docs_read = [have[i] for i in picked.tolist()]
                keep(Made(codec_, error, rep[picked], docs_read), rep[picked],
                     {int(rep[i]): texts[i] for i in picked.tolist()}, arrays)
            for i, doc in enumerate(have):
                copies = by_text[bounds[a + i] : bounds[a + i + 1]].tolist()
                if drift is not None and own[i] is None:  # (as an add counts what it compresses)
                    drift[0] += doc.error * len(copies)
                    drift[1] += len(doc.codes) * len(copies)
                for pos in copies:
                    codes.write(int(starts[pos]), doc.codes)
                    residuals.write(int(starts[pos]), doc.packed)

    return write_base(folder, ids, lens, codec_, error, write_tokens, added=(0.0, 0) if drift is None else drift)


def compact(folder: Path, ids: np.ndarray, lens: np.ndarray, starts: np.ndarray, codes: Tokens, residuals: Tokens,
            codec: ResidualCodec, build_error: float, added: tuple[float, int]) -> Written:
    """A fold or compaction into ``folder``: a base of the documents ``ids`` (``lens``
    tokens each, at ``starts`` in ``codes`` and ``residuals``, the old base and tail), their
    codes copied a block at a time."""

    def write_tokens(codes_file: ArrayFile, residuals_file: ArrayFile) -> None:
        at = 0
        for a, b in _blocks(lens, BLOCK_TOKENS):
            tokens = _token_index(starts[a:b], lens[a:b])
            codes_file.write(at, codes.take(tokens))
            residuals_file.write(at, residuals.take(tokens))
            at += len(tokens)

    return write_base(folder, ids, lens, codec, build_error, write_tokens, added=added)


def write_base(
    folder: Path, ids: np.ndarray, lens: np.ndarray, codec: ResidualCodec, build_error: float,
    write_tokens: Callable[[ArrayFile, ArrayFile], None], *, added: Sequence[float] = (0.0, 0),
) -> Written:
    """Write a base of the documents ``ids`` (``lens`` tokens each) under ``codec`` into
    ``folder``: ``write_tokens(codes, residuals)`` fills every token row of the two files,
    then its inverted lists are made from them. The index saves it, then opens it mapped."""
    total = int(lens.sum())
    made: list[ArrayFile] = []
    try:
        codes = ArrayFile(folder, "codes", codec.code_dtype, (total,))
        made.append(codes)
        residuals = ArrayFile(folder, "residuals", np.uint8, (total, codec.packed_dim))
        made.append(residuals)
        write_tokens(codes, residuals)
        offsets, ivf_docs = _inverted_lists(folder, codes, lens, len(codec.centroids))
        kept = {"codes": codes.finish(), "residuals": residuals.finish(), "ivf_docs": ivf_docs}
        made.clear()  # (finished: the save names them, or its next one removes them)
        kept |= {name: _array_file(folder, name, array) for name, array in (
            ("ids", ids), ("doclens", lens), ("ivf_offsets", offsets), ("centroids", codec.centroids),
            ("cutoffs", codec.cutoffs), ("weights", codec.weights))}
    finally:
        for f in made:
            f.discard()
    return Written(ids, lens, codec, float(build_error), kept, (float(added[0]), int(added[1])))


def _train(training: Training, text_ids: np.ndarray, text_lens: np.ndarray,
           fetch: Fetch) -> tuple[ResidualCodec, float]:
    """A codec trained on a seeded sample of the distinct texts, with as many centroids as
    their tokens call for (copies of a text add no content to fit)."""
    n_centroids = training.n_centroids(int(text_lens.sum()))
    order = np.random.default_rng(training.seed).permutation(len(text_ids))
    want = SAMPLE_TOKENS_PER_CENTROID * n_centroids
    take = int(np.searchsorted(np.cumsum(text_lens[order]), want)) + 1
    picked = np.sort(order[:take])
    docs = [np.asarray(x) for x in fetch(text_ids[picked])]
    if len(docs) != len(picked) or any(len(d) != n for d, n in zip(docs, text_lens[picked].tolist())):
        raise Changed
    return train_on_sample(docs, nbits=training.nbits, n_centroids=min(n_centroids, max(1, sum(map(len, docs)))),
                           niter=training.niter, seed=training.seed)


def _inverted_lists(folder: Path, codes: ArrayFile, lens: np.ndarray, n_centroids: int) -> tuple[np.ndarray, Kept]:
    """`search.inverted_lists` of the codes in ``codes``: the offsets, and the documents'
    file (see the module's notes)."""
    starts = _segment_starts(lens)
    runs_path = folder / f"ivf-runs.{os.urandom(4).hex()}.tmp"
    counts: list[np.ndarray] = []  # per run: its entries of each centroid
    run_at: list[int] = []  # per run: its first entry in the runs file
    ivf: ArrayFile | None = None
    try:
        with open(runs_path, "w+b", buffering=0) as runs:
            entries = 0
            for a, b in _blocks(lens, IVF_BLOCK_TOKENS):
                block = codes.read(int(starts[a]), np.empty(int(lens[a:b].sum()), codes.dtype))
                block_offsets, doc = inverted_lists(block, lens[a:b], n_centroids)  # (the block's own lists)
                counts.append(np.diff(block_offsets))
                run_at.append(entries)
                if len(doc):
                    pwrite_all(runs.fileno(), memoryview((doc + a).astype(np.int32)).cast("B"), entries * 4)
                entries += len(doc)
            offsets = np.concatenate([[0], np.cumsum(np.sum(counts, axis=0) if counts else
                                                     np.zeros(n_centroids, np.int64))]).astype(np.int64)
            cum = [np.concatenate([[0], np.cumsum(c)]) for c in counts]
            ivf = ArrayFile(folder, "ivf_docs", np.int32, (int(offsets[-1]),))
            c0 = 0
            while c0 < n_centroids:
                c1 = int(np.searchsorted(offsets, offsets[c0] + MERGE_ENTRIES, side="right")) - 1
                c1 = min(n_centroids, max(c0 + 1, c1))
                docs, labels = [], []
                for r, at in enumerate(run_at):
                    lo, hi = int(cum[r][c0]), int(cum[r][c1])
                    if hi > lo:
                        part = np.empty(hi - lo, np.int32)
                        if os.preadv(runs.fileno(), [memoryview(part).cast("B")], (at + lo) * 4) != part.nbytes:
                            raise OSError(f"{runs_path.name} ends early")
                        docs.append(part)
                        labels.append(np.repeat(np.arange(c0, c1, dtype=np.int32), counts[r][c0:c1]))
                if docs:  # each centroid's entries, run after run: documents in order
                    merged = np.concatenate(docs)[np.argsort(np.concatenate(labels), kind="stable")]
                    ivf.write(int(offsets[c0]), merged)
                c0 = c1
            kept = ivf.finish()
            ivf = None
    finally:
        if ivf is not None:
            ivf.discard()
        runs_path.unlink(missing_ok=True)
    return offsets, kept


def _array_file(folder: Path, name: str, array: np.ndarray) -> Kept:
    array = np.ascontiguousarray(array)
    out = ArrayFile(folder, name, array.dtype, array.shape)
    try:
        out.write(0, array)
        return out.finish()
    except BaseException:
        out.discard()
        raise


def _blocks(lens: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consecutive items whose ``lens`` sum to at most ``budget`` (an item
    longer than that alone)."""
    out, a, n = [], 0, len(lens)
    cum = np.concatenate([[0], np.cumsum(lens)])
    while a < n:
        b = int(np.searchsorted(cum, cum[a] + budget, side="right")) - 1
        b = min(n, max(a + 1, b))
        out.append((a, b))
        a = b
    return out
