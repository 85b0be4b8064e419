"""A per-token array of a `PlaidIndex` in two parts: the base, mapped from disk (read-only),
and the tail of tokens added since it was written (in memory, appended to)."""

from __future__ import annotations

import numpy as np

__all__ = ["Tokens"]


class Tokens:
    """Rows ``[0, len(base))`` from ``base``, the rest from ``tail``; read by gathering
    (:meth:`take`), so a query reads the pages of the rows it asks for and nothing else."""

    def __init__(self, base: np.ndarray, tail: np.ndarray | None = None) -> None:
        self.base = base
        self.tail = base[:0].copy() if tail is None else tail

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
            return np.asarray(self.base[rows])
        if int(rows.min()) >= split:
            return self.tail[rows - split]
        out = np.empty((len(rows), *self.base.shape[1:]), dtype=self.base.dtype)
        in_base = rows < split
        out[in_base] = self.base[rows[in_base]]
        out[~in_base] = self.tail[rows[~in_base] - split]
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
