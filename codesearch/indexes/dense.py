"""Single-vector index: FAISS inner-product search over store ids, with deletes, mapped from disk.

One vector per chunk (or per file), keyed by the store's int64 id, in three parts:

- a **base**, written once and memory-mapped when loaded. Up to ``exact_threshold``
  vectors it is a float32 matrix that every query scans in full (exact top-k: FAISS's
  kernel straight over the mapping, no copy); past it an IVF index
  (``IndexIVFScalarQuantizer``, float16, not by residual) whose inverted lists FAISS maps
  itself (``IO_FLAG_MMAP``): a query reads the cells it probes, nothing else;
- a **tail**: vectors added since the base was written, in memory, searched exactly;
- the **removed** ids of the base, which its searches skip (a FAISS ``IDSelector``).

A query searches base and tail and keeps the best ``k``. When the tail outgrows an eighth
of the base, or removals a quarter of it, both are folded into a new base (`_merge`); the
IVF cells are re-clustered when the index has grown 4x since they were trained, and the
index goes back to exact below half the threshold (the gap avoids flapping). An index run
that edits a few files so rewrites the tail and the removals, not the base.

A new IVF base (a build, a merge, a retrain) is made from a block of vectors at a time,
each list sized once to what it holds. The index registry's writer, which saves the index
to its folder, sets ``lists_dir`` to that folder: the lists are then written into a FAISS
file there as they are made, the base is mapped from it, and the save takes that file as
it is. An IVF base is read back (for a merge or a retrain) with ``pread``, not through its
mapping, whose pages would stay resident. Such a build holds a block, not
the lists (460 MB for 600k x 384); without ``lists_dir`` they are made in memory.

Why float16 lists: the store keeps vectors as float16, so the lists hold them exactly, in
half the bytes (460 MB for 600k x 384, against 920 MB in float32). Why IVF and not HNSW:
FAISS's HNSW cannot remove ids, and its graph is not mapped from disk. Recall is set by
``nprobe`` and measured against exact search in ``tests/indexes/test_dense.py`` and
``benchmarks/vectors_at_scale.py``.

On disk, a folder (`codesearch.indexes.folder`): ``manifest.json``, the base's sorted ids and
its matrix or FAISS file, the tail's ids and vectors, the removed ids. Opening reads the
manifest, the small arrays and the head of the FAISS file (quantizer and list sizes,
checked against a CRC in the manifest, so FAISS never parses damaged bytes): milliseconds,
whatever the index's size. The format before it (one file: a JSON header and
``faiss.serialize_index`` bytes) still loads, into memory; the next save writes the folder.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.indexes.folder import MANIFEST, Blob, Kept, Source, corrupt, read_folder, write_folder
from codesearch.indexes.threads import one_thread
from codesearch.types import JSONDict
from codesearch.workers import trim_heap

__all__ = ["EXACT_THRESHOLD", "CentroidIndex", "DenseIndex"]

#: Vector count past which the index switches from exact search to IVF. Exact search over
#: 50k x 768 float32 is ~40M multiply-adds per query (a few ms on 2 cores).
EXACT_THRESHOLD = 50_000

_WHAT = "Dense index"
_FORMAT_VERSION = 2
#: The format before folders (one file), still read.
_V1_MAGIC = b"CSDENSE\n"
#: The tail is folded into the base past max(_MIN_TAIL, base / 8) vectors: below it the
#: whole (small) index lives in the tail, a few MB rewritten per save.
_MIN_TAIL = 4096
_EMPTY_IDS = np.empty(0, dtype=np.int64)
_EMPTY_SCORES = np.empty(0, dtype=np.float32)
#: Searches of at most this many queries run on one thread (`codesearch.indexes.threads`).
SMALL_SEARCH_QUERIES = 8


#: Training points per IVF cell (a seeded sample), and the vectors added to the lists at a time.
_TRAIN_POINTS_PER_CELL = 64
_ADD_BLOCK = 65_536


@dataclass
class _Base:
    """The written part: sorted ids and, aligned with them, a float32 matrix (exact), or a
    FAISS IVF index (``lists``) with the file it is mapped from (None: built in memory)."""

    ids: np.ndarray
    vectors: np.ndarray | None = None
    lists: object | None = None
    file: Path | None = None
    head: JSONDict | None = None  # the FAISS file's head: bytes and CRC (see _write_lists)
    spilled: bool = False  # ``file`` was written by a build (`DenseIndex.lists_dir`), and no save has taken it
    source: Source | None = None  # the mapped matrix's file, to read rows with pread (`folder.Source`)

    @property
    def is_ivf(self) -> bool:
        return self.lists is not None

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` among the base's ids (-1 where absent)."""
        if not len(self.ids) or not len(ids):
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self.ids, ids).clip(0, len(self.ids) - 1)
        return np.where(self.ids[pos] == ids, pos, -1)


