"""An index on disk as a folder of arrays, opened memory-mapped: what the vector indexes
(`codesearch.indexes.dense`, `codesearch.indexes.plaid`) are saved as.

``manifest.json`` names every file of the index, with its dtype, shape, size and CRC-32, and
the index's own header. Files are written first, each under a fresh name
(``codes.5f0c9a1e.npy``), then the manifest is replaced (temp name, fsync, ``os.replace``),
then the files no manifest names are removed. A reader therefore sees the old index or the
new one, never a mix, and a save rewrites only the files that changed: an index run that
edits a few files of a 600k-chunk repository rewrites the small files of its additions and
removals, not the large arrays.

Opening reads the manifest and the ``.npy`` headers only: arrays are mapped read-only
(``np.load(mmap_mode="r", allow_pickle=False)``), so a query touches just the pages it
reads. Every shape and dtype is checked against the manifest, and a file's size against
its header, so a damaged or truncated file is an `IndexCorruptError` on opening, never a
crash on a later read. Files up to `CHECKED_BYTES` are also checked against their CRC on
opening; larger ones (token codes, vectors) only when asked (``verify=True``): a flipped
bit in them changes a score, not a shape or an offset.
"""

from __future__ import annotations

import json
import os
import weakref
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.store import atomic_write
from codesearch.types import JSONDict

__all__ = ["CHECKED_BYTES", "MANIFEST", "ArrayFile", "Blob", "Folder", "Kept", "Source", "file_crc32", "pwrite_all",
           "read_folder", "write_folder"]

MANIFEST = "manifest.json"
#: Files up to this size are checked against their CRC whenever they are opened (a few ms);
#: larger ones only by ``verify=True``.
CHECKED_BYTES = 16 << 20
_BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class Kept:
    """A file of the index as it is on disk already: saved again under the same name."""

    entry: JSONDict


@dataclass(frozen=True, slots=True)
class Blob:
    """A file that is not a numpy array (a FAISS index): ``write(path)`` makes it."""

    suffix: str
    write: Callable[[Path], None]


#: An array of at least this many bytes keeps its file open as its `Source` (the mapping
#: holds a descriptor of its own: a smaller array's is closed, not to double a process's
#: open files for arrays nobody reads by descriptor).
SOURCE_MIN_BYTES = 64 << 20


class Source:
    """The file an array was mapped from, kept open (closed when this is collected): `read`
    copies rows from it with one ``pread``, for callers that must not grow the process's
    resident size by what they read (a mapped read of a file in the page cache's large
    folios makes whole folios resident). ``fail(why)`` makes the error of a read that cannot
    be done (the index's own `IndexCorruptError`)."""

    def __init__(self, fh, offset: int, fail: Callable[[str], IndexCorruptError]) -> None:
        self.fh, self.offset, self.fail = fh, offset, fail
        weakref.finalize(self, fh.close)

    def read(self, out: np.ndarray, byte_offset: int) -> np.ndarray:
        """Fill the contiguous ``out`` from ``byte_offset`` bytes into the array's data."""
        try:
            got = os.preadv(self.fh.fileno(), [out], self.offset + byte_offset)
        except (OSError, ValueError) as exc:  # (ValueError: the file closed)
            raise self.fail(str(exc)) from None
        if got != out.nbytes:
            raise self.fail("the file ends before what was asked for")
        return out


