"""Files of an index folder written so that a crash leaves the old file or the new one, and
source files read the one way every stage reads them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "read_text"]


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


def read_text(path: str | os.PathLike) -> str | None:
    """The file decoded as UTF-8 (each invalid byte replaced by U+FFFD), or None when it
    cannot be read (gone, or no permission): line numbers stay exact either way."""
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None
