"""Every derived index in one table: its file in the index folder, the kind of vector it
holds, the signal it gives a search (and the fusion weight of that signal), and how it is
made empty, loaded, filled from the store, updated by a delta and kept at the store's
generation. The searcher and the ranker loop over this table: a new index of chunk vectors
is one entry in `DERIVED` (with its class in its own module, for a new type of index), and
its vector kind one entry in `codesearch.store.VECTOR_KINDS`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from codesearch.errors import (
    CodeSearchError,
    IndexCorruptError,
    IndexLockedError,
)
from codesearch.indexes.base import Index
from codesearch.store import KIND_ROLE, VECTOR_KINDS, IndexLock, Store
from codesearch.types import STORE_FILE

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid.coded import CodeBook

log = logging.getLogger(__name__)

#: A whole-file vector is used only when the model reads at least this many tokens: from
#: a 256-token model (MiniLM) it encodes little more than the file's imports and licence
#: header, and using it cost 0.5 NDCG points on the benchmark (0.861 -> 0.856, hybrid).
#: A shorter model's files are ranked by the mean of their chunk vectors instead, which
#: the index keeps (`file_centroids`).
FILE_VECTOR_MIN_TOKENS = 1024
#: Meta key of the tokens a role's model reads (recorded by each index run that has it).
MAX_TOKENS_KEY = "max_tokens.{role}"


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """One derived index: where it lives, what it holds and how it is made.

    ``kind`` is the store's vector kind it is filled from (None: the chunks' text), and so
    also the model role whose encoder makes its vectors and encodes its queries (`role`);
    ``per_file`` indexes have file ids, the others chunk ids; ``one_add`` indexes learn
    from what they are given (PLAID's centroids), so a rebuild hands them everything in one
    ``add``. ``signal`` names what it gives a search (in ``indexes_used``, a hit's
    ``sources``, and the `Mode` that searches it alone); ``weight`` is the
    `RankingParams` field that weighs its candidates in the fused score (None: the index
    feeds signals the ranker computes its own way: lexical, whole-file vectors).
    ``chunk_mean`` indexes hold, per file, the mean of its chunks' vectors of ``kind`` (a
    short-context model's stand-in for whole-file vectors), and exist only for such a model.
    ``legacy`` is the name the index had before (a file of an older format, read until the
    next save replaces it).
    """

    name: str
    filename: str  # file or folder inside the index folder
    kind: str | None
    index_class: str  # "module:Class", imported only when the index is used
    per_file: bool = False
    one_add: bool = False
    signal: str = ""
    weight: str | None = None
    chunk_mean: bool = False
    legacy: str | None = None

    def cls(self) -> type[Index]:
        module, _, attr = self.index_class.partition(":")
        return getattr(importlib.import_module(module), attr)

    def role(self) -> str | None:
        return None if self.kind is None else KIND_ROLE[self.kind]

    @property
    def multi(self) -> bool:
        """Its vectors (and queries) are one array of token vectors per text."""
        return self.kind is not None and VECTOR_KINDS[self.kind].multi


#: Every derived index, in the order they are synced (and their signals are fused). A new
#: index type: its class in a module of this package, and one entry here.
DERIVED: dict[str, IndexSpec] = {
    spec.name: spec
    for spec in (
        IndexSpec("lexical", "lexical", None, "codesearch.indexes.lexical:LexicalIndex", signal="lexical"),
        IndexSpec("dense_chunks", "dense_chunks", "dense", "codesearch.indexes.dense:DenseIndex",
                  signal="dense", weight="w_dense", legacy="dense_chunks.faiss"),
        IndexSpec("dense_files", "dense_files", "file", "codesearch.indexes.dense:DenseIndex", per_file=True,
                  signal="dense_files", legacy="dense_files.faiss"),
        IndexSpec("file_centroids", "file_centroids", "dense", "codesearch.indexes.dense:CentroidIndex",
                  per_file=True, chunk_mean=True, signal="dense_files"),
        IndexSpec("plaid", "plaid", "colbert", "codesearch.indexes.plaid:PlaidIndex", one_add=True,
                  signal="colbert", weight="w_colbert"),
    )
}


#: Files of the lexical index before its segmented format (`codesearch.indexes.lexical`): an
#: index that still has them is rebuilt from the store, once, and they are deleted.
LEGACY_FILES = ("lexical.npz", "centrality.npz")


@dataclass
class Delta:
    """What one index run changed, so each index is updated instead of rebuilt."""

    removed_chunks: list[tuple[int, str]]  # (chunk id, text hash)
    added_chunks: list[int]
    removed_files: list[int]
    changed_files: list[int]  # files whose content (hence file vector) changed
    newly_encoded: dict[str, set[str]]  # vector kind -> text hashes encoded this run


def wanted(store: Store) -> list[str]:
    """The derived indexes this store should have: the text ones, plus those of recorded
    models (a mean of chunk vectors only for a model known to read fewer than
    `FILE_VECTOR_MIN_TOKENS` tokens)."""
    roles = store.models()
    out = []
    for name, spec in DERIVED.items():
        if spec.role() is not None and spec.role() not in roles:
            continue
        if spec.chunk_mean and not short_context(store, spec.role()):
            continue
        out.append(name)
    return out



def short_context(store: Store, role: str | None) -> bool:
    """Whether the model of ``role`` is recorded as reading fewer than `FILE_VECTOR_MIN_TOKENS`
    tokens (False when no run recorded it: an index from before the record)."""
    tokens = store.get_meta(MAX_TOKENS_KEY.format(role=role))
    return tokens is not None and tokens.isdigit() and int(tokens) < FILE_VECTOR_MIN_TOKENS


def index_path(idir: Path, name: str) -> Path:
    """Where index ``name`` is in ``idir``: its own name, or the name it had before while
    only that one exists (an index written by an older codesearch)."""
    spec = DERIVED[name]
    path = idir / spec.filename
    if spec.legacy and not path.exists() and (idir / spec.legacy).exists():
        return idir / spec.legacy
    return path


def _empty_index(name: str, store: Store) -> Index:
    spec = DERIVED[name]
    if spec.kind is None:
        return spec.cls()()
    return spec.cls()(store.models()[spec.role()].dim)


def _load_index(name: str, path: Path) -> Index:
    return DERIVED[name].cls().load(path)


def _expected_len(name: str, store: Store) -> int | None:
    """How many items index ``name`` holds when it is whole (None: not checked by count; a
    mean of chunk vectors is rebuilt with the index of those chunks instead)."""
    spec = DERIVED[name]
    if spec.chunk_mean:
        return None
    return store.count("chunks") if spec.kind is None else store.count_with_vectors(spec.kind)


def _drifted(name: str, index: Index, store: Store, *, trust_mark: bool = False) -> bool:
    """Whether ``index`` holds another number of items than the store has for it. With
    ``trust_mark``, an index of vectors saved when the store's vectors were as they are now
    (`_vectors_mark`) is taken as whole without counting: the count joins every chunk with
    its vector (136 ms at 60k chunks under load, seconds at 600k), on every searcher open."""
    if trust_mark and DERIVED[name].kind is not None:
        mark = getattr(index, "store_mark", None)
        if mark is not None and mark == _vectors_mark(store):
            return False
    expected = _expected_len(name, store)
    return expected is not None and len(index) != expected


def _vectors_mark(store: Store) -> str | None:
    """What changes whenever the store gains or replaces a vector (the largest row id of the
    vectors table, which only grows as rows are added), with the recorded models' identities.

    A vector deleted from the store does not change it: nothing deletes a vector that a
    chunk of the recorded model uses, except the check that drops damaged arrays, whose run
    then encodes them again (the index's copies of them stay good meanwhile)."""
    top = store.vectors_mark()
    if top is None:
        return None
    return f"{top}:" + ",".join(f"{role}={m.identity}" for role, m in sorted(store.models().items()))


#: Ids whose vectors a sync reads from the store and adds to an index at a time.
_ADD_BATCH = 16_384
#: ... to a PLAID index (ColBERT arrays: ~350 tokens a chunk, 2,048 of them 140 MB as float32).
_PLAID_ADD_BATCH = 2_048


def _add_from_store(
    name: str, index: Index, store: Store, ids: Sequence[int] | None, codes: CodeBook | None = None,
    *, use_codes: bool = True,
) -> None:
    """Add ``ids`` (or everything, when None) to ``index`` from the store, no encoding; with
    ``codes``, a PLAID index takes the codes the run's workers made for them (unless not
    ``use_codes``), and hands what it holds then to ``codes.keep``, when set."""
    spec = DERIVED[name]
    if spec.chunk_mean:
        _add_chunk_means(index, store, spec.kind, ids)
        return
    assert spec.kind is not None, name  # the lexical index is written by its writer (`_rebuild_index`)
    if spec.one_add and _fill_from_store(index, store, spec.kind, ids, codes, use_codes=use_codes):
        return
    if spec.one_add and ids is not None and len(ids) > _PLAID_ADD_BATCH and getattr(index, "codec", None) is not None:
        # PLAID already: an add of many documents (a publication's) goes to the tail a batch
        # at a time, as each batch's arrays are read, and a fold to the index's folder.
        for start in range(0, len(ids), _PLAID_ADD_BATCH):
            _add_from_store(name, index, store, ids[start : start + _PLAID_ADD_BATCH], codes, use_codes=use_codes)
        return
    if spec.one_add and use_codes and codes is not None and codes.codec is not None:
        if _add_coded(index, store, spec.kind, ids, codes):
            return
    # A batch at a time: vectors_for makes an array per id, and a sync that adds every chunk
    # of a first run (603,770 at once) held them all, with their float32 copy: 3.1 GB.
    batches = store.iter_vectors(spec.kind) if ids is None else (
        store.vectors_for(ids[start : start + _ADD_BATCH], spec.kind) for start in range(0, len(ids), _ADD_BATCH))
    if spec.one_add:
        all_ids, all_vecs = [], []
        for found, arrays in batches:
            all_ids.append(found)
            all_vecs += arrays
        if all_vecs:
            found = np.concatenate(all_ids)
            keep = getattr(codes, "keep", None)
            hashes = store.hashes_of_chunks(found.tolist()) if codes is not None else {}
            if use_codes and codes is not None and codes.codec is not None:
                coded = codes.coded([hashes.get(int(i)) for i in found])
                index.add(found, all_vecs, coded=coded)
            else:
                index.add(found, all_vecs)
            if keep is not None:
                keep(index, found, hashes, all_vecs)
        return
    fill = getattr(index, "fill", None)  # (a dense index: built from reads of the store, see `DenseIndex.fill`)
    if ids is None and fill is not None and not len(index):
        def read() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            return ((f, np.concatenate(a, axis=0)) for f, a in store.iter_vectors(spec.kind, _ADD_BATCH) if len(f))

        if fill(read, len(store.vector_lengths(spec.kind)[0])):
            return  # (else the store changed between its reads: the vectors are added as read)
    for found, arrays in batches:
        if len(found):
            index.add(found, np.concatenate(arrays, axis=0))


def _add_chunk_means(index: Index, store: Store, kind: str, file_ids: Sequence[int] | None) -> None:
    """Add to ``index`` the normalised mean of each file's chunk vectors of ``kind``: of the
    files ``file_ids`` (or every file), read from the store a batch at a time, in file order
    (so a file is finished when the next one starts), and added `_ADD_BATCH` files at a time
    (the means of 114k files are 175 MB as float32)."""
    if file_ids is not None and not file_ids:
        return
    done_ids: list[np.ndarray] = []
    done: list[np.ndarray] = []
    carry: tuple[np.ndarray, np.ndarray] | None = None  # (file id, sum) of a file a batch cut

    def add() -> None:
        if done:
            means = np.concatenate(done)
            means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-9)
            index.add(np.concatenate(done_ids), means)
            done_ids.clear()
            done.clear()

    for fids, arrays in store.iter_vectors_by_file(kind, file_ids):
        vectors = np.concatenate(arrays, axis=0).astype(np.float32, copy=False)
        starts = np.flatnonzero(np.concatenate(([True], fids[1:] != fids[:-1])))
        sums = np.add.reduceat(vectors, starts, axis=0)
        owners = fids[starts]
        if carry is not None and owners[0] == carry[0]:
            sums[0] += carry[1]
        elif carry is not None:
            done_ids.append(carry[0][None])
            done.append(carry[1][None])
        done_ids.append(owners[:-1])
        done.append(sums[:-1])
        carry = (owners[-1], sums[-1])
        if sum(len(d) for d in done) >= _ADD_BATCH:
            add()
    if carry is not None:
        done_ids.append(carry[0][None])
        done.append(carry[1][None])
    add()


def _fill_from_store(
    index: Index, store: Store, kind: str, ids: Sequence[int] | None, codes: CodeBook | None, *, use_codes: bool,
) -> bool:
    """A PLAID index made afresh from the store's vectors into its folder, a block at a time
    (`PlaidIndex.fill`), where a writer builds it (`_writes_into`): when the sync makes it
    anew (``ids`` None), when an add of ``ids`` takes an exact index past its threshold, or
    when it adds to a PLAID index more than a fold of its tail would take (under its own
    codec, the codes it holds kept: one rewrite of the base, where the tail would fold again
    and again). Either way the index is then every vector of ``kind`` the store holds (a
    synced index holds them all). The in-memory add took every token as one float32 array:
    5.8 GB at 60k chunks. False where it does not apply or the store changed between reads
    (the caller adds as before)."""
    fill = getattr(index, "fill", None)
    if fill is None or getattr(index, "lists_dir", None) is None:
        return False
    if ids is not None:
        _, new_lens = store.vector_lengths(kind, ids)
        adding = int(new_lens.sum())
        if index.codec is not None and not index.outgrows_tail(adding):
            return False  # to the tail (and at most one fold, a copy of the base a block at a time)
        if index.codec is None and not index.becomes_plaid(index.n_tokens + adding):
            return False
    found, lens = store.vector_lengths(kind)
    if not len(found):
        return False
    keys: list[bytes] = []  # (as ASCII bytes, a batch of hashes read at a time: no dict of 600k strings)
    for start in range(0, len(found), _ADD_BATCH):
        part = found[start : start + _ADD_BATCH].tolist()
        hashes = store.hashes_of_chunks(part)
        if len(hashes) != len(part):
            return False  # (a chunk gone since its vector's length was read)
        keys += [hashes[i].encode() for i in part]
    key_array = np.array(keys)
    del keys
    held = _held_codes(index, found, key_array) if ids is not None and index.codec is not None else None

    def fetch(batch: np.ndarray) -> list[np.ndarray]:
        got, arrays = store.vectors_for(batch.tolist(), kind)
        return arrays if np.array_equal(got, batch) else []  # (one gone: the fill sees the change)

    codec = given = None
    if held is not None:
        codec = (index.codec, index.build_error)
    elif use_codes and codes is not None and codes.codec is not None:
        codec = (codes.codec, codes.error)
    if use_codes and codes is not None and codes.codec is not None and codec is not None and \
            codes.codec.fingerprint == codec[0].fingerprint:
        def given(texts: Sequence[str]) -> Sequence:  # the workers' (or the cache's) codes, under that codec
            coded = codes.coded(list(texts))
            return coded.docs if coded is not None else [None] * len(texts)
    keep = getattr(codes, "keep", None) if codes is not None else None
    wants = getattr(keep, "wants", None) or (None if keep is None else (lambda texts: [True] * len(texts)))
    return bool(fill(found, lens, key_array, fetch, codec=codec, given=given, held=held,
                     keep_drift=held is not None, wants=wants, keep=keep))


def _held_codes(index: Index, found: np.ndarray, keys: np.ndarray) -> Callable[[Sequence[str]], list]:
    """Text hash -> the codes a PLAID index holds for a document of that text: of the
    documents ``found`` (their text ``keys``, ASCII bytes) those the index holds."""
    from codesearch.indexes.plaid.codec import DocCodes

    own = np.isin(found, index.ids())
    own_keys, at = np.unique(keys[own], return_index=True)
    own_ids = found[own][at]

    def held(texts: Sequence[str]) -> list:
        if not len(own_keys):
            return [None] * len(texts)
        asked = np.array([t.encode() for t in texts], dtype=own_keys.dtype)
        pos = np.searchsorted(own_keys, asked).clip(0, len(own_keys) - 1)
        picked = [int(own_ids[p]) if own_keys[p] == a else None for p, a in zip(pos.tolist(), asked.tolist())]
        got = index.doc_codes([i for i in picked if i is not None])
        return [None if i is None or i not in got else DocCodes(*got[i], 0.0) for i in picked]

    return held


def _add_coded(index: Index, store: Store, kind: str, ids: Sequence[int] | None, codes: CodeBook) -> bool:
    """`_add_from_store` of a PLAID index given ``codes``: the arrays are read only for the
    documents the index computes codes for and those whose codes ``codes.keep`` measures.

    A second copy of a repository holds every text's codes (the user's cache): reading all of
    its 2.5M tokens back from the segments (CRC, float16 -> float32) only for their lengths
    cost ~0.6 of its 4.4 CPU-s on a quiet machine. The others get a stand-in of their shape, which the index does
    not read (`PlaidIndex.coded_only`): the index is the one every array makes. False (and
    nothing added) where the store changed between its two reads.
    """
    found, lens = store.vector_lengths(kind, ids)
    if not len(found):
        return True
    hashes = store.hashes_of_chunks(found.tolist())
    text_hashes = [hashes.get(int(i)) for i in found]
    coded = codes.coded(text_hashes)
    keep = getattr(codes, "keep", None)
    skip = index.coded_only(found, lens, coded)
    wants = getattr(keep, "wants", None)
    if keep is not None and wants is None:
        skip[:] = False  # a keeper that does not say which arrays it measures gets them all
    elif wants is not None:
        skip &= ~np.asarray(wants(text_hashes), dtype=bool)
    got_ids, got = store.vectors_for(found[~skip].tolist(), kind) if not skip.all() else (found[:0], [])
    arrays = dict(zip(got_ids.tolist(), got))
    read = zip(found[~skip].tolist(), lens[~skip].tolist())
    if len(arrays) != int((~skip).sum()) or any(len(arrays[i]) != n for i, n in read):
        return False  # (a vector gone or replaced since the lengths were read: the reading of them all)
    dim = index.dim
    stand_in = np.zeros((1, dim or 0), np.float32)
    vecs = [
        np.broadcast_to(stand_in, (n, dim)) if s else arrays[i]
        for i, n, s in zip(found.tolist(), lens.tolist(), skip.tolist())
    ]
    index.add(found, vecs, coded=coded)
    if keep is not None:
        keep(index, found, hashes, vecs)
    return True


def _rebuild_index(
    name: str, store: Store, codes: CodeBook | None = None, *, use_codes: bool = True, path: Path | None = None,
    in_place: bool = True,
) -> Index:
    """Index ``name`` made from the store. The lexical index is written as it is made:
    into ``path`` itself by a caller holding the index lock (``in_place``), else beside it
    (`lexical_writer.build_elsewhere`; a temporary folder without a ``path``); either way
    `_save_index` commits it."""
    if DERIVED[name].kind is None:
        from codesearch.indexes import lexical_writer

        if in_place and path is not None:
            return lexical_writer.build(store, path, parallel=True)
        return lexical_writer.build_elsewhere(store, path)
    index = _empty_index(name, store)
    if in_place and path is not None:
        _writes_into(index, path.parent / DERIVED[name].filename)  # (where `_save_named` saves it)
    _add_from_store(name, index, store, None, codes, use_codes=use_codes)
    return index


def _writes_into(index: Index, path: Path) -> None:
    """Tell ``index``, which a writer holding the index lock saves to ``path``, to build what
    it rebuilds there as it goes (a dense index's IVF lists: `DenseIndex.lists_dir`), not in
    memory."""
    if hasattr(index, "lists_dir"):
        index.lists_dir = path  # type: ignore[attr-defined]


def rebuild_index(name: str, store: Store) -> Index:
    """Index ``name`` made afresh from the store's vectors (or chunks), in memory."""
    return _rebuild_index(name, store)


def _apply_delta(name: str, index: Index, store: Store, delta: Delta, codes: CodeBook | None = None) -> Index:
    """``index`` brought up to date by ``delta`` (the lexical index: a new one, uncommitted)."""
    spec = DERIVED[name]
    if spec.kind is None:
        from codesearch.indexes import lexical_writer

        # By whole files: a changed file's chunks may keep their ids and text but move
        # (lines, symbols), and the lexical index holds those too.
        return lexical_writer.update(index, store, delta.removed_files, delta.changed_files)  # type: ignore[arg-type]
    if spec.chunk_mean:
        # A file's mean moves when its chunks change (its content did) or gain vectors.
        touched = set(delta.removed_files) | set(delta.changed_files)
        new_hashes = delta.newly_encoded.get(spec.kind, set())
        if new_hashes:
            touched |= store.files_of_chunks(store.chunk_ids_with_hashes(new_hashes))
        index.remove(np.asarray(sorted(touched), dtype=np.int64))
        _add_chunk_means(index, store, spec.kind, sorted(touched - set(delta.removed_files)))
        return index
    if spec.per_file:
        gone = delta.removed_files + delta.changed_files
        index.remove(np.asarray(gone, dtype=np.int64))
        fresh = set(delta.changed_files)
        new_hashes = delta.newly_encoded.get(spec.kind, set()) if spec.kind else set()
        if new_hashes:
            # Files whose content was unchanged but that lacked a vector (model added offline).
            fresh |= set(store.file_ids_with_hashes(new_hashes))
        _add_from_store(name, index, store, sorted(fresh))
        return index
    removed = [cid for cid, _ in delta.removed_chunks]
    index.remove(np.asarray(removed, dtype=np.int64))
    add = set(delta.added_chunks)
    if spec.kind is not None:
        new_hashes = delta.newly_encoded.get(spec.kind, set())
        if new_hashes:
            add |= set(store.chunk_ids_with_hashes(new_hashes))
    _add_from_store(name, index, store, sorted(add), codes)
    return index


def _save_index(index: Index, path: Path) -> None:
    # Every index class writes atomically (temp file + os.replace), so a crash here leaves
    # the previous file, whose recorded generation then no longer matches the store.
    index.save(path)


def _save_named(index: Index, idir: Path, name: str, store: Store) -> None:
    """Save index ``name`` under its name (an index of vectors with the store's
    `_vectors_mark`, which it holds all of); the file of an older format it replaces goes."""
    spec = DERIVED[name]
    if spec.kind is not None and hasattr(index, "store_mark"):
        index.store_mark = _vectors_mark(store)
    _save_index(index, idir / spec.filename)
    if spec.legacy:
        _remove(idir / spec.legacy)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _touches(name: str, delta: Delta) -> bool:
    """Whether ``delta`` changes what index ``name`` holds."""
    spec = DERIVED[name]
    if spec.kind is None:
        return bool(delta.removed_files or delta.changed_files or delta.removed_chunks or delta.added_chunks)
    if spec.kind is not None and delta.newly_encoded.get(spec.kind):
        return True
    if spec.per_file:
        return bool(delta.removed_files or delta.changed_files)
    return bool(delta.removed_chunks or delta.added_chunks)


def sync_derived(
    idir: Path, store: Store, prev_gen: int, delta: Delta, report: Callable[..., None], *, gen: int | None = None,
    codes: CodeBook | None = None,
) -> list[str]:
    """Bring every wanted index from generation ``prev_gen`` to ``gen`` (the store's when
    None), by ``delta`` where it was at ``prev_gen`` (rebuilt from the store's vectors
    otherwise, or when it drifted); an index the delta does not touch only has its
    generation recorded.

    With ``gen`` None the store has committed ``gen`` already, and each index's generation
    is recorded as its file is written. With ``gen`` given (a publication of vectors: the
    store stays at ``prev_gen`` while the files are made, and ``store`` may be a read-only
    snapshot), nothing is written to the store: the names of the indexes to mark come back,
    for :func:`record_generation` to commit with ``gen`` in one transaction. A search in
    between loads files newer than their recorded generation, which for vectors is only
    more of them: committed ones.

    ``codes``: the PLAID codes the run's workers made (see `codesearch.indexes.plaid.coded`),
    which the PLAID index takes instead of computing them, except when it is rebuilt
    because its codec went stale.
    """
    record = gen is None
    gen = store.generation if gen is None else gen
    names = wanted(store)
    marked: list[str] = []
    rebuilt_kinds: set[str | None] = set()
    for i, name in enumerate(names):
        spec = DERIVED[name]
        path = index_path(idir, name)
        saved = store.get_meta(f"gen.{name}")
        index = None
        # (The mean of chunk vectors is rebuilt with the index of those chunks.)
        follows = spec.chunk_mean and spec.kind in rebuilt_kinds
        if saved == str(gen) and path.exists() and not follows:
            report("sync", i + 1, len(names), message=f"{name}: up to date")
            continue
        marked.append(name)
        if saved == str(prev_gen) and path.exists() and not _touches(name, delta) and not follows:
            if record:
                store.set_meta(f"gen.{name}", gen)
            report("sync", i + 1, len(names), message=f"{name}: unchanged")
            continue
        stale = False
        if saved == str(prev_gen) and path.exists() and not follows:
            try:
                index = _load_index(name, path)
                _writes_into(index, idir / spec.filename)
                index = _apply_delta(name, index, store, delta, codes)
                stale = index.needs_rebuild
                if _drifted(name, index, store) or stale:
                    index = None  # drifted (or PLAID's codec went stale): rebuild below
            except (CodeSearchError, ValueError, KeyError, IndexError) as exc:
                if isinstance(exc, IndexCorruptError):
                    _say_rebuilt(name, path, exc)
                index = None
        if index is None:
            # A stale codec is retrained here, on everything: not taken from the run's codes.
            _legacy_notice(idir, name)
            index = _rebuild_index(name, store, codes, use_codes=not stale, path=path)
            if not spec.per_file:
                rebuilt_kinds.add(spec.kind)  # (the means of these chunks follow: `follows`)
        _save_named(index, idir, name, store)
        if spec.kind is None:
            _drop_legacy(idir)
        if record:
            store.set_meta(f"gen.{name}", gen)
        report("sync", i + 1, len(names), message=name)
    if not record:
        return marked
    for name in set(DERIVED) - set(names):
        # A model the index no longer records (after a rebuild): its index file goes too.
        store.delete_meta(f"gen.{name}")
        for filename in (DERIVED[name].filename, DERIVED[name].legacy):
            if filename:
                _remove(idir / filename)
    return marked


def _say_rebuilt(name: str, path: Path, exc: Exception) -> None:
    """One line on stderr (or the daemon's log) when an index file cannot be read and is
    rebuilt from the store's vectors: the index still answers, at a one-time cost."""
    if path.exists():
        log.warning("%s; rebuilding the %s index from the store", str(exc).split("; run ", 1)[0], name)


def record_generation(store: Store, gen: int, names: Sequence[str]) -> None:
    """Commit ``gen`` as the store's generation and as that of the indexes ``names``, at once:
    the end of a publication made by ``sync_derived(..., gen=gen)``."""
    with store.transaction():
        store.set_meta("generation", gen)
        for name in names:
            store.set_meta(f"gen.{name}", gen)


def load_derived(index_dir: str | os.PathLike[str], store: Store, *, wait_s: float = 5.0) -> dict[str, Index]:
    """Load every derived index the store calls for, at the store's generation.

    An index whose recorded generation differs from the store's, or whose file is missing
    or corrupt, is rebuilt from the store's vectors (no encoding) - in memory, and on disk
    too when no indexer holds the lock. Except while an indexer holds the lock: then the
    mismatch is its sync in progress (it committed the store and is writing the index
    files), so this waits up to ``wait_s`` seconds for those files instead of rebuilding
    what the writer is about to write.

    Returns
    -------
    dict
        ``"lexical"`` (:class:`LexicalIndex`), and where the store records the models
        ``"dense_chunks"``, ``"dense_files"`` (:class:`DenseIndex`, ids = chunk / file ids)
        and ``"plaid"`` (:class:`PlaidIndex`).
    """
    idir = Path(index_dir)
    deadline = time.monotonic() + wait_s
    out: dict[str, Index] = {}
    for _attempt in range(3):
        gen = store.generation
        if _out_of_sync(idir, store, gen):
            _wait_for_writer(idir, store, deadline)
            gen = store.generation
        out = {}
        stale: list[str] = []
        encoding = IndexLock.writer_active(idir)
        for name in wanted(store):
            spec = DERIVED[name]
            path = index_path(idir, name)
            index = None
            # (The mean of chunk vectors is rebuilt with the index of those chunks.)
            follows = spec.chunk_mean and any(DERIVED[n].kind == spec.kind and not DERIVED[n].per_file for n in stale)
            if store.get_meta(f"gen.{name}") == str(gen) and path.exists() and not follows:
                try:
                    index = _load_index(name, path)
                except IndexCorruptError as exc:
                    _say_rebuilt(name, path, exc)
                # A run that is encoding commits vectors between its publications: a vector
                # index then holds fewer than the store, and is still its run's latest
                # word. Rebuilding it here would cost a search what the run's next
                # publication does anyway (minutes for PLAID at millions of tokens).
                vectors_in_flight = encoding and spec.kind is not None
                if index is not None and not vectors_in_flight and _drifted(name, index, store, trust_mark=True):
                    index = None
            if index is None:
                index = _rebuild_index(name, store, path=path, in_place=False)
                if DERIVED[name].kind is None and _legacy_notice(idir, name, say=False):
                    index.notices.append(  # type: ignore[attr-defined]
                        "the lexical index was in an older format and was rebuilt in the new one (once)")
                stale.append(name)
            out[name] = index
        if stale:
            _persist_rebuilt(idir, store, gen, {n: out[n] for n in stale})
        # A writer may have committed while we loaded; then load again.
        if store.generation == gen:
            return out
    return out


def _out_of_sync(idir: Path, store: Store, gen: int) -> bool:
    return any(
        store.get_meta(f"gen.{name}") != str(gen) or not index_path(idir, name).exists() for name in wanted(store)
    )


def _wait_for_writer(idir: Path, store: Store, deadline: float) -> None:
    """Poll (cheap meta reads) until the derived files match the store, or no writer is left."""
    while time.monotonic() < deadline and IndexLock.writer_active(idir):
        time.sleep(0.05)
        if not _out_of_sync(idir, store, store.generation):
            return


def _persist_rebuilt(idir: Path, store: Store, gen: int, indexes: dict[str, Index]) -> None:
    """Save indexes a search rebuilt, when it can: saving spares the next search the
    rebuild, and nothing more. A search answers from the rebuilt indexes in memory
    whether or not they could be saved (a full disk, a read-only folder): it never fails
    for want of space."""
    try:
        _save_rebuilt(idir, store, gen, indexes)
    except (OSError, sqlite3.Error, CodeSearchError) as exc:
        log.debug("rebuilt indexes of %s not saved: %s", idir, exc)


def _save_rebuilt(idir: Path, store: Store, gen: int, indexes: dict[str, Index]) -> None:
    if not os.access(idir, os.W_OK):
        return
    if IndexLock.writer_active(idir):
        return  # the writer brings them up to date itself
    try:
        lock = IndexLock(idir).acquire(role="reader")
    except (IndexLockedError, OSError):
        return
    try:
        writer = Store(idir / STORE_FILE) if store.readonly else store
        try:
            if writer.generation != gen:
                return
            for name, index in indexes.items():
                _save_named(index, idir, name, store)
                writer.set_meta(f"gen.{name}", gen)
                if DERIVED[name].kind is None:
                    _drop_legacy(idir)
        finally:
            if writer is not store:
                writer.close()
    finally:
        lock.release()


def _legacy_notice(idir: Path, name: str, *, say: bool = True) -> bool:
    """Whether the lexical index of ``idir`` is of the older format (and so being rebuilt);
    said on stderr once per folder and process (``say``; a search says it in its answer's
    notices instead)."""
    if DERIVED[name].kind is not None or not (idir / LEGACY_FILES[0]).exists():
        return False
    if say and idir not in _LEGACY_SAID:
        _LEGACY_SAID.add(idir)
        log.warning("codesearch: the lexical index of %s is in an older format: rebuilding it in the new one (once)",
                    idir)
    return True


_LEGACY_SAID: set[Path] = set()


def _drop_legacy(idir: Path) -> None:
    for name in LEGACY_FILES:
        with contextlib.suppress(OSError):
            (idir / name).unlink()


def rebuild_lexical(idir: Path, store: Store) -> Index:
    """The lexical index made again from the store, after a query found a file of it
    damaged; saved (as `load_derived` saves what it rebuilds) when it can be."""
    path = idir / DERIVED["lexical"].filename
    index = _rebuild_index("lexical", store, path=path, in_place=False)
    _persist_rebuilt(idir, store, store.generation, {"lexical": index})
    return index