class ArrayFile:
    """An array of a known dtype and shape written into an index folder rows at a time, in
    any order (``pwrite``), for one too large to hold: `finish` makes it a `Kept` file that
    a `write_folder` names, as if it had been saved whole. Its name is a fresh one
    (``codes.5f0c9a1e.npy``), so no manifest names it before then; a file left by a build
    that stopped is removed by the folder's next save (it names no such file).

    Rows may be read back (`read`) before it is finished: what a later pass of the same
    build makes from them."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype | type, shape: tuple[int, ...]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.dtype, self.shape = np.dtype(dtype), tuple(int(n) for n in shape)
        self.path = folder / f"{name}.{os.urandom(4).hex()}.npy"
        self._row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        self._fh = open(self.path, "w+b", buffering=0)  # (closed by finish or discard)
        try:
            np.lib.format.write_array_header_1_0(
                self._fh, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                           "shape": self.shape})
            self._data = self._fh.tell()
            self._fh.truncate(self._data + self._row_bytes * self.shape[0])
        except BaseException:
            self.discard()
            raise

    def write(self, row: int, block: np.ndarray) -> None:
        """Write ``block`` (rows of this array's dtype and row shape) from row ``row`` on."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.shape[1:] or row < 0 or row + len(block) > self.shape[0]:
            raise ValueError(f"rows {row}..{row + len(block)} of shape {block.shape} do not fit {self.shape}")
        if not block.size:
            return  # (a document of no tokens: nothing to write, and no view of it to cast)
        pwrite_all(self._fh.fileno(), memoryview(block).cast("B"), self._data + row * self._row_bytes)

    def read(self, row: int, out: np.ndarray) -> np.ndarray:
        """Fill the contiguous ``out`` (rows of this array) from row ``row`` on."""
        got = os.preadv(self._fh.fileno(), [memoryview(out).cast("B")], self._data + row * self._row_bytes)
        if got != out.nbytes:
            raise OSError(f"{self.path.name}: {got} of {out.nbytes} bytes read")
        return out

    def finish(self) -> Kept:
        """The file, fsynced, with its manifest entry (its data's CRC read back once)."""
        crc, at, end = 0, self._data, self._data + self._row_bytes * self.shape[0]
        buf = bytearray(_BLOCK)
        while at < end:
            got = os.preadv(self._fh.fileno(), [memoryview(buf)[: min(_BLOCK, end - at)]], at)
            if not got:
                raise OSError(f"{self.path.name} ends at byte {at} of {end}")
            crc = zlib.crc32(memoryview(buf)[:got], crc)
            at += got
        os.fsync(self._fh.fileno())
        self._fh.close()
        return Kept({"file": self.path.name, "dtype": self.dtype.str, "shape": list(self.shape), "bytes": end,
                     "crc32": crc})

    def discard(self) -> None:
        """Close and remove the file (a build that does not finish)."""
        self._fh.close()
        self.path.unlink(missing_ok=True)


def pwrite_all(fd: int, view: memoryview, at: int) -> None:
    """``pwrite`` all of ``view`` at byte ``at`` (a write may take less than it is given)."""
    while len(view):
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


@dataclass(frozen=True, slots=True)
class Folder:
    """An opened index folder: its header, its arrays (mapped), and its other files' paths."""

    path: Path
    header: JSONDict
    arrays: dict[str, np.ndarray]
    blobs: dict[str, Path]
    entries: dict[str, JSONDict]
    sources: dict[str, Source] = field(default_factory=dict)  # the mapped arrays' files

    def kept(self, name: str) -> Kept:
        """The file ``name`` to be saved again as it is."""
        return Kept(self.entries[name])


def corrupt(path: Path, what: str, why: str) -> IndexCorruptError:
    return IndexCorruptError(f"{what} '{path}' cannot be read ({why}); run 'codesearch index --rebuild' to recreate it")


def file_crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def write_folder(
    path: str | os.PathLike, header: JSONDict, files: Mapping[str, np.ndarray | Kept | Blob]
) -> dict[str, JSONDict]:
    """Save ``files`` (arrays, files kept as they are, blobs) and ``header`` as the index at
    ``path``, atomically (see the module's notes); returns the manifest's entries. The
    header is written last, so a blob's writer may still fill it in."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    entries: dict[str, JSONDict] = {}
    for name, value in files.items():
        if isinstance(value, Kept):
            entries[name] = value.entry
            continue
        token = os.urandom(4).hex()
        if isinstance(value, Blob):
            target = folder / f"{name}.{token}.{value.suffix}"
            value.write(target)
            entries[name] = {"file": target.name, "bytes": target.stat().st_size, "crc32": file_crc32(target)}
            continue
        array = np.ascontiguousarray(value)
        target = folder / f"{name}.{token}.npy"
        with atomic_write(target) as fh:
            np.save(fh, array, allow_pickle=False)
        entries[name] = {
            "file": target.name,
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "bytes": target.stat().st_size,
            "crc32": zlib.crc32(memoryview(array).cast("B")) if array.size else 0,
        }
    manifest = {"header": header, "files": entries}
    with atomic_write(folder / MANIFEST) as fh:
        fh.write(json.dumps(manifest, sort_keys=True).encode())
    _fsync_dir(folder)
    keep = {MANIFEST, *(e["file"] for e in entries.values())}
    for child in folder.iterdir():
        # Files of earlier saves (and of the format before manifests); not another
        # writer's temp files (`atomic_write` names them with a leading dot).
        if child.name not in keep and not child.name.startswith(".") and child.is_file():
            child.unlink(missing_ok=True)
    return entries


def read_folder(path: str | os.PathLike, what: str, *, verify: bool = False) -> Folder:
    """Open the index folder at ``path`` (``what`` names it in errors).

    Raises
    ------
    IndexCorruptError
        No manifest, or a file missing, cut short, of another shape or dtype than the
        manifest says, or failing its CRC.
    """
    folder = Path(path)
    for attempt in range(3):
        try:
            return _read(folder, what, verify)
        except FileNotFoundError as exc:
            # A save replaced the manifest and removed the files of the one read: read again.
            if attempt == 2 or not (folder / MANIFEST).is_file():
                raise corrupt(folder, what, f"{Path(exc.filename or '').name or 'a file'} is missing") from exc
    raise AssertionError("unreachable")


def _read(folder: Path, what: str, verify: bool) -> Folder:
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise corrupt(folder, what, f"manifest: {type(exc).__name__}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("header"), dict):
        raise corrupt(folder, what, "manifest is not an index manifest")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise corrupt(folder, what, "manifest lists no files")
    arrays: dict[str, np.ndarray] = {}
    blobs: dict[str, Path] = {}
    sources: dict[str, Source] = {}
    for name, entry in files.items():
        try:
            file = folder / _file_name(entry)
            size = file.stat().st_size
            if size != int(entry["bytes"]):
                raise corrupt(folder, what, f"{file.name} is {size} bytes, the manifest says {entry['bytes']}")
            if "dtype" not in entry:
                if (verify or size <= CHECKED_BYTES) and file_crc32(file) != int(entry["crc32"]):
                    raise corrupt(folder, what, f"{file.name} fails its checksum")
                blobs[name] = file
                continue
            arrays[name], source = _open_array(file, entry, verify or size <= CHECKED_BYTES, what)
            if source is not None:
                sources[name] = source
        except (IndexCorruptError, FileNotFoundError):
            raise
        except (OSError, ValueError, KeyError, TypeError, SyntaxError, RecursionError, OverflowError, EOFError) as exc:
            # (numpy parses a .npy header as a Python literal: a damaged one is a SyntaxError)
            why = (str(exc).splitlines() or [""])[0][:120]
            raise corrupt(folder, what, f"{name}: {type(exc).__name__}: {why}") from exc
        except IndexError as exc:  # (a mangled entry)
            raise corrupt(folder, what, f"{name}: bad manifest entry") from exc
    return Folder(folder, manifest["header"], arrays, blobs, files, sources)


def _file_name(entry: object) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise ValueError("bad manifest entry")
    name = entry["file"]
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"bad file name {name[:40]!r}")
    return name


def _open_array(file: Path, entry: JSONDict, check_crc: bool, what: str) -> tuple[np.ndarray, Source | None]:
    """The array in ``file``, mapped from the file opened here (kept open as its `Source`),
    once its header says what the manifest does."""
    shape = tuple(int(n) for n in entry["shape"])
    dtype = np.dtype(str(entry["dtype"]))
    if dtype.hasobject:
        raise ValueError("object arrays are not index arrays")
    # Mapped when it has bytes (numpy cannot map an empty array); checked against the
    # manifest either way. The .npy header first: an array is loaded only once its header
    # says what the manifest does (a header promising more than the file holds is never
    # allocated for).
    empty = int(np.prod(shape)) == 0
    fh = open(file, "rb", buffering=0)  # kept open by the Source below, or closed
    try:
        try:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            header_shape, fortran, header_dtype = read(fh)
        except OSError:
            raise
        except Exception as exc:  # (numpy parses the header as a Python literal: any parser's error)
            raise ValueError(f"its .npy header cannot be read ({type(exc).__name__})") from exc
        if tuple(header_shape) != shape or np.dtype(header_dtype) != dtype:
            raise ValueError(
                f"holds {np.dtype(header_dtype)}{list(header_shape)}, the manifest says {dtype}{list(shape)}")
        offset = fh.tell()
        if offset + dtype.itemsize * int(np.prod(shape)) > os.fstat(fh.fileno()).st_size:
            raise ValueError("the file is shorter than its .npy header says")
        if empty:
            array = np.zeros(shape, dtype)
        else:
            array = np.memmap(fh, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    except BaseException:
        fh.close()
        raise
    if check_crc and not empty and zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B")) != int(entry["crc32"]):
        fh.close()
        raise ValueError("fails its checksum")
    if empty or fortran or array.nbytes < SOURCE_MIN_BYTES:
        fh.close()
        return array, None
    return array, Source(fh, offset, lambda why: corrupt(file.parent, what, f"{file.name}: {why}"))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
