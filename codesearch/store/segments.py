"""Append-only segment files holding the vectors cache's multi-vector (ColBERT) arrays.

Why not SQLite blobs: a ColBERT text is 28-77 KB of float16, and SQLite in WAL mode writes
every page twice (the WAL, then the checkpoint into the database). On a 450 MB/s disk that
held the writer at ~100 MB/s of vectors (`benchmarks/ray_overhead.py --writer`). Here each
array is written once, at the end of a segment file, and the store's row keeps only where it
is (segment number, byte offset) and its CRC-32.

The rules that keep the store the source of truth:

- Bytes are only ever appended, never overwritten, so every offset a committed row (or a
  reader's older snapshot) refers to keeps its bytes. Appends happen inside the store's
  write transaction, whose lock makes this connection the only appender.
- Before the store commits, the segment is flushed to disk (``fdatasync``), so a commit
  that survives a power loss never points at bytes that did not. A rolled-back or killed
  transaction leaves unreferenced bytes at the end: dead space, never read.
- Dead space is reclaimed by ``Store.compact_segments`` (after the store drops vectors): a
  segment that is mostly dead has its live arrays copied to a new segment, the rows are
  moved in one transaction, and the old file is unlinked after the commit.
- A reader opens every segment file before it reads rows (:meth:`Segments.open_all`): a
  file unlinked by a later compaction stays readable through the open descriptor, so a
  reader's snapshot never loses its bytes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SEGMENT_BYTES", "SegmentError", "Segments"]

#: A new segment starts once the current one holds this many bytes.
SEGMENT_BYTES = 1 << 30
#: Bytes of one array (a ColBERT text of 8192 tokens of 128 float16 is 2 MiB).
MAX_ARRAY_BYTES = 1 << 28
_SUFFIX = ".f16"


class SegmentError(Exception):
    """A segment's bytes are missing or do not match their row (the store words the error)."""


def _number(name: str) -> int | None:
    stem, _, suffix = name.partition(".")
    if "." + suffix != _SUFFIX or not stem.isdigit():
        return None
    return int(stem)


