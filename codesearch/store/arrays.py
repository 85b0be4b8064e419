"""Arrays read from disk with their size checked before anything is inflated, and the
checks every loader of a derived index runs on what it read.

Why: a ``.npy`` header is a promise (a dtype and a shape) that ``np.load`` believes. A
5 MB ``.npz`` whose member is deflated and whose header asks for 4 GiB made the first
multi-vector query allocate 4 GiB; a header whose shape is smaller than its member made
``np.load`` stop before zipfile's CRC was checked, so damaged bytes read as an array. Here
every member's header is read first and checked against what the member holds (its stored
size, its compressed size, a caller's bound) before one byte of data is allocated; the data
is then read to the member's end, so the zip CRC is always checked.

`read_npz` and `read_npy` raise `IndexCorruptError` in one line (``... is damaged (why);
run 'codesearch index --rebuild' ...``): a loader that meets it rebuilds the index from the
store (`codesearch.indexes.registry.load_derived`). `check_offsets`, `check_finite` and
`check_ids` are the checks of what the arrays say (a CSR's offsets, scores, ids into
another array), raising the same error.

Example
-------
>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
>>> np.savez(path, x=np.arange(3))
>>> read_npz(path, what="test file")["x"].tolist()
[0, 1, 2]
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Collection
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from codesearch.errors import IndexCorruptError

__all__ = ["check_finite", "check_ids", "check_offsets", "damaged", "read_npy", "read_npz"]

#: Inflated bytes a deflated member may hold per compressed byte. ``np.savez`` stores
#: members (1:1); ``np.savez_compressed`` of real index arrays stays far below this, while a
#: deflate bomb is ~1000:1.
MAX_INFLATE_RATIO = 64
#: Members of one ``.npz`` (ours hold at most a dozen).
MAX_MEMBERS = 256
#: Bytes of one ``.npy`` header (numpy's own default bound).
MAX_HEADER_BYTES = 10_000


def damaged(what: str, path: str | os.PathLike[str], why: str) -> IndexCorruptError:
    """The one-line error of a damaged index file."""
    return IndexCorruptError(
        f"{what} {str(path)!r} is damaged ({why}); run 'codesearch index --rebuild' to recreate it"
    )


def _header(fh, what: str, path: object) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, data bytes) of the ``.npy`` stream at ``fh``'s start."""
    try:
        version = npy_format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(fh, max_header_size=MAX_HEADER_BYTES)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(fh, max_header_size=MAX_HEADER_BYTES)
        else:
            raise ValueError(f"npy format version {version}")
    except Exception as exc:  # noqa: BLE001 - numpy parses a header it did not write with tokenize and ast:
        # whatever either raises on bytes of someone else's choosing, the file is damaged.
        raise damaged(what, path, f"an array header cannot be read: {_first_line(exc)}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise damaged(what, path, f"an array of dtype {dtype} (only plain numbers are read)")
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise damaged(what, path, f"an array header with shape {shape}")
    return shape, bool(fortran), dtype, math.prod(shape) * dtype.itemsize


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


def read_npz(
    path: str | os.PathLike[str], *, what: str, names: Collection[str] | None = None, max_bytes: int | None = None
) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path`` (by name, without ``.npy``), each checked
    before it is read: its header's size equals the member's, a deflated member inflates by
    at most `MAX_INFLATE_RATIO`, and all of them together hold at most ``max_bytes`` (when
    given). Object arrays (pickles) are refused; the arrays are writable.

    Parameters
    ----------
    what
        What the file is, for the error (``"Lexical index"``).
    names
        Read only these members (each must be there); None: every member.

    Raises
    ------
    IndexCorruptError
        Missing, not a zip, a member that is not what its header says, past the bounds,
        a CRC that fails, or not the members asked for.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise damaged(what, path, f"{len(infos)} members")
            found = [info.filename.removesuffix(".npy") for info in infos]
            if len(set(found)) != len(found) or not all(i.filename.endswith(".npy") for i in infos):
                raise damaged(what, path, "members that are not arrays, or repeated ones")
            if names is not None and not set(names) <= set(found):
                raise damaged(what, path, f"no member {sorted(set(names) - set(found))[0]!r}")
            total = 0
            out: dict[str, np.ndarray] = {}
            for name, info in zip(found, infos):
                if names is not None and name not in names:
                    continue
                if info.compress_type == zipfile.ZIP_STORED:
                    if info.file_size != info.compress_size or info.compress_size > size:
                        raise damaged(what, path, f"member {name!r} is larger than the file")
                elif info.file_size > MAX_INFLATE_RATIO * max(info.compress_size, 1) + 4096:
                    raise damaged(what, path, f"member {name!r} inflates {info.compress_size:,} bytes "
                                              f"to {info.file_size:,}")
                with zf.open(info) as fh:
                    shape, fortran, dtype, nbytes = _header(fh, what, path)
                    if fh.tell() + nbytes != info.file_size:
                        raise damaged(what, path, f"member {name!r} holds {info.file_size:,} bytes, its header "
                                                  f"promises {fh.tell() + nbytes:,}")
                    total += nbytes
                    if max_bytes is not None and total > max_bytes:
                        raise damaged(what, path, f"arrays of more than {max_bytes:,} bytes")
                    buf = bytearray(nbytes)
                    if fh.readinto(memoryview(buf)) != nbytes or fh.read(1):  # (to the end: zipfile checks the CRC)
                        raise damaged(what, path, f"member {name!r} is cut short")
                out[name] = np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")
            return out
    except IndexCorruptError:
        raise
    except FileNotFoundError:
        raise damaged(what, path, "file not found") from None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise damaged(what, path, _first_line(exc)) from None


def read_npy(path: str | os.PathLike[str], *, what: str, mmap: bool = False) -> np.ndarray:
    """The array of the ``.npy`` file at ``path``, checked first: the file holds exactly the
    bytes its header promises. ``mmap``: a read-only memory map, nothing read up front.

    Raises
    ------
    IndexCorruptError
        Missing, a header that cannot be read or that promises another size.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            shape, fortran, dtype, nbytes = _header(fh, what, path)
            offset = fh.tell()
            size = os.fstat(fh.fileno()).st_size
            if offset + nbytes != size:
                raise damaged(what, path, f"it holds {size:,} bytes, its header promises {offset + nbytes:,}")
            order = "F" if fortran else "C"
            if mmap:
                if nbytes == 0:
                    return np.zeros(shape, dtype=dtype, order=order)
                return np.memmap(fh, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
            buf = bytearray(nbytes)
            if fh.readinto(memoryview(buf)) != nbytes:
                raise damaged(what, path, "it is cut short")
            return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)
    except IndexCorruptError:
        raise
    except FileNotFoundError:
        raise damaged(what, path, "file not found") from None
    except (OSError, ValueError) as exc:
        raise damaged(what, path, _first_line(exc)) from None


def check_offsets(offsets: np.ndarray, *, items: int, total: int, what: str, path: object) -> None:
    """``offsets`` delimit ``items`` runs of a flat array of ``total`` values (a CSR's
    ``indptr``, a document table's starts): ``items + 1`` integers from 0 to ``total``,
    never decreasing. A damaged one made scipy read out of bounds (a segfault)."""
    a = np.asarray(offsets)
    if a.ndim != 1 or len(a) != items + 1 or not np.issubdtype(a.dtype, np.integer):
        raise damaged(what, path, f"{len(a) if a.ndim == 1 else a.shape} offsets for {items} items")
    if int(a[0]) != 0 or int(a[-1]) != total or (len(a) > 1 and bool((np.diff(a) < 0).any())):
        raise damaged(what, path, "offsets out of order or past the end")


def check_ids(ids: np.ndarray, *, below: int, what: str, path: object) -> None:
    """Every value of ``ids`` indexes an array of ``below`` items: integers in ``[0, below)``."""
    a = np.asarray(ids)
    if a.size and (not np.issubdtype(a.dtype, np.integer) or int(a.min()) < 0 or int(a.max()) >= below):
        raise damaged(what, path, f"an index out of range (0..{below - 1})")


def check_finite(values: np.ndarray, *, what: str, path: object, bound: float | None = None) -> None:
    """Every value of ``values`` is a finite float (or integer), of magnitude at most
    ``bound`` when given: a NaN made every score NaN ("No results"), 1e38 a score of 6e37."""
    a = np.asarray(values)
    if not a.size:
        return
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise damaged(what, path, f"values of dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.floating) and not bool(np.isfinite(a).all()):
        raise damaged(what, path, "values that are not finite numbers")
    if bound is not None and float(np.abs(a).max()) > bound:
        raise damaged(what, path, f"values past {bound:g}")