class DenseIndex:
    """FAISS inner-product index over int64 ids: exact when small, IVF when large, mapped
    from disk when loaded (see the module's notes).

    Parameters
    ----------
    dim : int
        Vector size. Vectors are expected L2-normalised, so scores are cosine similarities.
    exact_threshold : int
        Above this many vectors the index trains IVF and searches approximately;
        below ``exact_threshold // 2`` it goes back to exact search.
    nlist : int or None
        IVF cell count; ``None`` picks ``4 * sqrt(n)`` (FAISS's usual guideline), at
        least 16.
    nprobe : int or None
        Cells visited per query; ``None`` picks ``max(16, nlist // 8)``, which gave
        recall@10 >= 0.95 against exact search on clustered data (`benchmarks/dense_bench.py`).
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
        self._base = _Base(_EMPTY_IDS.copy(), np.empty((0, self._dim), np.float32))
        self._tail_ids = _EMPTY_IDS.copy()
        self._tail = np.empty((0, self._dim), np.float32)
        self._removed = _EMPTY_IDS.copy()  # sorted ids of the base that are gone
        self._skip = None  # FAISS selector of the removed ids (and what it holds on to)
        # Vector count the IVF cells were trained on; retrain when the index outgrows it 4x.
        self._trained_on = 0
        # Where the base is written already: (folder, its manifest entries), so a save to
        # the same folder keeps those files.
        self._written: tuple[Path, dict[str, JSONDict]] | None = None
        #: What the index registry knows the store's vectors by when it saved this index
        #: (kept in the manifest; `codesearch.indexes.registry`).
        self.store_mark: str | None = None
        #: Where an IVF base that a build, a retrain or a merge makes has its lists written
        #: as they are made, and is mapped from (the folder a writer saves the index to: the
        #: save then takes that file); None: they are made in memory. 600k x 384 float16
        #: lists are 460 MB (`_lists_in_file`).
        self.lists_dir: Path | None = None

    # -- properties ----------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Vector size."""
        return self._dim

    @property
    def kind(self) -> str:
        """``"exact"`` (flat inner product) or ``"ivf"`` (IVF, approximate)."""
        return "ivf" if self._base.is_ivf else "exact"

    #: A FAISS index never goes stale: adds and removes keep it exact (`Index.needs_rebuild`).
    needs_rebuild = False

    def __len__(self) -> int:
        return len(self._base.ids) - len(self._removed) + len(self._tail_ids)

    def ids(self) -> np.ndarray:
        """All ids in the index (int64, no particular order)."""
        base = np.setdiff1d(self._base.ids, self._removed, assume_unique=True) if len(self._removed) else self._base.ids
        return np.concatenate([base, self._tail_ids]).astype(np.int64, copy=False)

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
        self._drop(ids)  # upsert: FAISS would happily keep two vectors under one id
        self._tail_ids = np.concatenate([self._tail_ids, ids])
        self._tail = np.concatenate([self._tail, vectors])
        self._restructure()

    def remove(self, ids: np.ndarray) -> None:
        """Remove ``ids``; ids that are not in the index are ignored."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if not len(ids) or not len(self):
            return
        self._drop(ids)
        self._restructure()

    # -- search --------------------------------------------------------------------------

    def search(self, queries: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` ids and inner-product scores for each query row, best first.

        Returns one ``(ids int64, scores float32)`` pair per query; a pair holds fewer than
        ``k`` entries when the index has fewer vectors (empty for an empty index).
        """
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        queries = self._queries(queries)
        if not len(self):
            return [(_EMPTY_IDS.copy(), _EMPTY_SCORES.copy()) for _ in range(len(queries))]
        k_eff = min(k, len(self))
        small = len(queries) <= SMALL_SEARCH_QUERIES
        with one_thread() if small else contextlib.nullcontext():
            parts = [self._search_base(queries, k_eff), _knn(queries, self._tail, self._tail_ids, k_eff)]
        out = []
        for i in range(len(queries)):
            ids = np.concatenate([p[0][i] for p in parts if p is not None])
            scores = np.concatenate([p[1][i] for p in parts if p is not None])
            keep = ids >= 0  # FAISS pads with -1 where fewer than k were found
            ids, scores = ids[keep], scores[keep]
            order = np.lexsort((ids, -scores))[:k_eff]  # best first, ties by id
            out.append((ids[order].astype(np.int64), scores[order].astype(np.float32)))
        return out

    def _queries(self, queries: np.ndarray) -> np.ndarray:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.ndim != 2 or queries.shape[1] != self._dim:
            raise ValueError(f"queries must have shape (q, {self._dim}), got {queries.shape}")
        return queries

    def _search_base(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        base = self._base
        if len(base.ids) == len(self._removed):
            return None
        if not base.is_ivf:
            rows, scores = _knn(queries, base.vectors, None, k, self._selector(rows=True))
            return np.where(rows >= 0, base.ids[rows.clip(0)], -1), scores
        import faiss

        params = faiss.SearchParametersIVF()
        params.nprobe = self._nprobe()
        sel = self._selector(rows=False)
        if sel is not None:
            params.sel = sel
        scores, ids = base.lists.search(queries, k, params=params)
        return ids, scores

    def _selector(self, *, rows: bool):
        """FAISS selector that skips the removed base vectors (by row for the exact base,
        by id for IVF); None when none are removed. Kept until the removals change."""
        if not len(self._removed):
            return None
        if self._skip is None:
            import faiss

            skip = self._base.rows_of(self._removed) if rows else self._removed
            batch = faiss.IDSelectorBatch(np.ascontiguousarray(skip, dtype=np.int64))
            self._skip = (faiss.IDSelectorNot(batch), batch)  # the Not holds a bare pointer to batch
        return self._skip[0]

    # -- persistence ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to the folder ``path`` atomically (see `codesearch.indexes.folder`).
        The base's files are kept when they are in that folder already."""
        path = Path(path)
        if path.is_file():
            path.unlink()  # the one-file format before folders, at this name
        base = self._base
        header: JSONDict = {
            "format": _FORMAT_VERSION,
            "dim": self._dim,
            "kind": self.kind,
            "count": len(self),
            "exact_threshold": self.exact_threshold,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "seed": self.seed,
            "trained_on": self._trained_on,
            "store_mark": self.store_mark,
        }
        files: dict[str, object] = {}
        written = self._written
        if written is not None and written[0] == path.resolve() and all(
            (path / entry["file"]).is_file() for entry in written[1].values()
        ):
            files.update({name: Kept(entry) for name, entry in written[1].items()})
            header["lists"] = base.head
        else:
            files["base_ids"] = base.ids
            if base.is_ivf:
                head: JSONDict = {}
                header["lists"] = head
                files["base_lists"] = Blob("faiss", lambda file: head.update(self._write_base_lists(file)))
            else:
                files["base_vectors"] = base.vectors
        files |= {"tail_ids": self._tail_ids, "tail_vectors": self._tail, "removed": self._removed}
        entries = write_folder(path, header, files)
        base.head = header.get("lists")
        if base.is_ivf:  # (read back from the file this save names: an earlier one may be gone)
            base.file, base.spilled = path / entries["base_lists"]["file"], False
        self._written = (path.resolve(), {n: e for n, e in entries.items() if n.startswith("base_")})

    def _write_base_lists(self, file: Path) -> JSONDict:
        """Write the IVF base's FAISS file to ``file``: the file its lists were written to or
        mapped from (moved there from a build in the same folder, else copied), or FAISS's
        own write of lists that only memory holds."""
        base = self._base
        if base.file is None or base.head is None:
            return _write_lists(base.lists, file)
        if base.spilled and base.file.parent.resolve() == file.parent.resolve():
            with open(base.file, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(base.file, file)
            base.file = file  # (spilled still: no manifest names it until the save's is written)
            return dict(base.head)
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        try:
            shutil.copyfile(base.file, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, file)
        finally:
            tmp.unlink(missing_ok=True)
        if base.spilled:
            base.file.unlink(missing_ok=True)  # (its mapping stays readable)
        base.file = file
        return dict(base.head)

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = False) -> DenseIndex:
        """Open an index written by :meth:`save`: its base mapped, not read.

        ``verify`` checks every byte against the manifest's CRCs (an index from elsewhere);
        without it, the small files and the FAISS file's head are checked.

        Raises
        ------
        IndexCorruptError
            When the folder is missing, truncated, altered or not a dense index.
        """
        path = Path(path)
        if path.is_file():
            return cls._load_v1(path)
        if not (path / MANIFEST).is_file():
            raise corrupt(path, _WHAT, "not found" if not path.exists() else "no manifest")
        folder = read_folder(path, _WHAT, verify=verify)
        h, arrays = folder.header, folder.arrays
        try:
            if h.get("format") != _FORMAT_VERSION:
                raise corrupt(path, _WHAT, f"format {h.get('format')}, expected {_FORMAT_VERSION}")
            self = cls(int(h["dim"]), exact_threshold=int(h["exact_threshold"]), nlist=h["nlist"],
                       nprobe=h["nprobe"], seed=int(h["seed"]))
            dim = self._dim
            ids = _array(arrays, "base_ids", np.int64, 1)
            if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
                raise corrupt(path, _WHAT, "base ids are not sorted")
            if h["kind"] == "ivf":
                self._base = _Base(ids, lists=_read_lists(path, folder.blobs["base_lists"], h.get("lists"), dim,
                                                            len(ids)),
                                   file=folder.blobs["base_lists"], head=h["lists"])
            elif h["kind"] == "exact":
                vectors = _array(arrays, "base_vectors", np.float32, 2)
                if vectors.shape != (len(ids), dim):
                    raise corrupt(path, _WHAT, f"base vectors {vectors.shape} for {len(ids)} ids of dim {dim}")
                self._base = _Base(ids, vectors, source=folder.sources.get("base_vectors"))
            else:
                raise corrupt(path, _WHAT, f"unknown kind {h['kind']!r}")
            self._tail_ids = np.array(_array(arrays, "tail_ids", np.int64, 1))
            self._tail = np.array(_array(arrays, "tail_vectors", np.float32, 2))
            self._removed = np.array(_array(arrays, "removed", np.int64, 1))
            self._trained_on = int(h["trained_on"])
            self.store_mark = h.get("store_mark") if isinstance(h.get("store_mark"), str) else None
        except IndexCorruptError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise corrupt(path, _WHAT, f"header: {type(exc).__name__}: {str(exc)[:120]}") from exc
        if self._tail.shape != (len(self._tail_ids), dim) or len(np.unique(self._tail_ids)) != len(self._tail_ids):
            raise corrupt(path, _WHAT, "tail ids and vectors do not match")
        removed = self._removed
        if len(removed) and (np.any(removed[1:] <= removed[:-1]) or np.any(self._base.rows_of(removed) < 0)):
            raise corrupt(path, _WHAT, "removed ids are not base ids")
        alive_in_base = self._base.rows_of(self._tail_ids) >= 0
        if alive_in_base.any() and not np.isin(self._tail_ids[alive_in_base], removed).all():
            raise corrupt(path, _WHAT, "an id is both in the base and the tail")
        if len(self) != h["count"]:
            raise corrupt(path, _WHAT, f"{len(self)} vectors, the manifest says {h['count']}")
        self._written = (path.resolve(), {n: e for n, e in folder.entries.items() if n.startswith("base_")})
        return self

    @classmethod
    def _load_v1(cls, path: Path) -> DenseIndex:
        """Read the one-file format before folders (into memory); the next save writes a folder."""
        import faiss

        try:
            data = path.read_bytes()
        except OSError as exc:
            raise corrupt(path, _WHAT, exc.strerror or type(exc).__name__) from exc
        if not data.startswith(_V1_MAGIC) or len(data) < len(_V1_MAGIC) + 4:
            raise corrupt(path, _WHAT, "not a codesearch dense index")
        start = len(_V1_MAGIC) + 4
        head_len = int.from_bytes(data[len(_V1_MAGIC) : start], "little")
        try:
            header = json.loads(data[start : start + head_len])
            payload = memoryview(data)[start + head_len :]
            if header["format"] != 1:
                raise corrupt(path, _WHAT, f"format {header['format']}, expected 1")
            if len(payload) != header["payload_bytes"] or zlib.crc32(payload) != header["crc32"]:
                raise corrupt(path, _WHAT, "truncated or altered")
            old = faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
            self = cls(int(header["dim"]), exact_threshold=header["exact_threshold"], nlist=header["nlist"],
                       nprobe=header["nprobe"], seed=header["seed"])
            if old.d != self._dim or old.ntotal != header["count"]:
                raise corrupt(path, _WHAT, "header does not match the stored index")
            if isinstance(old, faiss.IndexIVF):
                ids = _ivf_ids(old)
                vectors = old.reconstruct_batch(ids)
            else:
                ids = faiss.vector_to_array(old.id_map).astype(np.int64)
                vectors = old.index.reconstruct_n(0, len(ids))
        except IndexCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError, RuntimeError) as exc:
            raise corrupt(path, _WHAT, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}") from exc
        if len(ids):
            self.add(ids, vectors)
        return self

    # -- internals -----------------------------------------------------------------------

    def _drop(self, ids: np.ndarray) -> None:
        """Remove ``ids`` from the tail and mark those of the base removed (no restructuring)."""
        if len(self._tail_ids):
            keep = ~np.isin(self._tail_ids, ids)
            if not keep.all():
                self._tail_ids, self._tail = self._tail_ids[keep], self._tail[keep]
        in_base = ids[self._base.rows_of(ids) >= 0]
        if len(in_base):
            removed = np.union1d(self._removed, in_base)
            if len(removed) != len(self._removed):
                self._removed, self._skip = removed, None

    def _restructure(self) -> None:
        """Retrain, switch kind or fold the tail into the base where the sizes call for it."""
        n, base_n = len(self), len(self._base.ids)
        if not self._base.is_ivf and n > self.exact_threshold:
            self._rebuild(ivf=True)
        elif self._base.is_ivf and n > 4 * self._trained_on:
            # The cells were sized for a quarter of the data; lists grow long and probing
            # slows down, so re-cluster at the new size.
            self._rebuild(ivf=True)
        elif self._base.is_ivf and n < self.exact_threshold // 2:
            self._rebuild(ivf=False)
        elif len(self._tail_ids) > max(_MIN_TAIL, base_n // 8) or len(self._removed) > base_n // 4:
            self._merge()

    def _rebuild(self, *, ivf: bool) -> None:
        if ivf:
            # From the lists and the tail a block at a time, in float16 as the lists hold
            # them (600k x 384 retrained in 2.8 GB as float32 copies of every vector; in 0.9
            # GB as one float16 copy and the new lists; in one block and the lists now, or
            # one block alone where the lists go to a file). A first add of everything at
            # once is trained from the tail as it is.
            base = self._make_ivf(self._live_blocks(), len(self))
            if base is None:  # (its lists' file read back short; the registry rebuilds from the store)
                raise ValueError("the dense index's lists could not be read back whole")
            self._set_base(base)
            self._trained_on = len(base.ids)
        else:
            self._set_base(self._exact_base())
            self._trained_on = 0

    def _merge(self) -> None:
        """A new base of the base's live vectors and the tail's (no retraining): each list's
        live entries, then the tail's in its order (as FAISS's remove and add leave them)."""
        base = self._base
        if not base.is_ivf:
            self._rebuild(ivf=False)
            return
        index, removed, tail = base.lists, self._removed, self._tail
        sizes = np.zeros(index.nlist, dtype=np.int64)
        for cells, ids, _ in _base_entries(base, removed, codes=False):
            if len(ids):
                sizes[cells[0]] = len(ids)
        blocks = [slice(start, start + _ADD_BLOCK) for start in range(0, len(tail), _ADD_BLOCK)]
        cells = np.concatenate([_cells(index, tail[b]) for b in blocks]) if blocks else _EMPTY_IDS
        sizes += np.bincount(cells, minlength=index.nlist)
        entries = itertools.chain(_base_entries(base, removed), [(cells, self._tail_ids, _codes(index, tail))])
        alive = np.setdiff1d(base.ids, removed, assume_unique=True)
        self._set_base(self._lists_base(index, np.union1d(alive, self._tail_ids), sizes, entries))

    def _exact_base(self) -> _Base:
        """An exact base of every live vector, by id, its matrix written once: an exact base
        and the tail are copied into their places a block at a time (the per-file means of
        114k files are 170 MB as float32, which a sorted copy of their copy held three times)."""
        base = self._base
        if base.is_ivf or not len(base.ids):  # (back to exact from IVF: below half the threshold)
            ids, vectors = self._all_vectors()
            order = np.argsort(ids)
            return _Base(ids[order], vectors[order])
        alive = np.setdiff1d(base.ids, self._removed, assume_unique=True)
        ids = np.concatenate([alive, self._tail_ids])
        order = np.argsort(ids, kind="stable")
        place = np.empty(len(ids), dtype=np.int64)
        place[order] = np.arange(len(ids))  # where each live row, then each tail row, goes
        out = np.empty((len(ids), self._dim), dtype=np.float32)
        at = 0
        for _, rows in self._exact_rows():
            out[place[at : at + len(rows)]] = rows
            at += len(rows)
        out[place[at:]] = self._tail
        return _Base(ids[order], out)

    def _exact_rows(self) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """The exact base's live (ids, float32 rows), a block at a time, in id order; read
        with ``pread`` where the matrix has a source (through the mapping its pages would
        stay resident)."""
        base = self._base
        keep = np.ones(len(base.ids), dtype=bool)
        keep[base.rows_of(self._removed)] = False
        for start in range(0, len(base.ids), _ADD_BLOCK):
            part = slice(start, start + _ADD_BLOCK)
            block = base.vectors[part]
            if base.source is not None:
                block = base.source.read(np.empty(block.shape, np.float32), start * self._dim * 4)
            yield base.ids[part][keep[part]], block[keep[part]]

    def _live_blocks(self) -> Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]:
        """A read of every live (ids, vectors) of the index, a block at a time, in the order
        of the base's lists (or matrix), then the tail's; float16 where the base holds any."""
        base, removed, dim = self._base, self._removed, self._dim

        def read() -> Iterable[tuple[np.ndarray, np.ndarray]]:
            if base.is_ivf:
                parts: list[tuple[np.ndarray, np.ndarray]] = []
                held = 0
                for _, ids, codes in _base_entries(base, removed):
                    parts.append((ids, codes))
                    held += len(ids)
                    if held >= _ADD_BLOCK:
                        yield _joined(parts, dim)
                        parts, held = [], 0
                if parts:
                    yield _joined(parts, dim)
            elif len(base.ids):
                for ids, rows in self._exact_rows():
                    yield ids, rows.astype(np.float16)
            tail = self._tail if not len(base.ids) else None
            for start in range(0, len(self._tail_ids), _ADD_BLOCK):
                part = slice(start, start + _ADD_BLOCK)
                vectors = self._tail[part] if tail is not None else self._tail[part].astype(np.float16)
                yield self._tail_ids[part], vectors

        return read

    def _make_ivf(self, read: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]], count: int) -> _Base | None:
        """An IVF base of the ``count`` vectors that ``read()`` yields as (ids, vectors) blocks
        (any float dtype), the same on every call, from three reads: the training sample,
        each vector's cell (the lists' sizes), then the lists' entries. It holds one block
        and the lists (or only the block, with `lists_dir`), never every vector at once.
        None where the reads do not agree with each other or with ``count``."""
        index, rows = self._untrained(count)
        sample = np.empty((len(rows), self._dim), dtype=np.float32)
        at = 0
        for ids, vectors in read():
            lo, hi = np.searchsorted(rows, [at, at + len(ids)])
            sample[lo:hi] = vectors[rows[lo:hi] - at]
            at += len(ids)
        if at != count:
            return None
        index.train(sample)
        del sample
        cells, seen = [], []
        for ids, vectors in read():
            cells.append(_cells(index, np.ascontiguousarray(vectors, dtype=np.float32)))
            seen.append(np.asarray(ids, dtype=np.int64))
        all_ids = np.concatenate(seen) if seen else _EMPTY_IDS
        if len(all_ids) != count:
            return None
        sizes = np.bincount(np.concatenate(cells), minlength=index.nlist) if cells else np.zeros(index.nlist, np.int64)

        def entries() -> Iterable[_Entries]:
            for (ids, vectors), block_cells, want in zip(read(), cells, seen, strict=True):
                if not np.array_equal(ids, want):
                    raise ValueError("the vectors changed between two reads")
                yield block_cells, want, _codes(index, np.ascontiguousarray(vectors, dtype=np.float32))

        try:
            return self._lists_base(index, np.sort(all_ids), sizes, entries())
        except ValueError:  # (the reads disagreed)
            return None

    def _lists_base(self, index, ids: np.ndarray, sizes: np.ndarray, entries: Iterable[_Entries]) -> _Base:
        """The IVF base of the sorted ``ids`` whose lists, of the cells of ``index``, hold
        ``sizes`` entries from ``entries``: written into a file of `lists_dir` and mapped
        from it, or in ``index``'s own lists when there is none (or FAISS writes in a form
        this does not know)."""
        folder = self.lists_dir
        head = _head_bytes(index, sizes) if folder is not None and not folder.is_file() else None
        if folder is None or head is None:
            _lists_in_memory(index, sizes, entries)
            return _Base(ids, lists=index)
        folder.mkdir(parents=True, exist_ok=True)
        # (Named as no manifest names a file, so it never meets one; a save renames it.)
        file = folder / f"lists-being-built.{os.urandom(4).hex()}.faiss"
        written = _lists_in_file(head, int(index.code_size), sizes, entries, file)
        return _Base(ids, lists=_read_lists(folder, file, written, self._dim, len(ids)), file=file, head=written,
                     spilled=True)

    def _set_base(self, base: _Base) -> None:
        old, self._base = self._base, base
        if old.spilled and old.file is not None and old.file != base.file:
            old.file.unlink(missing_ok=True)  # (a base no save took; its mapping stays readable)
        self._tail_ids, self._tail = _EMPTY_IDS.copy(), np.empty((0, self._dim), np.float32)
        self._removed, self._skip = _EMPTY_IDS.copy(), None
        self._written = None

    def _nprobe(self) -> int:
        nlist = self._base.lists.nlist
        return min(nlist, self.nprobe or max(16, nlist // 8))

    def _all_vectors(self, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Every live (id, vector): the base's (read back from its matrix or lists) and the
        tail's, written once into one array of ``dtype``."""
        base = self._base
        if not len(base.ids) and dtype == np.float32:
            return self._tail_ids, self._tail  # (no copy: a first add of everything at once)
        n_base = len(base.ids) - len(self._removed)
        ids = np.empty(n_base + len(self._tail_ids), dtype=np.int64)
        out = np.empty((len(ids), self._dim), dtype=dtype)
        if base.is_ivf:
            _ivf_contents_into(_base_entries(base, self._removed), ids[:n_base], out[:n_base])
        elif n_base:
            keep = np.ones(len(base.ids), dtype=bool)
            keep[base.rows_of(self._removed)] = False
            ids[:n_base], out[:n_base] = base.ids[keep], base.vectors[keep]
        ids[n_base:], out[n_base:] = self._tail_ids, self._tail
        return ids, out

    def _untrained(self, n: int):
        """An empty IVF index for ``n`` vectors, and the rows of the seeded sample it is to
        be trained on (sorted)."""
        import faiss

        nlist = self.nlist or max(16, int(4 * math.sqrt(n)))
        nlist = min(nlist, max(1, n // 39))  # FAISS wants >= 39 training points per cell
        quantizer = faiss.IndexFlatIP(self._dim)
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, self._dim, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT, False
        )
        quantizer.this.disown()  # the IVF index owns (and frees) its quantizer
        index.own_fields = True
        index.cp.seed = self.seed
        # 64 points per cell is plenty for cell boundaries and keeps training at a few
        # seconds for 1M vectors; the sample is drawn here (seeded), so only it is float32.
        sample = min(n, _TRAIN_POINTS_PER_CELL * nlist)
        rng = np.random.default_rng(self.seed)
        rows = np.sort(rng.choice(n, sample, replace=False)) if sample < n else np.arange(n)
        index.cp.max_points_per_centroid = _TRAIN_POINTS_PER_CELL
        index.cp.niter = 10  # cell boundaries settle early; FAISS's 25 triples training time
        return index, rows

    def fill(self, read: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]], count: int) -> bool:
        """Fill this empty index with the ``count`` vectors that ``read()`` yields as (ids,
        vectors) blocks, the same on every call (an index run's sync, from the store).

        Past ``exact_threshold`` the IVF base is built from three reads: the training sample,
        then each vector's cell (the lists' sizes), then the lists' entries; it holds the
        lists, their ids and one block, never every vector at once (600k x 384 added by
        batches held 1.0 GB at its peak; the one add of them all, their float32 copy).
        Returns False, and leaves the index empty, where the reads do not agree with each
        other or with ``count`` (the caller then adds the blocks as they come)."""
        if len(self):
            raise ValueError("fill() needs an empty index")
        if count <= self.exact_threshold:
            for ids, vectors in read():
                self.add(ids, vectors)
            return True
        base = self._make_ivf(read, count)
        if base is None:
            return False
        self._set_base(base)
        self._trained_on = count
        return True


class CentroidIndex(DenseIndex):
    """One vector per file: the normalised mean of its chunks' vectors, for a model whose
    whole-file vector reads too little of a file (see `codesearch.indexes.registry`).

    Always exact, and scored whole: :meth:`scores` gives every file's cosine with a query,
    which the ranker normalises over all files.
    """

    def __init__(self, dim: int, **kw) -> None:
        kw.setdefault("exact_threshold", 2**62)
        super().__init__(dim, **kw)

    def scores(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, scores)`` of every vector for one query (in no particular order)."""
        q = self._queries(query)[0]
        base = self._base
        assert not base.is_ivf, "a centroid index stays exact"
        keep = np.ones(len(base.ids), dtype=bool)
        keep[base.rows_of(self._removed)] = False
        with one_thread():
            base_scores = base.vectors @ q if len(base.ids) else _EMPTY_SCORES
            tail_scores = self._tail @ q
        ids = np.concatenate([base.ids[keep], self._tail_ids])
        return ids, np.concatenate([base_scores[keep], tail_scores]).astype(np.float32, copy=False)


def _array(arrays: dict[str, np.ndarray], name: str, dtype: type, ndim: int) -> np.ndarray:
    a = arrays[name]
    if a.dtype != dtype or a.ndim != ndim:
        raise ValueError(f"{name} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)} of {ndim} dims")
    return a


def _knn(queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray | None, k: int, sel=None):
    """Exact top-``k`` of ``queries`` over the rows of ``vectors`` (float32, C order, mapped
    or not): ``(ids or rows, scores)``, -1 where fewer than ``k`` rows were found; None when
    ``vectors`` is empty."""
    import faiss

    if not len(vectors):
        return None
    k = min(k, len(vectors))
    scores = np.empty((len(queries), k), dtype=np.float32)
    rows = np.empty((len(queries), k), dtype=np.int64)
    args = [faiss.swig_ptr(queries), faiss.swig_ptr(np.ascontiguousarray(vectors)), queries.shape[1], len(queries),
            len(vectors), k, faiss.swig_ptr(scores), faiss.swig_ptr(rows)]
    faiss.knn_inner_product(*args, sel) if sel is not None else faiss.knn_inner_product(*args)
    if ids is None:
        return rows, scores
    return np.where(rows >= 0, ids[rows.clip(0)], -1), scores


def _write_lists(index, file: Path) -> JSONDict:
    """Write the FAISS IVF ``index`` to ``file`` (fsynced); returns its head's size and CRC:
    everything before the inverted lists' codes and ids, which sit at the end of the file."""
    import faiss

    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    try:
        faiss.write_index(index, str(tmp))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        size = tmp.stat().st_size
        head = size - int(index.ntotal) * (int(index.code_size) + 8)
        with open(tmp, "rb") as fh:
            crc = zlib.crc32(fh.read(head))
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
    return {"head_bytes": head, "head_crc32": crc, "nlist": int(index.nlist)}


def _read_lists(folder: Path, file: Path, head: object, dim: int, count: int):
    """The IVF index in ``file``, its lists mapped (``IO_FLAG_MMAP``), after checking its head
    against the manifest: FAISS parses only bytes that were written as they are."""
    import faiss

    if not isinstance(head, dict):
        raise corrupt(folder, _WHAT, "no head recorded for the IVF lists")
    size = file.stat().st_size
    head_bytes = int(head["head_bytes"])
    if not 0 < head_bytes <= size or size - head_bytes != count * (2 * dim + 8):
        raise corrupt(folder, _WHAT, f"{file.name} has {size} bytes for {count} vectors")
    with open(file, "rb") as fh:
        if zlib.crc32(fh.read(head_bytes)) != int(head["head_crc32"]):
            raise corrupt(folder, _WHAT, f"{file.name} fails its checksum")
    try:
        index = faiss.read_index(str(file), faiss.IO_FLAG_MMAP)
    except RuntimeError as exc:
        raise corrupt(folder, _WHAT, f"{file.name}: {str(exc).splitlines()[0][:120]}") from exc
    ok = (
        isinstance(index, faiss.IndexIVFScalarQuantizer)
        and index.d == dim
        and index.ntotal == count
        and index.nlist == int(head["nlist"])
        and index.metric_type == faiss.METRIC_INNER_PRODUCT
        and index.sq.qtype == faiss.ScalarQuantizer.QT_fp16
        and not index.by_residual
    )
    if not ok:
        raise corrupt(folder, _WHAT, f"{file.name} is not the IVF index the manifest describes")
    return index


def _ivf_ids(index) -> np.ndarray:
    """Every id in a FAISS IVF index's lists."""
    return _ivf_contents(index, None)[0]


def _ivf_contents(index, dim: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Every (id, vector) of a FAISS IVF index, read from its lists (float16 codes decoded to
    float32); ids only when ``dim`` is None."""
    n = int(index.ntotal)
    ids = np.empty(n, dtype=np.int64)
    if dim is None:
        _ivf_contents_into(_list_entries(index, _EMPTY_IDS, codes=False), ids, None)
        return ids, None
    vectors = np.empty((n, dim), dtype=np.float16)
    _ivf_contents_into(_list_entries(index, _EMPTY_IDS), ids, vectors)
    return ids, vectors.astype(np.float32)


def _ivf_contents_into(entries: Iterable[_Entries], ids: np.ndarray, vectors: np.ndarray | None) -> None:
    """Write the (id, vector) of each of an IVF index's list ``entries`` (`_list_entries`)
    into ``ids`` and ``vectors`` (sized for exactly those; any float dtype), a list at a
    time: no copy of all the codes is ever made."""
    at = 0
    for _, cell_ids, codes in entries:
        n = len(cell_ids)
        if at + n > len(ids):
            raise ValueError("the IVF lists hold more vectors than the index counts")
        ids[at : at + n] = cell_ids
        if vectors is not None:
            vectors[at : at + n] = codes.view(np.float16).reshape(n, vectors.shape[1])
        at += n
    if at != len(ids):
        raise ValueError("the IVF lists hold fewer vectors than the index counts")


# -- inverted lists of exactly their size, in memory or written to a file as they are made ------
#
# FAISS grows a list as a `std::vector` does: an add past its capacity doubles it, and an add
# of a block touches nearly every list (65,536 vectors over ~3,000 cells), so lists built or
# merged by `add_with_ids` held up to twice their entries. Here every list's size is known
# first and its entries are placed at their positions (`_runs`): in lists sized once
# (`_lists_in_memory`), or written straight into the FAISS file the base is then mapped from
# (`_lists_in_file`), so a build or a merge holds one block of entries, not the lists. The
# entries and their order are those `add_with_ids` gives (a block's vectors assigned by the
# quantizer as its add does, in the order they come), and the file is the one
# ``faiss.write_index`` writes for those lists, byte for byte (tests/indexes/test_dense.py).

#: One block of list entries: each entry's cell, id and code (``(n, code_size)`` uint8).
_Entries = tuple[np.ndarray, np.ndarray, np.ndarray]


def _cells(index, vectors: np.ndarray) -> np.ndarray:
    """The IVF cell of each row of ``vectors`` (float32), as ``add_with_ids`` assigns them."""
    _, cells = index.quantizer.search(vectors, 1)
    return cells[:, 0]


def _codes(index, vectors: np.ndarray) -> np.ndarray:
    """The lists' codes of the rows of ``vectors`` (float32): the scalar quantizer's."""
    if not len(vectors):
        return np.empty((0, index.code_size), dtype=np.uint8)
    return np.ascontiguousarray(index.sq.compute_codes(vectors))


def _by_cell(cells: np.ndarray, nlist: int) -> tuple[np.ndarray, np.ndarray]:
    """The stable order of rows by cell, and where each cell's rows start in it (nlist + 1)."""
    order = np.argsort(cells, kind="stable")
    return order, np.searchsorted(cells[order], np.arange(nlist + 1))


def _runs(sizes: np.ndarray, blocks: Iterable[_Entries]) -> Iterable[tuple[int, int, np.ndarray, np.ndarray]]:
    """``(cell, position in its list, ids, codes)`` for each cell's run of entries in each of
    ``blocks``, in the order they come; ValueError where the blocks do not fill lists of
    exactly ``sizes``."""
    nlist = len(sizes)
    at = np.zeros(nlist, dtype=np.int64)
    for cells, ids, codes in blocks:
        if not len(ids):
            continue
        order, starts = _by_cell(cells, nlist)
        ids, codes = np.ascontiguousarray(ids[order], dtype=np.int64), np.ascontiguousarray(codes[order])
        for cell in np.flatnonzero(np.diff(starts)).tolist():
            lo, hi = int(starts[cell]), int(starts[cell + 1])
            if at[cell] + hi - lo > sizes[cell]:
                raise ValueError("more entries than their lists were sized for (the vectors changed between reads)")
            yield cell, int(at[cell]), ids[lo:hi], codes[lo:hi]
            at[cell] += hi - lo
    if not np.array_equal(at, sizes):
        raise ValueError("fewer entries than their lists were sized for (the vectors changed between reads)")


def _lists_in_memory(index, sizes: np.ndarray, blocks: Iterable[_Entries]) -> None:
    """Give the trained IVF ``index`` new lists of exactly ``sizes`` entries, from ``blocks``
    (read to the end before the old lists are freed: they may come from them)."""
    import faiss

    lists = faiss.ArrayInvertedLists(len(sizes), index.code_size)
    for cell in np.flatnonzero(sizes).tolist():
        lists.resize(cell, int(sizes[cell]))  # (from empty: the capacity is the size)
    for cell, at, ids, codes in _runs(sizes, blocks):
        lists.update_entries(cell, at, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(codes))
    _replace_lists(index, lists, int(sizes.sum()))
    trim_heap()


def _lists_in_file(head: bytes, code_size: int, sizes: np.ndarray, blocks: Iterable[_Entries], file: Path) -> JSONDict:
    """Write to ``file`` a FAISS file of ``head`` (`_head_bytes`) and lists of exactly ``sizes``
    entries (of ``code_size`` bytes) from ``blocks``, each run of entries written at its
    place (the file is not mapped while it is written: nothing of it becomes resident in
    this process). Returns its head's size and CRC, as `_write_lists` does; ValueError where
    the blocks do not fill the lists (then no file is left)."""
    starts = len(head) + np.concatenate(([0], np.cumsum(sizes * (code_size + 8))[:-1]))
    fh = open(file, "xb")  # (before the try: a name that exists is not this build's to remove)
    try:
        with fh:
            fh.write(head)
            fh.truncate(len(head) + int(sizes.sum()) * (code_size + 8))
            fd = fh.fileno()
            for cell, at, ids, codes in _runs(sizes, blocks):
                start = int(starts[cell])
                _pwrite(fd, codes, start + at * code_size)
                _pwrite(fd, ids, start + int(sizes[cell]) * code_size + at * 8)
    except BaseException:
        file.unlink(missing_ok=True)
        raise
    return {"head_bytes": len(head), "head_crc32": zlib.crc32(head), "nlist": len(sizes)}


def _pwrite(fd: int, array: np.ndarray, offset: int) -> None:
    data = memoryview(array).cast("B")
    while len(data):
        done = os.pwrite(fd, data, offset)
        if not done:
            raise OSError("no byte of the IVF lists could be written")
        data, offset = data[done:], offset + done


def _head_bytes(index, sizes: np.ndarray) -> bytes | None:
    """What ``faiss.write_index`` writes before the entries of the lists of ``index`` when
    they hold ``sizes`` entries: FAISS's own bytes for the index with empty lists, whose last
    field (the list sizes: none) is replaced by ``sizes`` as FAISS writes them (``full``
    where more than half the lists hold entries, else ``sprs``: (cell, size) pairs). None
    where FAISS ends that index in another form than this knows (the lists are then made in
    memory and FAISS writes them)."""
    import faiss

    empty = _empty_copy(index)
    empty.ntotal = int(sizes.sum())
    data = faiss.serialize_index(empty).tobytes()
    u64 = np.dtype("<u8")
    lists = b"ilar" + np.array([len(sizes), index.code_size], u64).tobytes()
    none = b"sprs" + np.zeros(1, u64).tobytes()
    if not data.endswith(lists + none):
        return None
    nonzero = np.flatnonzero(sizes)
    if len(nonzero) > len(sizes) // 2:
        section = b"full" + np.array([len(sizes)], u64).tobytes() + sizes.astype(u64).tobytes()
    else:
        pairs = np.stack([nonzero, sizes[nonzero]], axis=1).reshape(-1)
        section = b"sprs" + np.array([len(pairs)], u64).tobytes() + pairs.astype(u64).tobytes()
    return data[: len(data) - len(none)] + section


def _empty_copy(index):
    """A trained IVF index of ``index``'s cells (its quantizer copied) with empty lists."""
    import faiss

    quantizer = faiss.clone_index(index.quantizer)
    empty = faiss.IndexIVFScalarQuantizer(
        quantizer, index.d, index.nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT, False
    )
    quantizer.this.disown()
    empty.own_fields = True
    empty.is_trained = True
    return empty


def _list_entries(index, removed: np.ndarray, *, file: Path | None = None, head: JSONDict | None = None,
                  codes: bool = True) -> Iterable[_Entries]:
    """The entries of the IVF ``index``'s lists but the ``removed`` ids, a list at a time, in
    cell order; read with ``pread`` from the ``file`` it was mapped from (of ``head``) where
    given, since a read through the mapping would make its pages resident here; copied
    from its lists otherwise. Without ``codes``, their ids only (the codes None)."""
    import faiss

    invlists = index.invlists
    code_size = int(index.code_size)
    with open(file, "rb") if file is not None and head else contextlib.nullcontext() as fh:
        at = int(head["head_bytes"]) if fh is not None and head else 0
        for cell in range(invlists.nlist):
            size = invlists.list_size(cell)
            if not size:
                continue
            ids, entries = np.empty(size, dtype=np.int64), None
            if fh is not None:
                _pread(fh, ids, at + size * code_size)
                if codes:
                    entries = _pread(fh, np.empty((size, code_size), dtype=np.uint8), at)
                at += size * (code_size + 8)
            else:
                ids[:] = faiss.rev_swig_ptr(invlists.get_ids(cell), size)
                if codes:
                    entries = faiss.rev_swig_ptr(invlists.get_codes(cell), size * code_size).reshape(size, -1).copy()
            if len(removed):
                keep = ~_among(ids, removed)
                ids, entries = ids[keep], None if entries is None else entries[keep]
            yield np.full(len(ids), cell, dtype=np.int64), ids, entries


def _among(ids: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` are in the sorted, non-empty ``sorted_ids`` (a list's ids against the
    removed ones: a binary search each, where `np.isin` would sort the removed ids again for
    every list)."""
    at = np.searchsorted(sorted_ids, ids).clip(0, len(sorted_ids) - 1)
    return sorted_ids[at] == ids


def _base_entries(base: _Base, removed: np.ndarray, *, codes: bool = True) -> Iterable[_Entries]:
    """`_list_entries` of an IVF base, from its file where it has one."""
    return _list_entries(base.lists, removed, file=base.file, head=base.head, codes=codes)


def _joined(parts: list[tuple[np.ndarray, np.ndarray]], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float16 vectors) of list entries read in ``parts`` (ids, codes)."""
    ids = np.concatenate([i for i, _ in parts])
    return ids, np.concatenate([c for _, c in parts]).view(np.float16).reshape(len(ids), dim)


def _pread(fh, out: np.ndarray, offset: int) -> np.ndarray:
    if os.preadv(fh.fileno(), [out], offset) != out.nbytes:
        raise ValueError(f"{Path(fh.name).name} is shorter than its lists")
    return out


def _replace_lists(index, lists, total: int) -> None:
    """Make ``lists`` (holding ``total`` entries) the lists of ``index``, which owns them."""
    index.replace_invlists(lists, True)
    lists.this.disown()
    index.ntotal = total