class Segments:
    """The segment files in one folder (created on the first append).

    Parameters
    ----------
    folder
        Where the segments live: ``<store file>.vectors/`` beside the store file.
    readonly
        Never create or write anything.
    max_bytes
        A new segment starts once the current one holds this many bytes (smaller for the
        user's vector cache, whose eviction reclaims space one segment at a time).
    """

    def __init__(self, folder: Path, *, readonly: bool = False, max_bytes: int = SEGMENT_BYTES):
        self.folder = folder
        self.readonly = readonly
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        # Segment number -> descriptor of the file at that number when last looked at (the
        # appender's is read-write). A descriptor of an unlinked file stays until `release`.
        self._fds: dict[int, int] = {}
        self._stale: list[int] = []  # descriptors of files replaced at their number
        self._append: int | None = None  # the segment this process appends to
        self._unsynced: set[int] = set()
        self._new_file = False

    # -- names ---------------------------------------------------------------------------

    def path(self, seg: int) -> Path:
        return self.folder / f"{seg:06d}{_SUFFIX}"

    def numbers(self) -> list[int]:
        """The segment numbers on disk, ascending."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return sorted(n for n in map(_number, names) if n is not None)

    # -- reading -------------------------------------------------------------------------

    def open_all(self, *, release: bool = False) -> None:
        """Open every segment on disk that is not open yet. Call before a read's snapshot
        begins: a segment that a later compaction unlinks then stays readable for it.

        ``release``: no read of this store is under way, so descriptors of files no longer
        on disk are closed (their space goes back to the file system).
        """
        on_disk = self.numbers()
        for seg in on_disk:
            with contextlib.suppress(OSError):
                self._current(seg)
        if release:
            with self._lock:
                gone = [seg for seg in self._fds if seg not in on_disk and seg != self._append]
                for fd in [*self._stale, *(self._fds.pop(seg) for seg in gone)]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self._stale.clear()

    def read(self, seg: int, off: int, size: int, crc: int | None) -> bytes:
        """The ``size`` bytes at ``off`` of segment ``seg``, checked against ``crc``.

        Raises
        ------
        SegmentError
            When the segment is missing or unreadable, shorter than the row says, or the
            bytes' CRC differs.
        """
        name = f"{seg:06d}{_SUFFIX}"  # (as `path` names it; a Path per read costs 0.1 ms)
        if not 0 <= size <= MAX_ARRAY_BYTES or off < 0:
            # (a damaged row's size: read, it would be allocated before one byte is)
            raise SegmentError(f"vectors segment {name}: a row asks for {size:,} bytes at {off:,}")
        try:
            fd = self._fds.get(seg)
            if fd is None:
                fd = self._current(seg)
            data = os.pread(fd, size, off)
        except FileNotFoundError:
            raise SegmentError(f"vectors segment {name} is missing") from None
        except OSError as exc:
            raise SegmentError(f"vectors segment {name} cannot be read ({exc.strerror or exc})") from None
        if len(data) != size:
            raise SegmentError(f"vectors segment {name} is truncated")
        if crc is not None and zlib.crc32(data) != crc:
            raise SegmentError(f"vectors segment {name} is damaged (checksum)")
        return data

    def _current(self, seg: int) -> int:
        """A descriptor of the file now at number ``seg`` (a descriptor kept from a file that
        was unlinked, and whose number a new file took, is set aside, not reused)."""
        st = os.stat(self.path(seg))
        with self._lock:
            fd = self._fds.get(seg)
            if fd is not None:
                held = os.fstat(fd)
                if (held.st_ino, held.st_dev) == (st.st_ino, st.st_dev):
                    return fd
                self._stale.append(self._fds.pop(seg))
                if self._append == seg:
                    self._append = None
            flags = os.O_RDONLY if self.readonly else os.O_RDWR
            fd = self._fds[seg] = os.open(self.path(seg), flags | getattr(os, "O_CLOEXEC", 0))
            return fd

    # -- writing -------------------------------------------------------------------------

    def append(self, blobs: Sequence[bytes]) -> list[tuple[int, int, int]]:
        """Write ``blobs`` at the end of the current segment; ``(seg, offset, crc)`` of each.

        Only inside the store's write transaction (its lock makes this the one appender),
        and followed by :meth:`sync` before that transaction commits.
        """
        if self.readonly:
            raise PermissionError("the store was opened read-only")
        seg = self._appender()
        fd = self._fds[seg]
        pos = off = os.fstat(fd).st_size  # past anything written before, committed or not
        out = []
        for blob in blobs:
            out.append((seg, off, zlib.crc32(blob)))
            off += len(blob)
        view = memoryview(b"".join(blobs))
        while view:
            n = os.pwrite(fd, view, pos)
            pos, view = pos + n, view[n:]
        self._unsynced.add(seg)
        return out

    def sync(self) -> None:
        """Flush what was appended since the last sync to disk (before the store commits)."""
        for seg in sorted(self._unsynced):
            fd = self._fds.get(seg)
            if fd is not None:
                os.fdatasync(fd) if hasattr(os, "fdatasync") else os.fsync(fd)
        self._unsynced.clear()
        if self._new_file:
            # The new file's directory entry (and the folder's own, when it is new too), so
            # the file itself survives a power loss.
            for folder in (self.folder, self.folder.parent):
                with contextlib.suppress(OSError):
                    dfd = os.open(folder, os.O_RDONLY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
            self._new_file = False

    def rotate(self) -> None:
        """Append to a new segment from now on (compaction's output never shares a file
        with what it compacts)."""
        self._start(self._next_number())

    def _appender(self) -> int:
        seg = self._append
        if seg is not None:
            st = os.fstat(self._fds[seg])
            # st_nlink 0: another process's compaction unlinked it since (a store kept open
            # across index runs); bytes written there would be lost.
            if st.st_nlink and st.st_size < self.max_bytes:
                return seg
        existing = self.numbers()
        if existing:
            with contextlib.suppress(FileNotFoundError):
                fd = self._current(existing[-1])  # the file on disk now, not one kept from before
                if os.fstat(fd).st_size < self.max_bytes:
                    self._append = existing[-1]
                    return self._append
        return self._start(self._next_number())

    def _next_number(self) -> int:
        """Above every segment on disk and every one this process holds open."""
        return max([*self.numbers(), *self._fds], default=0) + 1

    def _start(self, seg: int) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(seg), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        with self._lock:
            if seg in self._fds:
                self._stale.append(self._fds[seg])
            self._fds[seg] = fd
        self._append = seg
        self._new_file = True
        return seg

    # -- space ---------------------------------------------------------------------------

    def sizes(self) -> dict[int, int]:
        """Segment number -> bytes on disk."""
        out = {}
        for seg in self.numbers():
            with contextlib.suppress(OSError):
                out[seg] = self.path(seg).stat().st_size
        return out

    def remove(self, segs: Sequence[int]) -> None:
        """Unlink segments no committed row refers to. Readers that opened them keep reading;
        this store's own descriptors of them close at the next ``open_all(release=True)``."""
        for seg in segs:
            if seg == self._append:
                self._append = None
            with contextlib.suppress(OSError):
                os.unlink(self.path(seg))

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *self._stale]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            self._stale.clear()
            self._append = None
