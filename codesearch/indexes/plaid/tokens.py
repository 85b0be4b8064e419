"""A per-token array of a `PlaidIndex` in two parts: the base, mapped from disk (read-only),
and the tail of tokens added since it was written (in memory, appended to)."""

from __future__ import annotations

import numpy as np

from codesearch.indexes.folder import Source

__all__ = ["Tokens"]

# A base mapped from an index folder's array of at least `folder.SOURCE_MIN_BYTES` comes
# with its file (`Source`) and is read with one ``pread`` per run of rows, not through the
# mapping: the kernel maps the page cache's large folios whole, so a 600k-chunk index's
# queries made 1.3 GB of its 6 GB resident in 50 queries (0.56 GB read so). Smaller bases
# stay mapped reads (a few MB; no syscall per candidate).


class Tokens:
    """Rows ``[0, len(base))`` from ``base``, the rest from ``tail``; read by gathering
    (:meth:`take`), so a query reads the rows it asks for and nothing else."""

    def __init__(self, base: np.ndarray, tail: np.ndarray | None = None, source: Source | None = None) -> None:
        self.base = base
        self.tail = base[:0].copy() if tail is None else tail
        self._source = source if source is not None and base.flags.c_contiguous else None

    def __len__(self) -> int:
        return len(self.base) + len(self.tail)

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def nbytes(self) -> int:
        return int(self.base.nbytes + self.tail.nbytes)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows ``rows`` (int array), in that order, as an in-memory array."""
        rows = np.asarray(rows, dtype=np.int64)
        split = len(self.base)
        if not len(self.tail) or not len(rows) or int(rows.max()) < split:
            return self._from_base(rows)
        if int(rows.min()) >= split:
            return self.tail[rows - split]
        out = np.empty((len(rows), *self.base.shape[1:]), dtype=self.base.dtype)
        in_base = rows < split
        out[in_base] = self._from_base(rows[in_base])
        out[~in_base] = self.tail[rows[~in_base] - split]
        return out

    def _from_base(self, rows: np.ndarray) -> np.ndarray:
        """Base rows ``rows``: read from the file a run of consecutive rows at a time (a
        document's tokens are one run), or gathered from the mapping."""
        source = self._source
        if source is None or not len(rows) or int(rows.min()) < 0 or int(rows.max()) >= len(self.base):
            return np.asarray(self.base[rows])  # (numpy's own errors for rows out of range)
        out = np.empty((len(rows), *self.base.shape[1:]), dtype=self.base.dtype)
        row_bytes = out.itemsize * (out.size // len(rows))
        ends = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = [0, *ends.tolist()]
        for s, e in zip(starts, [*ends.tolist(), len(rows)]):
            source.read(out[s:e], int(rows[s]) * row_bytes)
        return out

    def append(self, rows: np.ndarray) -> None:
        """Add rows at the end (to the tail)."""
        self.tail = np.concatenate([self.tail, rows.astype(self.base.dtype, copy=False)])

    def whole(self) -> np.ndarray:
        """Every row as one in-memory array (a copy of the mapped part)."""
        return np.concatenate([self.base, self.tail]) if len(self.tail) else np.array(self.base)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            return self.take(np.arange(len(self))[key])
        return self.take(np.asarray(key))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self.whole()
        return whole if dtype is None else whole.astype(dtype)
