"""Files of an index folder written so that a crash leaves the old file or the new one, and
source files read the one way every stage reads them.

Source files are read by their indexed path at index time (walk, read, refresh) and at
query time (context lines), while a user, a ``git checkout`` or someone hostile may swap
any of them: for a symlink to a file outside the repository, a FIFO (an ``open`` would
block forever), a device or a folder. `read_inside` is the one way to read them: it opens
the path component by component without following a symlink swapped in after the check,
and reads regular files only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import xxhash

__all__ = [
    "FolderReader",
    "atomic_write",
    "decode_source",
    "hash_bytes",
    "hash_text",
    "read_inside",
    "read_regular",
    "read_source",
    "read_text",
    "split_lines",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# A FIFO opened for reading blocks until a writer comes; non-blocking, the open returns at
# once and fstat says what it is. (No effect on a regular file's reads.)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a temp file beside ``path`` for binary writing; on success fsync it and
    ``os.replace`` it onto ``path``, so a reader finds the old file or the new one, never
    half of one. On an error (or a kill) the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def hash_bytes(data: bytes) -> str:
    """The content hash the store keys a file by (xxh3_128, hex)."""
    return xxhash.xxh3_128_hexdigest(data)


def hash_text(text: str) -> str:
    """The hash the vectors cache keys a chunk's text by (xxh3_128 of its UTF-8, hex)."""
    return hash_bytes(text.encode("utf-8", "surrogatepass"))


