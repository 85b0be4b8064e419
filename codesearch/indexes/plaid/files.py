"""A `PlaidIndex` on disk: one ``.npz`` (numpy arrays plus a JSON manifest stored as bytes,
loaded with ``allow_pickle=False``), written to a temp name and ``os.replace``d. Zip CRCs
catch damaged bytes, the manifest's shapes catch the rest."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import TypeVar

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.indexes.plaid.codec import ResidualCodec
from codesearch.indexes.plaid.maxsim import _segment_starts
from codesearch.store import atomic_write
from codesearch.store.arrays import check_finite, check_ids, read_npz
from codesearch.types import JSONDict

__all__ = ["PlaidFiles"]

_P = TypeVar("_P", bound="PlaidFiles")

_FORMAT_VERSION = 1
_FILE_NAME = "index.npz"


def _corrupt(path: Path, why: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"Multi-vector index '{path}' cannot be read ({why}); "
        "run 'codesearch index --rebuild' to recreate it"
    )


class PlaidFiles:
    """Save and load for `PlaidIndex` (a base class of it)."""

    def save(self, path: str | os.PathLike) -> None:
        """Write the index atomically.

        ``path`` is a directory (the index goes to ``path/index.npz``) or a file name
        ending in ``.npz``.
        """
        file = _index_file(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        if self._dead_tokens:
            self._compact()
        arrays = {"ids": self._ids, "doclens": self._doclens}
        if self._codec is not None:
            arrays |= {
                "codes": self._codes,
                "residuals": self._residuals,
                "centroids": self._codec.centroids,
                "cutoffs": self._codec.cutoffs,
                "weights": self._codec.weights,
            }
        elif self._vectors is not None:
            arrays["vectors"] = self._vectors
        manifest = {
            "format": _FORMAT_VERSION,
            "kind": self.kind,
            "dim": self._dim,
            "n_docs": len(self._ids),
            "n_tokens": int(self._doclens.sum()),
            "shapes": {name: list(a.shape) for name, a in arrays.items()},
            "params": self._params(),
            "build_error": self._build_error,
            "added_error_sum": self._added_error_sum,
            "added_tokens": self._added_tokens,
        }
        arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
        with atomic_write(file) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls: type[_P], path: str | os.PathLike) -> _P:
        """Read an index written by :meth:`save` (same ``path`` convention).

        Raises
        ------
        IndexCorruptError
            When the file is missing, truncated, altered or inconsistent.
        """
        file = _index_file(path)
        try:
            # Every member read now (its size checked before, its CRC after).
            arrays = read_npz(file, what="Multi-vector index")
            manifest = json.loads(arrays.pop("manifest").tobytes())
            if manifest.get("format") != _FORMAT_VERSION:
                raise _corrupt(file, f"format {manifest.get('format')}, expected {_FORMAT_VERSION}")
            shapes = {name: list(a.shape) for name, a in arrays.items()}
            if shapes != manifest["shapes"]:
                raise _corrupt(file, "array shapes do not match the manifest")
            self = cls(manifest["dim"], **manifest["params"])
            self._ids = arrays["ids"].astype(np.int64)
            self._doclens = arrays["doclens"].astype(np.int64)
            if int(self._doclens.sum()) != manifest["n_tokens"] or len(self._ids) != manifest["n_docs"]:
                raise _corrupt(file, "document table does not match the manifest")
            if manifest["kind"] == "plaid":
                self._codec = ResidualCodec(
                    arrays["centroids"], arrays["cutoffs"], arrays["weights"], self.nbits
                )
                self._codes = arrays["codes"]
                self._residuals = arrays["residuals"]
                payload = len(self._codes)
                check_ids(self._codes, below=len(self._codec.centroids), what="Multi-vector index", path=file)
                check_finite(self._codec.centroids, what="Multi-vector index", path=file)
            else:
                self._vectors = arrays.get("vectors")
                payload = 0 if self._vectors is None else len(self._vectors)
            if payload != manifest["n_tokens"]:
                raise _corrupt(file, "token payload does not match the manifest")
        except IndexCorruptError:
            raise
        except FileNotFoundError as exc:
            raise _corrupt(file, "file not found") from exc
        except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
                zipfile.BadZipFile) as exc:
            raise _corrupt(file, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}") from exc
        self._starts = _segment_starts(self._doclens)
        self._alive = np.ones(len(self._ids), dtype=bool)
        self._pos = {int(i): p for p, i in enumerate(self._ids.tolist())}
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


def read_codec(path: str | os.PathLike) -> tuple[ResidualCodec, float] | None:
    """The codec of a PLAID index on disk and its build error, without its codes (an
    incremental run sends it to its workers); None when there is none that reads whole."""
    file = _index_file(path)
    try:
        npz = read_npz(file, what="Multi-vector index", names=("manifest", "centroids", "cutoffs", "weights"))
        manifest = json.loads(npz["manifest"].tobytes())
        if manifest.get("format") != _FORMAT_VERSION or manifest.get("kind") != "plaid":
            return None
        check_finite(npz["centroids"], what="Multi-vector index", path=file)
        codec = ResidualCodec(npz["centroids"], npz["cutoffs"], npz["weights"], int(manifest["params"]["nbits"]))
        return codec, float(manifest["build_error"])
    except (IndexCorruptError, OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
            zipfile.BadZipFile):
        return None


def _index_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path if path.suffix == ".npz" else path / _FILE_NAME
