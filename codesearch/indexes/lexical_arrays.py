"""The lexical index's files, read without trusting them: mapped ``.npy`` arrays checked
against what the manifest says they hold, and sorted string tables searched in place.

Everything here reads with numpy alone (``np.load(mmap_mode="r", allow_pickle=False)``):
no array is handed to code that trusts its contents. What a query relies on is checked
where it is read: an array's dtype and shape when it is opened (the header, not the data),
an offsets slice's order and bounds when it is used, row numbers against the row count.
A file that fails any check raises `IndexCorruptError`, which rebuilds the index from the
store.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError

__all__ = ["Arrays", "StringTable", "corrupt", "save_array"]


def corrupt(where: str | os.PathLike, detail: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"Lexical index {str(where)!r} cannot be read ({detail}); run `codesearch index --rebuild`"
    )


def save_array(folder: Path, name: str, array: np.ndarray) -> None:
    """Write ``array`` as ``folder/name.npy`` (little-endian, C order) and flush it to disk."""
    path = folder / f"{name}.npy"
    with open(path, "wb") as fh:
        np.save(fh, np.ascontiguousarray(array), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


class Arrays:
    """The mapped arrays of one folder, opened on first use and checked against ``spec``:
    name -> (dtype, shape); a dtype of None accepts any of the unsigned integer types."""

    def __init__(self, folder: Path, spec: dict[str, tuple[str | tuple[str, ...], tuple[int, ...]]]) -> None:
        self.folder = folder
        self.spec = spec
        self._open: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._open.get(name)
        if a is None:
            a = self._open[name] = self._load(name)
        return a

    def _load(self, name: str) -> np.ndarray:
        dtypes, shape = self.spec[name]
        path = self.folder / f"{name}.npy"
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise corrupt(path, f"{type(exc).__name__}: {exc}") from None
        allowed = (dtypes,) if isinstance(dtypes, str) else dtypes
        if not isinstance(a, np.ndarray) or a.dtype.str not in allowed:
            raise corrupt(path, f"dtype {getattr(a, 'dtype', None)}, expected {' or '.join(allowed)}")
        if a.shape != shape or not a.flags.c_contiguous:
            raise corrupt(path, f"shape {a.shape}, expected {shape}")
        return a

    def close(self) -> None:
        self._open.clear()


def offsets_slice(offsets: np.ndarray, i: int, limit: int, where: Path) -> tuple[int, int]:
    """``offsets[i], offsets[i + 1]`` checked: in order and within ``[0, limit]``."""
    lo, hi = int(offsets[i]), int(offsets[i + 1])
    if not 0 <= lo <= hi <= limit:
        raise corrupt(where, f"offsets {lo}..{hi} out of order or past {limit}")
    return lo, hi


class StringTable:
    """``n`` byte strings: one blob, and ``n + 1`` offsets into it. Sorted tables (bytewise)
    are searched by bisection in place, touching ``log n`` entries; an entry's offsets are
    checked as they are read, so a damaged table raises instead of misreading."""

    def __init__(self, arrays: Arrays, name: str) -> None:
        self.arrays = arrays
        self.name = name

    @property
    def _blob(self) -> np.ndarray:
        return self.arrays[self.name]

    @property
    def _off(self) -> np.ndarray:
        return self.arrays[self.name + "_off"]

    def __len__(self) -> int:
        return len(self._off) - 1

    def get(self, i: int) -> bytes:
        lo, hi = offsets_slice(self._off, i, len(self._blob), self.arrays.folder / self.name)
        return self._blob[lo:hi].tobytes()

    def find(self, key: bytes) -> int:
        """Index of ``key`` in a sorted table, or -1."""
        i = self.lower_bound(key)
        return i if i < len(self) and self.get(i) == key else -1

    def lower_bound(self, key: bytes) -> int:
        """The first index whose entry is >= ``key`` (a sorted table)."""
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.get(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def with_prefix(self, prefix: bytes) -> Iterator[int]:
        """Indexes of the entries starting with ``prefix`` (a sorted table), in order."""
        i = self.lower_bound(prefix)
        while i < len(self) and self.get(i).startswith(prefix):
            yield i
            i += 1

    def all(self) -> list[bytes]:
        """Every entry, in order (the writer's merges and centrality; checked whole)."""
        off = np.asarray(self._off)
        blob = self._blob
        if len(off) and (off[0] != 0 or off[-1] != len(blob) or (np.diff(off) < 0).any()):
            raise corrupt(self.arrays.folder / self.name, "offsets out of order")
        data = blob.tobytes()
        bounds = off.tolist()
        return [data[a:b] for a, b in itertools.pairwise(bounds)]


def pack_strings(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``items`` as (blob uint8, offsets int64) for a `StringTable`."""
    off = np.zeros(len(items) + 1, dtype=np.int64)
    if items:
        np.cumsum([len(s) for s in items], out=off[1:])
    blob = np.frombuffer(b"".join(items), dtype=np.uint8) if items else np.zeros(0, np.uint8)
    return blob, off


def encode(s: str) -> bytes:
    """How a string is kept in a table: UTF-8, lone surrogates (undecodable file names)
    kept as they are."""
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to: kept, bytes as they are
        return s.encode("utf-8", "surrogatepass")


def decode(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")
