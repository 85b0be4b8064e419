"""A `PlaidIndex` on disk: a folder of ``.npy`` arrays named by a manifest
(`codesearch.indexes.folder`), opened memory-mapped.

The base's documents (ids, token counts), token payload (centroid ids and packed residuals,
or float16 vectors while exact) and inverted lists (centroid -> documents, made when the
base is written), the codec, then the tail's documents and tokens and the removed
documents' positions. Opening reads the manifest, the documents' tables and the codec; the
token arrays and inverted lists stay on disk until a query reads the probed lists and its
candidates' tokens. A save after an index run that changed a few files writes the tail,
not the base.

The format before it (one ``index.npz``, read whole) still loads; the next save replaces it.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.indexes.folder import MANIFEST, Kept, Source, corrupt, read_folder, write_folder
from codesearch.indexes.plaid.codec import ResidualCodec
from codesearch.indexes.plaid.maxsim import _segment_starts
from codesearch.indexes.plaid.tokens import Tokens
from codesearch.store.arrays import check_finite, check_ids, read_npz
from codesearch.types import JSONDict

__all__ = ["PlaidFiles", "read_codec"]

_P = TypeVar("_P", bound="PlaidFiles")

_WHAT = "Multi-vector index"
_FORMAT_VERSION = 2
_V1_FILE = "index.npz"  # the one-file format before folders
#: The base's files, kept as they are by a save while the base is unchanged.
_BASE = ("ids", "doclens", "codes", "residuals", "ivf_offsets", "ivf_docs", "centroids", "cutoffs", "weights",
         "vectors")


class PlaidFiles:
    """Save and load for `PlaidIndex` (a base class of it)."""

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to the folder ``path`` atomically; the base's files are kept when
        the base is in that folder already."""
        folder = Path(path)
        if folder.is_file():
            folder.unlink()  # a one-file index of the format before folders, at this name
        if self._dead_tokens * 4 > self._payload_len():
            self._compact()
        nb = self._base_docs
        payload = self._codes if self._codec is not None else self._vectors
        files: dict[str, object] = {}
        written = self._written
        if written is not None and written[0] == folder.resolve() and all(
            (folder / e["file"]).is_file() for e in written[1].values()
        ):
            files.update({name: Kept(entry) for name, entry in written[1].items()})
        else:
            files |= {"ids": self._ids[:nb], "doclens": self._doclens[:nb]}
            if self._codec is not None:
                offsets, docs = self._inverted_lists()[0]
                files |= {
                    "codes": self._codes.base,
                    "residuals": self._residuals.base,
                    "ivf_offsets": offsets,
                    "ivf_docs": docs,
                    "centroids": self._codec.centroids,
                    "cutoffs": self._codec.cutoffs,
                    "weights": self._codec.weights,
                }
            elif payload is not None:
                files["vectors"] = payload.base
        files |= {"tail_ids": self._ids[nb:], "tail_doclens": self._doclens[nb:],
                  "removed": np.flatnonzero(~self._alive).astype(np.int64)}
        if self._codec is not None:
            files |= {"tail_codes": self._codes.tail, "tail_residuals": self._residuals.tail}
        elif payload is not None:
            files["tail_vectors"] = payload.tail
        header = {
            "format": _FORMAT_VERSION,
            "kind": self.kind,
            "dim": self._dim,
            "n_docs": len(self._ids),
            "n_tokens": int(self._doclens.sum()),
            "params": self._params(),
            "build_error": self._build_error,
            "added_error_sum": self._added_error_sum,
            "added_tokens": self._added_tokens,
            "store_mark": self.store_mark,
        }
        entries = write_folder(folder, header, files)
        self._written = (folder.resolve(), {n: e for n, e in entries.items() if n in _BASE})

    @classmethod
    def load(cls: type[_P], path: str | os.PathLike, *, verify: bool = False) -> _P:
        """Open an index written by :meth:`save`: its token arrays and inverted lists mapped,
        not read. ``verify`` checks every byte against the manifest's CRCs.

        Raises
        ------
        IndexCorruptError
            When the folder is missing, truncated, altered or inconsistent.
        """
        folder = Path(path)
        if folder.is_file() or ((folder / _V1_FILE).is_file() and not (folder / MANIFEST).is_file()):
            return cls._load_v1(folder if folder.is_file() else folder / _V1_FILE)
        if not (folder / MANIFEST).is_file():
            raise corrupt(folder, _WHAT, "not found" if not folder.exists() else "no manifest")
        opened = read_folder(folder, _WHAT, verify=verify)
        try:
            self = cls._from_arrays(folder, opened.header, opened.arrays, opened.sources)
        except IndexCorruptError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise corrupt(folder, _WHAT, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}") from exc
        self._written = (folder.resolve(), {n: e for n, e in opened.entries.items() if n in _BASE})
        return self

    @classmethod
    def _from_arrays(cls: type[_P], folder: Path, h: JSONDict, a: dict[str, np.ndarray],
                     sources: Mapping[str, Source] | None = None) -> _P:
        """The index of an opened folder, every shape and offset it relies on checked
        (``sources``: the mapped arrays' files, for reads that bypass the mapping)."""
        sources = sources or {}
        if h.get("format") != _FORMAT_VERSION:
            raise corrupt(folder, _WHAT, f"format {h.get('format')}, expected {_FORMAT_VERSION}")
        self = cls(h["dim"], **h["params"])
        ids, doclens = _int_array(a, "ids"), _int_array(a, "doclens")
        tail_ids, tail_doclens = _int_array(a, "tail_ids"), _int_array(a, "tail_doclens")
        if len(ids) != len(doclens) or len(tail_ids) != len(tail_doclens):
            raise corrupt(folder, _WHAT, "document tables of different lengths")
        if (doclens < 0).any() or (tail_doclens < 0).any():
            raise corrupt(folder, _WHAT, "a negative token count")
        self._ids = np.concatenate([ids, tail_ids]).astype(np.int64)
        self._doclens = np.concatenate([doclens, tail_doclens]).astype(np.int64)
        self._base_docs = len(ids)
        if len(self._ids) != h["n_docs"] or int(self._doclens.sum()) != h["n_tokens"]:
            raise corrupt(folder, _WHAT, "document tables do not match the manifest")
        base_tokens, tail_tokens = int(doclens.sum()), int(tail_doclens.sum())
        dim = self._dim
        if h["kind"] == "plaid":
            codec = ResidualCodec(_float_array(a, "centroids", 2), _float_array(a, "cutoffs", 1),
                                  _float_array(a, "weights", 1), self.nbits)
            n_buckets = 1 << self.nbits
            if codec.centroids.shape[1] != dim or codec.cutoffs.shape != (n_buckets - 1,) or \
                    codec.weights.shape != (n_buckets,) or not len(codec.centroids):
                raise corrupt(folder, _WHAT, "codec arrays of the wrong shape")
            self._codec = codec
            self._codes = Tokens(_tokens(a, "codes", base_tokens, (), folder), _tokens(a, "tail_codes", tail_tokens, (),
                                                                                       folder),
                                 sources.get("codes"))
            width = (codec.packed_dim,)
            self._residuals = Tokens(_tokens(a, "residuals", base_tokens, width, folder, np.uint8),
                                     _tokens(a, "tail_residuals", tail_tokens, width, folder, np.uint8),
                                     sources.get("residuals"))
            for part in (self._codes.base, self._codes.tail):
                if part.dtype not in (np.uint16, np.int32):
                    raise corrupt(folder, _WHAT, f"centroid ids of type {part.dtype}")
            offsets, docs = _int_array(a, "ivf_offsets"), a["ivf_docs"]
            if offsets.shape != (len(codec.centroids) + 1,) or docs.ndim != 1 or docs.dtype not in (np.int32, np.int64):
                raise corrupt(folder, _WHAT, "inverted lists of the wrong shape")
            if offsets[0] != 0 or offsets[-1] != len(docs) or (np.diff(offsets) < 0).any():
                raise corrupt(folder, _WHAT, "inverted list offsets out of order")
            self._ivf = (np.asarray(offsets), docs)
            if "ivf_docs" in sources:  # (read with pread: see PlaidSearch._list_entries)
                self._ivf_reader = (docs, Tokens(docs, source=sources["ivf_docs"]))
        elif h["kind"] == "exact":
            if "vectors" in a or base_tokens or tail_tokens:
                self._vectors = Tokens(_tokens(a, "vectors", base_tokens, (dim,), folder, np.float16),
                                       np.array(_tokens(a, "tail_vectors", tail_tokens, (dim,), folder, np.float16)))
        else:
            raise corrupt(folder, _WHAT, f"unknown kind {h['kind']!r}")
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(self._ids), dtype=bool)
        removed = _int_array(a, "removed")
        if len(removed) and (removed.min() < 0 or removed.max() >= len(self._ids)):
            raise corrupt(folder, _WHAT, "removed documents out of range")
        self._alive[removed] = False
        self._dead_tokens = int(self._doclens[removed].sum())
        self._build_error = float(h["build_error"])
        self._added_error_sum = float(h["added_error_sum"])
        self._added_tokens = int(h["added_tokens"])
        self.store_mark = h.get("store_mark") if isinstance(h.get("store_mark"), str) else None
        return self

    @classmethod
    def _load_v1(cls: type[_P], file: Path) -> _P:
        """Read the one-file format before folders (whole, into memory)."""
        try:
            # Every member read now (its size checked before, its CRC after).
            arrays = read_npz(file, what="Multi-vector index")
            manifest = json.loads(arrays.pop("manifest").tobytes())
            if manifest.get("format") != 1:
                raise corrupt(file, _WHAT, f"format {manifest.get('format')}, expected 1")
            shapes = {name: list(a.shape) for name, a in arrays.items()}
            if shapes != manifest["shapes"]:
                raise corrupt(file, _WHAT, "array shapes do not match the manifest")
            self = cls(manifest["dim"], **manifest["params"])
            self._ids = arrays["ids"].astype(np.int64)
            self._doclens = arrays["doclens"].astype(np.int64)
            if int(self._doclens.sum()) != manifest["n_tokens"] or len(self._ids) != manifest["n_docs"]:
                raise corrupt(file, _WHAT, "document table does not match the manifest")
            if manifest["kind"] == "plaid":
                self._codec = ResidualCodec(arrays["centroids"], arrays["cutoffs"], arrays["weights"], self.nbits)
                self._codes, self._residuals = Tokens(arrays["codes"]), Tokens(arrays["residuals"])
                payload = len(self._codes)
                check_ids(arrays["codes"], below=len(self._codec.centroids), what="Multi-vector index", path=file)
                check_finite(self._codec.centroids, what="Multi-vector index", path=file)
            else:
                vectors = arrays.get("vectors")
                self._vectors = None if vectors is None else Tokens(vectors)
                payload = 0 if vectors is None else len(vectors)
            if payload != manifest["n_tokens"]:
                raise corrupt(file, _WHAT, "token payload does not match the manifest")
        except IndexCorruptError:
            raise
        except FileNotFoundError as exc:
            raise corrupt(file, _WHAT, "file not found") from exc
        except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
                zipfile.BadZipFile) as exc:
            raise corrupt(file, _WHAT, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}") from exc
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(self._ids), dtype=bool)
        self._base_docs = len(self._ids)
        self._build_error = float(manifest["build_error"])
        self._added_error_sum = float(manifest["added_error_sum"])
        self._added_tokens = int(manifest["added_tokens"])
        return self

    def _params(self) -> JSONDict:
        """The constructor arguments ``index`` was made with (kept in the manifest)."""
        return {
            "nbits": self.nbits,
            "mode": self.mode,
            "exact_threshold": self.exact_threshold,
            "n_centroids": self.n_centroids,
            "max_centroids": self.max_centroids,
            "nprobe": self.nprobe,
            "ndocs": self.ndocs,
            "kmeans_niter": self.kmeans_niter,
            "rebuild_ratio": self.rebuild_ratio,
            "seed": self.seed,
        }


