"""Files of an index folder written so that a crash leaves the old file or the new one, and
source files read the one way every stage reads them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "decode_source", "read_source", "read_text"]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Any]:
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


def decode_source(data: bytes) -> str:
    """A source file's bytes as text: UTF-8, each invalid byte replaced by U+FFFD, newlines
    untouched. The one decoding every stage uses, so line numbers always agree."""
    return data.decode("utf-8", errors="replace")


def read_source(abs_path: str | os.PathLike) -> str:
    """Read a file as text: UTF-8, invalid bytes replaced by U+FFFD, newlines untouched.

    Line numbers in this text are those of the file (``\\r\\n`` stays ``\\r\\n``); byte
    offsets into ``text.encode("utf-8")`` equal the file's own offsets whenever the file is
    valid UTF-8 (each replaced byte becomes three bytes otherwise).

    Raises
    ------
    OSError
        When the file cannot be read.
    """
    with open(abs_path, "rb") as fh:
        return decode_source(fh.read())


def read_text(path: str | os.PathLike) -> str | None:
    """`read_source`, or None when the file cannot be read (gone, or no permission)."""
    try:
        return read_source(path)
    except OSError:
        return None
