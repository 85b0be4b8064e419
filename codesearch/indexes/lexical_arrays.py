"""The lexical index's files, read without trusting them: arrays in one container file per
segment, mapped and checked against what the manifest says they hold, and sorted string
tables searched in place.

Everything here reads with numpy alone (a memory map and views of it, or a copy read from
the file): no array is handed to code that trusts its contents. What a query relies on is
checked where it is read: every array's type, shape and place in its file when the file is
opened (the table of contents, not the data), an offsets slice's order and bounds when it
is used, row numbers against the row count. A file that fails any check raises
`IndexCorruptError`, which rebuilds the index from the store.

One file per segment rather than one per array: a segment is one open, one map and one
flush to disk (forty flushes cost 0.2 s per segment written).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.indexes.folder import Source

__all__ = ["Arrays", "StringTable", "corrupt", "write_arrays"]


def corrupt(where: str | os.PathLike, detail: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"Lexical index {str(where)!r} cannot be read ({detail}); run `codesearch index --rebuild`"
    )


#: The container of a segment's (or a state's) arrays: this magic, a little-endian uint32
#: version and table-of-contents length, the table (JSON: name -> [dtype, shape, offset]),
#: then the arrays, each at a multiple of ALIGN bytes from the end of the table's block.
MAGIC = b"CSLEXARR"
VERSION = 1
ALIGN = 64
#: A table larger than this is not a table (a segment's lists ~40 arrays in ~2 KB).
MAX_TOC = 1 << 20
_DTYPES = frozenset({"|u1", "|i1", "<u2", "<i4", "<u4", "<i8", "<f4"})


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` into the one file ``path``: to a temp name, flushed to disk, then
    renamed, so the name holds a whole file or nothing."""
    toc: dict[str, list] = {}
    offset = 0
    parts = []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<") if a.dtype.byteorder not in "|<" else a.dtype, copy=False)
        if a.dtype.str not in _DTYPES:
            raise ValueError(f"{name}: dtype {a.dtype.str} is not one the reader accepts")
        toc[name] = [a.dtype.str, list(a.shape), offset]
        parts.append((offset, a))
        offset += -(-a.nbytes // ALIGN) * ALIGN
    head = json.dumps(toc, separators=(",", ":")).encode()
    start = -(-(16 + len(head)) // ALIGN) * ALIGN
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + struct.pack("<II", VERSION, len(head)) + head)
            for at, a in parts:
                fh.seek(start + at)
                fh.write(a.data if a.nbytes else b"")
            fh.truncate(start + offset)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Arrays:
    """The arrays of one container file (`write_arrays`), checked against ``spec`` (name ->
    (dtype or dtypes, shape)) when it is opened: the header and table are read, every
    listed array's type, shape and place in the file checked, and the file mapped once.
    Arrays are views of that mapping; a file deleted after this opened it stays readable.

    `read` copies a slice from the file instead (one ``pread``): a query's postings are read
    so. Through the mapping, the kernel maps the page cache's large folios whole (up to
    2 MiB a fault on Linux 6.18, ext4; `madvise` does not change it): one posting list of
    1,640 rows read from 21 segments of a 114k-file monorepo made 36 MB of ``terms_vals``
    resident, and a cold query 230 MB of the 428 MB index."""

    def __init__(self, path: Path, spec: dict[str, tuple[str | tuple[str, ...], tuple[int, ...]]]) -> None:
        self.path = path
        self.spec = spec
        self._open: dict[str, np.ndarray] = {}
        fh = None
        try:
            # Kept open for `read` (the file mapped, even once an index run has deleted it),
            # until this object is collected, as the mapping is.
            fh = open(path, "rb", buffering=0)
            head = fh.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise ValueError("not a lexical index array file")
            version, n = struct.unpack("<II", head[8:])
            if version != VERSION or n > MAX_TOC:
                raise ValueError(f"version {version}, table of {n} bytes")
            toc = json.loads(fh.read(n))
            size = os.fstat(fh.fileno()).st_size
            # A plain array over the map (slicing a `np.memmap` makes memmap objects: a
            # Python hook per slice, ~40% of a query's reads).
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            mm = np.frombuffer(mapped, dtype=np.uint8) if mapped is not None else np.zeros(0, np.uint8)
        except (OSError, ValueError, struct.error, RecursionError) as exc:
            if fh is not None:
                fh.close()
            raise corrupt(path, f"{type(exc).__name__}: {exc}") from None
        self._source = Source(fh, 0, lambda why: corrupt(path, why))  # (closes the file when collected)
        start = -(-(16 + n) // ALIGN) * ALIGN
        if not isinstance(toc, dict):
            raise corrupt(path, "bad table of contents")
        self._places: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        for name, (dtypes, shape) in spec.items():
            entry = toc.get(name)
            allowed = (dtypes,) if isinstance(dtypes, str) else dtypes
            if (not isinstance(entry, list) or len(entry) != 3 or entry[0] not in allowed
                    or entry[1] != list(shape) or not isinstance(entry[2], int) or isinstance(entry[2], bool)):
                raise corrupt(path, f"{name}: {str(entry)[:80]}, expected {'|'.join(allowed)} {shape}")
            dtype = np.dtype(entry[0])
            at = start + entry[2]
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if entry[2] < 0 or at % dtype.itemsize or at + nbytes > size:
                raise corrupt(path, f"{name} lies outside the file")
            self._places[name] = (dtype, shape, at)
        self._mm = mm
        self._mmap = mapped

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._open.get(name)
        if a is None:
            dtype, shape, at = self._places[name]
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            a = self._open[name] = self._mm[at : at + nbytes].view(dtype).reshape(shape)
        return a

    def read(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Elements ``lo:hi`` of the 1-D array ``name``, copied from the file (see the class)."""
        dtype, shape, at = self._places[name]
        if len(shape) != 1 or not 0 <= lo <= hi <= shape[0]:
            raise corrupt(self.path, f"{name}: slice {lo}..{hi} outside {shape}")
        if hi == lo:
            return np.zeros(0, dtype)
        return self._source.read(np.empty(hi - lo, dtype), at + lo * dtype.itemsize)

    def release(self) -> None:
        """Drop the pages read so far from this process's memory (they stay in the page cache,
        and are read again if used): a writer that reads every segment whole once keeps its
        resident size to one segment's."""
        if self._mmap is not None and hasattr(self._mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):
                self._mmap.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self._open.clear()


def offsets_slice(offsets: np.ndarray, i: int, j: int, limit: int, arrays: Arrays) -> tuple[int, int]:
    """``offsets[i], offsets[j]`` checked: in order and within ``[0, limit]``."""
    lo, hi = int(offsets[i]), int(offsets[j])
    if not 0 <= lo <= hi <= limit:
        raise corrupt(arrays.path, f"offsets {lo}..{hi} out of order or past {limit}")
    return lo, hi


class StringTable:
    """``n`` byte strings: one blob, and ``n + 1`` offsets into it. Sorted tables (bytewise)
    are searched by bisection in place, touching ``log n`` entries; an entry's offsets are
    checked as they are read, so a damaged table raises instead of misreading."""

    def __init__(self, arrays: Arrays, name: str) -> None:
        self.arrays = arrays
        self.name = name
        self._blob = arrays[name]
        self._off = arrays[name + "_off"]
        self._n = len(self._off) - 1
        self._size = len(self._blob)

    def __len__(self) -> int:
        return self._n

    def get(self, i: int) -> bytes:
        off = self._off
        lo, hi = int(off[i]), int(off[i + 1])
        if not 0 <= lo <= hi <= self._size:
            raise corrupt(self.arrays.path, f"{self.name}: offsets {lo}..{hi} out of order or past {self._size}")
        return self._blob[lo:hi].tobytes()

    def find(self, key: bytes) -> int:
        """Index of ``key`` in a sorted table, or -1."""
        i = self.lower_bound(key)
        return i if i < self._n and self.get(i) == key else -1

    def lower_bound(self, key: bytes) -> int:
        """The first index whose entry is >= ``key`` (a sorted table)."""
        lo, hi = 0, self._n
        get = self.get
        while lo < hi:
            mid = (lo + hi) // 2
            if get(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def prefix_range(self, prefix: bytes) -> tuple[int, int]:
        """``(i, j)``: the entries starting with ``prefix`` are ``i .. j - 1`` (a sorted table
        keeps them together, from the first entry >= ``prefix`` on)."""
        lo = self.lower_bound(prefix)
        a, b = lo, self._n
        while a < b:
            mid = (a + b) // 2
            if self.get(mid).startswith(prefix):
                a = mid + 1
            else:
                b = mid
        return lo, a

    def all(self) -> list[bytes]:
        """Every entry, in order (the writer's merges and centrality; checked whole)."""
        off = np.asarray(self._off)
        blob = self._blob
        if len(off) and (off[0] != 0 or off[-1] != len(blob) or (np.diff(off) < 0).any()):
            raise corrupt(self.arrays.path, "offsets out of order")
        data = blob.tobytes()
        bounds = off.tolist()
        return [data[a:b] for a, b in itertools.pairwise(bounds)]


def pack_strings(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``items`` as (blob uint8, offsets int64) for a `StringTable`."""
    off = np.zeros(len(items) + 1, dtype=np.int64)
    if items:
        np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=off[1:])
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