def decode_source(data: bytes) -> str:
    """A source file's bytes as text: UTF-8, each invalid byte replaced by U+FFFD, newlines
    untouched. The one decoding every stage uses, so line numbers always agree."""
    return data.decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each with its ``\\n``: the chunker's line rule, which every line
    number of an index counts by.

    Why not ``str.splitlines``: it also splits at ``\\r``, form feeds, ``\\x1c``-``\\x1e``,
    U+0085, U+2028 and U+2029, which the chunker (and git, and editors' line numbers) keep
    inside a line; a file with a form feed would then be shown lines off its hit.
    """
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _not_regular(path: object, mode: int) -> OSError:
    what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    return OSError(errno.EINVAL, f"{what}, not read", str(path))


def _read_fd(fd: int, path: object, limit: int | None) -> tuple[bytes, os.stat_result]:
    """Read an open descriptor (closed here) that must be a regular file."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        # os.read, not a file object: one read of the size fstat gives (a file object cost
        # as much again as the read itself, a file at a time over a whole repository).
        want = st.st_size + 1 if limit is None else limit  # (+1: a file that grew is read to its end)
        parts = [os.read(fd, want)]
        while limit is None and len(parts[-1]) == want:
            want = max(want, 1 << 16)
            parts.append(os.read(fd, want))
        return b"".join(parts) if len(parts) > 1 else parts[0], st
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike, *, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes (the first ``limit`` of them) and the stat of ``path``, a regular file
    that is not a symlink; its folders may be symlinks.

    Raises
    ------
    OSError
        When ``path`` is missing, unreadable, a symlink (``ELOOP``), or no regular file
        (a FIFO is never waited on).
    """
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _NOCTTY | _CLOEXEC)
    return _read_fd(fd, path, limit)


def _open_below(folder: int, parts: list[str]) -> int:
    """Open ``parts`` (a relative path) below the open folder ``folder`` (closed here), no
    component followed if it is a symlink (``ELOOP``)."""
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _NOCTTY | _CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)


def read_inside(
    root: str | os.PathLike, rel: str, *, limit: int | None = None
) -> tuple[bytes, os.stat_result]:
    """The bytes (the first ``limit`` of them) and the stat of the file ``rel`` (``/``
    separators) of the folder ``root``, read only if it is a regular file inside ``root``.

    The path is opened one component at a time below ``root``, none of them followed if
    it is a symlink: a component swapped for one fails the read instead of leaving the
    folder. A symlink that is part of the repository (the walker indexes a link whose
    target is inside the root) is then resolved, and its target opened the same way if it
    lies inside ``root``.

    Raises
    ------
    OSError
        When the file is missing or unreadable, resolves outside ``root``, changed into a
        symlink while it was opened (``ELOOP``), or is no regular file (a FIFO, a device,
        a folder; a FIFO is never waited on).
    """
    parts = rel.split("/")
    if os.open not in os.supports_dir_fd or not _NOFOLLOW:  # pragma: no cover - no openat: check, then open
        return _read_resolved(root, rel, limit)
    if "" not in parts and "." not in parts and ".." not in parts:
        try:
            return _read_fd(_open_below(os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC), parts), rel, limit)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
    return _read_resolved(root, rel, limit)


class FolderReader:
    """`read_inside` for many files of one root, read in path order (a walk, an index run):
    the folder of the last file read stays open, so a file costs one ``open`` below it, not
    one per component of its path (a file of a 114k-file repository sits 10-12 folders
    deep: 24 system calls a read, twice a file on a first index).

    The folder is opened as `read_inside` opens it, a component at a time with none followed
    if it is a symlink; a folder swapped afterwards leaves the open one what it was: the
    folder inside the root that was opened. A path `read_inside` would resolve (a symlink
    the repository holds) is read by `read_inside` itself. A context manager (closes the
    folder it holds).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = root
        self._folder: str | None = None  # relative path of the folder held open
        self._fd = -1

    def __enter__(self) -> FolderReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._folder = -1, None

    def read(self, rel: str, *, limit: int | None = None) -> tuple[bytes, os.stat_result]:
        """`read_inside` of ``rel``; same errors."""
        parts = rel.split("/")
        if "" in parts or "." in parts or ".." in parts or os.open not in os.supports_dir_fd or not _NOFOLLOW:
            return read_inside(self.root, rel, limit=limit)
        folder = "/".join(parts[:-1])
        try:
            if folder != self._folder:
                self.close()
                fd = os.open(self.root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
                for part in parts[:-1]:
                    try:
                        inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
                    finally:
                        os.close(fd)
                    fd = inner
                self._fd, self._folder = fd, folder
            fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _NOCTTY | _CLOEXEC, dir_fd=self._fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            return _read_resolved(self.root, rel, limit)  # (a symlink on the way: resolved, and read if inside)
        return _read_fd(fd, rel, limit)


def _read_resolved(root: str | os.PathLike, rel: str, limit: int | None) -> tuple[bytes, os.stat_result]:
    """`read_inside` for a path through a symlink: resolved, and read if it is inside ``root``."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, rel))
    inner = os.path.relpath(target, real_root)
    if inner == os.curdir or inner == os.pardir or inner.startswith(os.pardir + os.sep) or os.path.isabs(inner):
        raise OSError(errno.EXDEV, "outside the repository, not read", str(rel))
    if os.open not in os.supports_dir_fd or not _NOFOLLOW:  # pragma: no cover
        return read_regular(target, limit=limit)
    folder = os.open(real_root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    return _read_fd(_open_below(folder, inner.split(os.sep)), rel, limit)


def read_source(abs_path: str | os.PathLike) -> str:
    """Read a file as text: UTF-8, invalid bytes replaced by U+FFFD, newlines untouched.

    Line numbers in this text are those of the file (``\\r\\n`` stays ``\\r\\n``); byte
    offsets into ``text.encode("utf-8")`` equal the file's own offsets whenever the file is
    valid UTF-8 (each replaced byte becomes three bytes otherwise).

    Raises
    ------
    OSError
        When the file cannot be read, or is no regular file (a FIFO is never waited on).
    """
    fd = os.open(abs_path, os.O_RDONLY | _NONBLOCK | _NOCTTY | _CLOEXEC)
    return decode_source(_read_fd(fd, abs_path, None)[0])


def read_text(path: str | os.PathLike) -> str | None:
    """`read_source`, or None when the file cannot be read (gone, or no permission)."""
    try:
        return read_source(path)
    except OSError:
        return None