def _int_array(a: dict[str, np.ndarray], name: str) -> np.ndarray:
    x = a[name]
    if x.ndim != 1 or x.dtype != np.int64:
        raise ValueError(f"{name} is {x.dtype}{list(x.shape)}, expected int64 of 1 dim")
    return x


def _float_array(a: dict[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    x = a[name]
    if x.ndim != ndim or x.dtype != np.float32:
        raise ValueError(f"{name} is {x.dtype}{list(x.shape)}, expected float32 of {ndim} dims")
    return np.array(x)  # small: read whole


def _tokens(a: dict[str, np.ndarray], name: str, n: int, width: tuple[int, ...], folder: Path,
            dtype: type | None = None) -> np.ndarray:
    if name not in a and n == 0 and dtype is not None:
        return np.empty((0, *width), dtype)  # (a save before any token was added wrote none)
    x = a[name]
    if x.shape != (n, *width) or (dtype is not None and x.dtype != dtype):
        raise corrupt(folder, _WHAT, f"{name} is {x.dtype}{list(x.shape)} for {n} tokens")
    return x


def read_codec(path: str | os.PathLike) -> tuple[ResidualCodec, float] | None:
    """The codec of a PLAID index on disk and its build error, without its codes (an
    incremental run sends it to its workers); None when there is none that reads whole."""
    folder = Path(path)
    if not (folder / MANIFEST).is_file():
        return _read_codec_v1(folder / _V1_FILE if folder.is_dir() else folder)
    try:
        opened = read_folder(folder, _WHAT)
        h, a = opened.header, opened.arrays
        if h.get("format") != _FORMAT_VERSION or h.get("kind") != "plaid":
            return None
        codec = ResidualCodec(_float_array(a, "centroids", 2), _float_array(a, "cutoffs", 1),
                              _float_array(a, "weights", 1), int(h["params"]["nbits"]))
        return codec, float(h["build_error"])
    except (IndexCorruptError, KeyError, TypeError, ValueError):
        return None


def _read_codec_v1(file: Path) -> tuple[ResidualCodec, float] | None:
    try:
        npz = read_npz(file, what="Multi-vector index", names=("manifest", "centroids", "cutoffs", "weights"))
        manifest = json.loads(npz["manifest"].tobytes())
        if manifest.get("format") != 1 or manifest.get("kind") != "plaid":
            return None
        check_finite(npz["centroids"], what="Multi-vector index", path=file)
        codec = ResidualCodec(npz["centroids"], npz["cutoffs"], npz["weights"], int(manifest["params"]["nbits"]))
        return codec, float(manifest["build_error"])
    except (IndexCorruptError, OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
            zipfile.BadZipFile):
        return None

